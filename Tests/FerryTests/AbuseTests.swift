import FerryLog
import FerryTesting
import Foundation
import Synchronization
import Testing

@_spi(Engine) @testable import Ferry

/// API abuse inside one process, as a careless or unlucky app developer causes it: odd strings,
/// extreme values, cancelled callers, close races, clocks that jump.
@Suite(.timeLimit(.minutes(20))) struct AbuseTests {
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
        tag: "t", payload: Item(name: "b"), dataId: Self.decomposed, options: [.unique(.replace)])
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
  let answer = Mutex<(done: Bool, continuation: CheckedContinuation<Result<R, any Error>?, Never>?)>(
    (false, nil))
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

/// Handlers that call back into their own runner: a request that would wait for the handler's own
/// run or pass is refused with a typed error instead of hanging forever; others still run.
@Suite(.timeLimit(.minutes(20))) struct AbuseReentryTests {
  static func isInvalidArgument(_ result: Result<PassReport, any Error>?) -> Bool {
    guard case .failure(let error) = result, case .invalidArgument = error as? FerryError else {
      return false
    }
    return true
  }

  /// What each handler's reentrant call gave (nil: it had not ended within 10 s — a hang).
  final class Seen: Sendable {
    let results = Mutex<[String: Result<PassReport, any Error>?]>([:])
    func put(_ name: String, _ result: Result<PassReport, any Error>?) {
      results.withLock { $0[name] = result }
    }
    subscript(_ name: String) -> Result<PassReport, any Error>?? { results.withLock { $0[name] } }
  }

  @Test func aHandlerRunningItsOwnTaskOrItsOwnPassIsRefusedNotHung() async throws {
    try await withStore { store, _, _ in
      let runner = TaskRunner(queue: store.queue)
      let seen = Seen()
      // Asked by the handler itself (not from a task it starts, which may go on: HandlerStartsWorkTests).
      runner.register(tag: "self") { task in
        seen.put("self", await Result(catching: { try await runner.run(.task(task.id)) }))
        return .succeeded
      }
      runner.register(tag: "pass") { _ in
        seen.put("pass", await Result(catching: { try await runner.run() }))
        return .succeeded
      }
      runner.register(tag: "group") { _ in
        seen.put("group", await Result(catching: { try await runner.run(.group("g")) }))
        return .succeeded
      }
      runner.register(tag: "window") { _ in
        let window = await Result(catching: { try await runner.run(for: .seconds(60)) })
        seen.put("window", window.map { _ in PassReport() })
        return .succeeded
      }
      var ids: [TaskID] = []
      for tag in ["self", "pass", "group", "window"] {
        ids.append(
          try await store.queue.add(tag: tag, payload: Item(name: tag), groupId: tag == "group" ? "g" : nil))
      }
      let report = try #require(try await endsWithin(60) { try await runner.run() }?.get())
      #expect(report.entries.map(\.outcome) == [.succeeded, .succeeded, .succeeded, .succeeded])
      for name in ["self", "pass", "group", "window"] {
        #expect(Self.isInvalidArgument(seen[name] ?? nil), "\(name): \(String(describing: seen[name]))")
      }
      // Each ran once, read from the log.
      for id in ids {
        #expect(
          try store.queue.history(of: id).map(\.event) == [.added, .runStarted(attempt: 1), .runSucceeded])
      }
    }
  }

  @Test func aHandlerMayStillRunAnotherTaskOrAPassFromASingleTaskRun() async throws {
    try await withStore { store, _, _ in
      let runner = TaskRunner(queue: store.queue)
      let seen = Seen()
      let manual = try await store.queue.add(tag: "other", payload: Item(name: "m"), options: [.manual])
      runner.register(tag: "other") { _ in .succeeded }
      runner.register(tag: "first") { _ in
        seen.put("other", await endsWithin(10) { try await runner.run(.task(manual)) })
        seen.put("pass", await endsWithin(10) { try await runner.run() })
        return .succeeded
      }
      let first = try await store.queue.add(tag: "first", payload: Item(name: "f"), options: [.manual])
      let later = try await store.queue.add(tag: "other", payload: Item(name: "l"))
      let report = try #require(try await endsWithin(60) { try await runner.run(.task(first)) }?.get())
      #expect(report.entries.map(\.outcome) == [.succeeded])
      #expect((try? seen["other"]??.get())?.entries.map(\.taskId) == [manual])
      #expect((try? seen["pass"]??.get())?.entries.map(\.taskId) == [later])
      #expect(try store.queue.pendingTasks().isEmpty)
    }
  }
}

