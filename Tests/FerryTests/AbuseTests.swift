import FerryLog
import FerryTesting
import Foundation
import Synchronization
import Testing

@testable import Ferry

/// API abuse inside one process, as a careless or unlucky app developer causes it: odd strings,
/// extreme values, cancelled callers, close races, clocks that jump.
@Suite(.timeLimit(.minutes(2))) struct AbuseTests {
  /// "café" composed (U+00E9) and decomposed (e + U+0301): equal as Swift `String`s, different
  /// UTF-8 bytes — and the store keys everything by its bytes.
  static let composed = "caf\u{E9}"
  static let decomposed = "cafe\u{301}"

  @Test func theTwoSpellingsAreEqualStringsWithDifferentBytes() {
    #expect(Self.composed == Self.decomposed)
    #expect(Array(Self.composed.utf8) != Array(Self.decomposed.utf8))
  }

  // MARK: Cache keys equal after normalization

  /// Two keys the ledger keeps apart (by their bytes) must not share a refresh: the second
  /// repository's caller would be told `successful` while its own key never had a fetch.
  @Test func cacheKeysEqualOnlyAfterNormalizationAreRefreshedEachByItsOwnRepository() async throws {
    try await withStore { store, _, _ in
      let first = NotesBackend(blocks: true)
      let second = NotesBackend()
      let a = try CacheRepository(
        key: Self.composed, ledger: store.ledger, maxAge: .seconds(60), source: first.source,
        automaticRefresh: false)
      let b = try CacheRepository(
        key: Self.decomposed, ledger: store.ledger, maxAge: .seconds(60), source: second.source,
        automaticRefresh: false)
      let refreshA = Task { await a.refresh() }
      while first.fetches == 0 { await Task.yield() }
      let refreshB = Task { await b.refresh() }
      // b's own refresh finishes while a's is still held (without its own fetch it would wait for a's).
      let resultB = try await endsWithin(20) { await refreshB.value }?.get()
      first.release.open()
      #expect(await refreshA.value == .successful)
      #expect(resultB == .successful)
      #expect(second.fetches == 1)
      #expect(try store.ledger.state(key: Self.decomposed, maxAge: .seconds(60)) != .noCache)
      #expect(try store.ledger.state(key: Self.composed, maxAge: .seconds(60)) != .noCache)
    }
  }

  // MARK: Data ids equal after normalization

  /// The queue replaces by (tag, dataId) bytes, so a replace with the other spelling leaves the
  /// first task queued; its history must not end it as replaced (and so hide its run).
  @Test func aReplaceWithAnotherSpellingOfTheDataIdDoesNotEndTheFirstTasksHistory() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let first = try await queue.add(tag: "t", payload: Item(name: "a"), dataId: Self.composed)
      let second = try await queue.add(
        tag: "t", payload: Item(name: "b"), dataId: Self.decomposed, unique: .replace)
      #expect(try queue.task(first) != nil)  // the queue kept it: the bytes differ
      let runner = TaskRunner(queue: queue)
      runner.register(tag: "t") { _ in .succeeded }
      let report = try await runner.run()
      #expect(Set(report.entries.map(\.taskId)) == [first, second])
      let history = try queue.history(of: first).map(\.event)
      #expect(!history.contains(.replaced(by: second)))
      #expect(history.last == .runSucceeded)
    }
  }
}

/// Runs `body`, or gives up after `seconds` (only to detect a hang): nil when it did not end. The
/// body runs in a task of its own, so a body that never ends is left behind, not awaited.
func endsWithin<R: Sendable>(
  _ seconds: Int, _ body: @escaping @Sendable () async throws -> R
) async -> Result<R, any Error>? {
  let answer = Mutex<(done: Bool, continuation: CheckedContinuation<Result<R, any Error>?, Never>?)>((false, nil))
  let finish: @Sendable (Result<R, any Error>?) -> Void = { result in
    let continuation = answer.withLock { state -> CheckedContinuation<Result<R, any Error>?, Never>? in
      if state.done { return nil }
      state.done = true
      return state.continuation
    }
    continuation?.resume(returning: result)
  }
  return await withCheckedContinuation { continuation in
    answer.withLock { $0.continuation = continuation }
    Task {
      do { finish(.success(try await body())) } catch { finish(.failure(error)) }
    }
    Task {
      try? await Task.sleep(for: .seconds(seconds))
      finish(nil)
    }
  }
}

extension AbuseTests {
  /// Groups and tags are told apart by their bytes in the queue (each spelling of "café" is a
  /// group of its own, with its own head); the reads that filter or gather by them must agree.
  @Test func groupsAndTagsSpelledTwoWaysAreTwoInEveryRead() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let one = try await queue.add(tag: Self.composed, payload: Item(name: "a"), groupId: Self.composed)
      let two = try await queue.add(tag: Self.decomposed, payload: Item(name: "b"), groupId: Self.decomposed)
      #expect(try queue.head(of: Self.composed) == one)
      #expect(try queue.head(of: Self.decomposed) == two)
      #expect(try queue.pendingTasks(groupId: Self.composed).map(\.id) == [one])
      #expect(try queue.pendingTasks(groupId: Self.decomposed).map(\.id) == [two])
      #expect(try queue.pendingTasks(tag: Self.decomposed).map(\.id) == [two])
      let groups = try store.log.read { view in try FerryStore.snapshot(of: view) }.groups
      #expect(groups.map(\.tasks) == [[one], [two]])
    }
  }
}