extension AbuseTests {
  /// `maxConcurrentTasks = Int.max` ("as many as you like"): a pass reserves room for that many
  /// runs; with a run of another runner of the queue already under way it must not overflow.
  @Test func aRunnerWithNoLimitOnParallelRunsBesideARunUnderWayDoesNotTrap() async throws {
    try await withStore { store, _, _ in
      var configuration = TaskRunner.Configuration()
      configuration.maxConcurrentTasks = .max
      let wide = TaskRunner(queue: store.queue, configuration: configuration)
      let other = TaskRunner(queue: store.queue, configuration: configuration)
      let entered = Gate()
      let release = Gate()
      other.register(tag: "slow") { _ in
        entered.open()
        await release.wait()
        return .succeeded
      }
      wide.register(tag: "t") { _ in .succeeded }
      let slow = try await store.queue.add(tag: "slow", payload: Item(name: "s"), options: [.manual])
      let single = Task { try await other.run(.task(slow)) }
      await entered.wait()
      for i in 0..<3 { try await store.queue.add(tag: "t", payload: Item(name: "\(i)"), groupId: "g\(i)") }
      let report = try await wide.run()
      #expect(report.entries.map(\.outcome) == [.succeeded, .succeeded, .succeeded])
      release.open()
      #expect(try await single.value.entries.map(\.outcome) == [.succeeded])
    }
  }
}

/// Probes: close races and extreme values (each must end, without a trap).
@Suite(.timeLimit(.minutes(20))) struct AbuseCloseTests {
  @Test func closeDuringManyAddsLosesNothingAcknowledged() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    let acknowledged = Locked<[TaskID]>([])
    let errors = Locked<[String]>([])
    await withTaskGroup(of: Void.self) { group in
      for i in 0..<200 {
        group.addTask {
          do {
            let id = try await store.queue.add(
              tag: "t", payload: Item(name: "\(i)"), dataId: "d\(i % 7)",
              options: [.unique(i % 3 == 0 ? .replace : .append)])
            acknowledged.withLock { $0.append(id) }
          } catch {
            errors.withLock { $0.append("\(type(of: error)): \(error)") }
          }
        }
      }
      // Close while adds are in flight: after some were acknowledged, before all were.
      while acknowledged.withLock({ $0.count }) < 20 && errors.withLock({ $0.isEmpty }) { await Task.yield() }
      store.close()
    }
    store.close()
    let reopened = try await fixture.openStore()
    defer { reopened.close() }
    for id in acknowledged.withLock({ $0 }) {
      #expect(try reopened.log.event(at: id)?.type == "task.added")
    }
    print("PROBE acked", acknowledged.withLock { $0.count }, "errors", Set(errors.withLock { $0 }))
  }

  @Test func everyCallAfterCloseEndsWithAnError() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
    let runner = TaskRunner(queue: store.queue)
    runner.register(tag: "t") { _ in .succeeded }
    let backend = NotesBackend()
    let notes = try CacheRepository(
      key: "k", ledger: store.ledger, maxAge: .seconds(1), source: backend.source)
    store.close()
    store.close()
    let queue = store.queue
    var results: [String: String] = [:]
    results["add"] =
      "\(String(describing: await endsWithin(5) { try await queue.add(tag: "t", payload: Item(name: "b")) }))"
    results["cancel"] = "\(String(describing: await endsWithin(5) { try await queue.cancel(id) }))"
    results["run"] = "\(String(describing: await endsWithin(5) { try await runner.run() }))"
    results["runTask"] = "\(String(describing: await endsWithin(5) { try await runner.run(.task(id)) }))"
    results["window"] =
      "\(String(describing: await endsWithin(5) { try await runner.run(for: .seconds(1)) }))"
    results["idle"] = "\(String(describing: await endsWithin(5) { try await queue.waitUntilIdle() }))"
    results["refresh"] = "\(String(describing: await endsWithin(5) { await notes.refresh(force: true) }))"
    results["states"] =
      "\(String(describing: await endsWithin(5) { var n = 0; for await _ in notes.states() { n += 1; if n > 3 { break } }; return n }))"
    results["updates"] =
      "\(String(describing: await endsWithin(5) { var n = 0; for await _ in queue.updates() { n += 1 }; return n }))"
    results["task"] = "\(Result { try queue.task(id) })"
    for (k, v) in results.sorted(by: { $0.key < $1.key }) { print("PROBE after close", k, v.prefix(300)) }
    for (k, v) in results { #expect(!v.hasPrefix("nil"), "\(k) hung") }
  }

  @Test func extremePrioritiesDeadlinesAndABigPayloadRun() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let runner = TaskRunner(queue: store.queue)
      let sizes = Locked<[Int]>([])
      runner.register(tag: "t") { task in
        let item = try task.payload(as: Item.self)
        sizes.withLock { $0.append(item.name.utf8.count) }
        return .succeeded
      }
      let low = try await queue.add(
        tag: "t", payload: Item(name: "low"), options: [.priority(TaskPriority(rawValue: .min))])
      let high = try await queue.add(
        tag: "t", payload: Item(name: "high"),
        options: [.priority(TaskPriority(rawValue: .max)), .deadline(.distantFuture)])
      let past = try await queue.add(
        tag: "t", payload: Item(name: "past"), options: [.deadline(.distantPast)])
      let big = try await queue.add(tag: "t", payload: Item(name: String(repeating: "x", count: 12 << 20)))
      await #expect(throws: FerryError.self) {
        try await queue.add(
          tag: "t", payload: Item(name: "nan"), options: [.deadline(Date(timeIntervalSince1970: .nan))])
      }
      await #expect(throws: FerryError.self) {
        try await queue.add(
          tag: "t", payload: Item(name: "inf"), options: [.deadline(Date(timeIntervalSince1970: .infinity))])
      }
      await #expect(throws: FerryError.self) {
        try await queue.add(
          tag: "t", payload: Item(name: "-inf"), options: [.deadline(Date(timeIntervalSince1970: -.infinity))]
        )
      }
      await #expect(throws: FerryError.self) {
        try await runner.run(until: Date(timeIntervalSince1970: .nan))
      }
      await #expect(throws: FerryError.self) { try await queue.add(tag: "", payload: Item(name: "empty")) }
      await #expect(throws: FerryError.self) {
        try await queue.add(tag: String(repeating: "é", count: 101), payload: Item(name: "long"))
      }
      try await queue.add(tag: "nul\0tag", payload: Item(name: "nul"), dataId: "\0", groupId: "\0\0")
      let report = try await runner.run()
      print("PROBE extreme report", report.entries.map { "\($0.taskId) \($0.outcome)" })
      #expect(report.entries.first?.taskId == high)
      #expect(report.entries.contains { $0.taskId == past && $0.outcome == .expired })
      #expect(report.entries.contains { $0.taskId == big && $0.outcome == .succeeded })
      #expect(report.entries.contains { $0.taskId == low && $0.outcome == .succeeded })
      #expect(sizes.withLock { $0.max() } == 12 << 20)
      // Over the log's 16 MiB payload limit: a typed error, nothing appended.
      let head = try store.log.head()
      await #expect(throws: (any Error).self) {
        try await queue.add(tag: "t", payload: Item(name: String(repeating: "x", count: 17 << 20)))
      }
      #expect(try store.log.head() == head)
      try expectConsistent(queue)
    }
  }
}

/// A value behind a lock, shareable by reference.
final class Locked<Value: Sendable>: Sendable {
  private let mutex: Mutex<Value>
  init(_ value: Value) { mutex = Mutex(value) }
  func withLock<R>(_ body: (inout Value) -> R) -> R { mutex.withLock { body(&$0) } }
}

extension Result where Failure == any Error {
  /// The result of an async call, in the caller's own task.
  init(catching body: () async throws -> Success) async {
    do { self = .success(try await body()) } catch { self = .failure(error) }
  }
}
