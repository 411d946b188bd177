import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @_spi(Experimental) @testable import Ferry

/// The pull side and observation with company: another process forgets, cancels, compacts and
/// grows the map while this one observes `states()` and `updates()`.
@Suite(.timeLimit(.minutes(20))) struct CrossProcessObservationTests {
  /// Collects what a stream yields, on a task of its own, so that a test can wait for a condition
  /// (and detect a hang) without holding the stream's iterator.
  final class Collected<Element: Sendable>: Sendable {
    private let items = Mutex<[Element]>([])
    private let finished = Mutex(false)
    private let task = Mutex<Task<Void, Never>?>(nil)

    init<S: AsyncSequence & Sendable>(_ stream: S) where S.Element == Element {
      let task = Task { [self] in
        do {
          for try await item in stream { items.withLock { $0.append(item) } }
        } catch {}
        finished.withLock { $0 = true }
      }
      self.task.withLock { $0 = task }
    }

    var values: [Element] { items.withLock { $0 } }
    var isFinished: Bool { finished.withLock { $0 } }
    func cancel() { task.withLock { $0?.cancel() } }
  }

  /// Polls `condition` every 5 ms until it holds; true then. No wall-clock give-up: one that never
  /// holds is ended by the suite's time limit (the hang guard), which cancels the sleep.
  static func eventually(_ condition: () -> Bool) async throws -> Bool {
    while !condition() {
      try await Task.sleep(for: .milliseconds(5))
    }
    return true
  }

  static func source() -> CacheSource<String> {
    CacheSource(fetch: { "fresh" }, save: { _ in }, load: { "saved" })
  }

  // MARK: Following other processes only while observed

  /// An app that stopped observing is not woken to read the log five times a second: the tail of
  /// other processes' changes runs while an update stream or a cache's `states()` is observed and
  /// stops when the last one ends (before, it ran from the first observer until the store closed).
  /// A new observer follows again and sees the other process's next change.
  @Test func otherProcessesAreFollowedOnlyWhileSomeoneObserves() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    defer { store.close() }
    #expect(!store.queue.followsOtherProcesses)
    #expect(!store.ledger.followsOtherProcesses)

    let first = Collected(store.queue.updates())
    let second = Collected(store.queue.updates())
    #expect(store.queue.followsOtherProcesses)
    first.cancel()
    try await Task.sleep(for: .milliseconds(50))
    #expect(store.queue.followsOtherProcesses, "one stream is still observed")
    second.cancel()
    #expect(
      try await Self.eventually { !store.queue.followsOtherProcesses }, "the tail outlived its observers")

    // Another process adds while nobody observes; a new observer sees its next add.
    let unobserved = try Child("ferry-test-worker", ["add-tasks", fixture.path, "1"])
    #expect(try await unobserved.wait() == 0)
    let again = Collected(store.queue.updates())
    defer { again.cancel() }
    #expect(store.queue.followsOtherProcesses)
    let adder = try Child("ferry-test-worker", ["add-tasks", fixture.path, "1"])
    #expect(try await adder.wait() == 0)
    let acknowledged = try await adder.waitForLine(startingWith: "ack ")
    let id = try #require(acknowledged.split(separator: " ").dropFirst().first.flatMap { TaskID($0) })
    #expect(try await Self.eventually { again.values.contains(.added(id)) }, "\(again.values)")

    // The cache side: a key's states() follows, and stops following when it ends.
    let notes = try CacheRepository(
      key: "notes", ledger: store.ledger, maxAge: .seconds(3600), source: Self.source(),
      automaticRefresh: false)
    let states = Collected(notes.states())
    #expect(store.ledger.followsOtherProcesses)
    let recorder = try Child("ferry-test-worker", ["record-fetch", fixture.path, "notes"])
    #expect(try await recorder.wait() == 0)
    let seen = try await Self.eventually {
      states.values.contains { if case .cache = $0.content { return true } else { return false } }
    }
    #expect(seen, "the observer never saw the other process's fetch: \(states.values)")
    states.cancel()
    #expect(
      try await Self.eventually { !store.ledger.followsOtherProcesses },
      "the cache's tail outlived its observer")
  }

  // MARK: Observing a closed store

  /// A repository observed after its store closed: the stream must end (before, it never did — the
  /// broadcaster that `close` finished took the new subscriber and never finished it).
  @Test func cacheStatesOfAClosedStoreEnd() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    let notes = try CacheRepository(
      key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: Self.source(), automaticRefresh: false
    )
    store.close()
    let states = Collected(notes.states())
    defer { states.cancel() }
    #expect(try await Self.eventually { states.isFinished }, "states() of a closed store never ended")
  }

  /// The queue's update streams asked for after the store closed end too.
  @Test func queueUpdatesOfAClosedStoreEnd() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    store.close()
    let updates = Collected(store.queue.updates())
    defer { updates.cancel() }
    #expect(try await Self.eventually { updates.isFinished }, "updates() of a closed store never ended")
  }

  // MARK: Another process compacts away what the observer has not read yet

  /// Another process forgets a key this process observes and compacts with a retention of zero
  /// before this process's tail reads the forget: the forget and everything of the key are
  /// removed. The observer must still learn that the key has no cache any more (before, it never
  /// did: the tail found nothing to read, and the state stayed a cache the log no longer holds).
  @Test(arguments: [false, true]) func aForgetCompactedAwayByAnotherProcessStillReachesTheObserver(
    segment: Bool
  ) async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var configuration = FerryStore.Configuration()
    configuration.writeAheadSegment = segment
    let store = try await FerryStore.open(at: fixture.path, configuration: configuration)
    defer { store.close() }
    try await store.ledger.recordFetch(key: "notes", outcome: .success(isEmpty: false))
    let notes = try CacheRepository(
      key: "notes", ledger: store.ledger, maxAge: .seconds(3600), source: Self.source(),
      automaticRefresh: false)
    let states = Collected(notes.states())
    defer { states.cancel() }
    try #require(try await Self.eventually { !states.values.isEmpty })
    guard case .cache = states.values[0].content else {
      Issue.record("the first state is not a cache: \(states.values[0])")
      return
    }
    let child = try Child(
      "ferry-test-worker", ["act-then-compact", fixture.path, "forget:notes"] + (segment ? ["segment"] : []))
    #expect(try await child.wait() == 0)
    let compacted = try await child.waitForLine(startingWith: "compacted ")
    try #require(compacted != "compacted 0", "nothing was compacted away")
    // The log holds nothing of the key any more, and the ledger agrees.
    var eventsOfKey = 0
    try store.log.forEachEvent { event in
      if CacheEvent.typeSet.contains(event.type), let decoded = try? CacheEvent(event),
        case .fetched(let key, _, _) = decoded, key == "notes"
      {
        eventsOfKey += 1
      }
    }
    #expect(eventsOfKey == 0)
    #expect(try store.ledger.state(key: "notes", maxAge: .seconds(3600)) == .noCache)
    let sawNoCache = try await Self.eventually {
      states.values.contains { if case .noCache = $0.content { return true } else { return false } }
    }
    #expect(sawNoCache, "the observer never saw the key lose its cache: \(states.values.map(\.content))")
  }

  /// Another process cancels a task this process observes (`updates(for:)`) and compacts its
  /// events away before this process's tail reads the cancel. The per-task stream must still tell
  /// that the task is no longer queued.
  @Test func aCancelCompactedAwayByAnotherProcessStillReachesTheTasksObserver() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    defer { store.close() }
    let id = try await store.queue.add(tag: "sync", payload: ["n": 1])
    let updates = Collected(try store.queue.updates(for: id))
    defer { updates.cancel() }
    try #require(try await Self.eventually { !updates.values.isEmpty })
    #expect(updates.values[0] == .current(id, .ready))
    let child = try Child("ferry-test-worker", ["act-then-compact", fixture.path, "cancel:\(id)"])
    #expect(try await child.wait() == 0)
    let compacted = try await child.waitForLine(startingWith: "compacted ")
    try #require(compacted != "compacted 0", "nothing was compacted away")
    #expect(try store.queue.task(id) == nil)
    let told = try await Self.eventually {
      updates.values.dropFirst().contains { $0 == .cancelled(id) || $0 == .current(id, nil) }
    }
    #expect(told, "the task's observer never learned it left the queue: \(updates.values)")
  }

  // MARK: Map growth by another process

  /// Another process records 120 failed fetches of 60 KiB each (the 1 MiB map doubles several
  /// times: `MDB_MAP_RESIZED` here) while this process observes one of its keys and one of its
  /// own, records fetches, reads ages, adds and runs tasks, and reads the log. Nothing fails,
  /// every acknowledged event is in the log, the observers see the other process's failure and
  /// their own refresh, and verify is healthy.
  @Test func mapGrowthByAnotherProcessWhileThisOneObservesFetchesAndRuns() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    defer { store.close() }
    let mine = try CacheRepository(
      key: "mine", ledger: store.ledger, maxAge: .seconds(3600),
      source: CacheSource(fetch: { "fresh" }, save: { _ in }, load: { "saved" }))
    let theirs = try CacheRepository(
      key: "big-60", ledger: store.ledger, maxAge: .seconds(3600), source: Self.source(),
      automaticRefresh: false)
    let mineStates = Collected(mine.states())
    let theirStates = Collected(theirs.states())
    defer {
      mineStates.cancel()
      theirStates.cancel()
    }
    let runner = TaskRunner(queue: store.queue)
    runner.register(tag: "local") { _ in .succeeded }
    let child = try Child("ferry-test-worker", ["record-large-failures", fixture.path, "120"])
    var rounds = 0
    var added: [TaskID] = []
    while child.process.isRunning || rounds == 0 {
      try await store.ledger.recordFetch(key: "local-\(rounds)", outcome: .success(isEmpty: false))
      #expect(try store.ledger.state(key: "local-\(rounds)", maxAge: .seconds(60)) != .noCache)
      added.append(try await store.queue.add(tag: "local", payload: ["n": rounds]))
      _ = try await runner.run()
      _ = try store.log.events(after: 0, limit: 50)
      rounds += 1
    }
    #expect(try await child.wait() == 0)
    #expect(child.output.last == "closed", "\(child.output.suffix(3))")
    let acked = Set(child.output.filter { $0.hasPrefix("ack ") }.map { "big-" + $0.dropFirst(4) })
    #expect(acked.count == 120)
    // From the log: every acknowledged failure and every local fetch, each once; every local task
    // succeeded once.
    var failures: [String: Int] = [:]
    var locals: [String: Int] = [:]
    var succeeded: [TaskID: Int] = [:]
    try store.log.forEachEvent { event in
      if CacheEvent.typeSet.contains(event.type),
        case .fetched(let key, _, let outcome) = try CacheEvent(event)
      {
        if case .failure = outcome { failures[key, default: 0] += 1 } else { locals[key, default: 0] += 1 }
      } else if TaskEvent.typeSet.contains(event.type), case .runSucceeded(let id, _) = try TaskEvent(event) {
        succeeded[id, default: 0] += 1
      }
    }
    #expect(Set(failures.keys) == acked && failures.values.allSatisfy { $0 == 1 })
    #expect(locals.count >= rounds && locals.values.allSatisfy { $0 == 1 })
    #expect(added.allSatisfy { succeeded[$0] == 1 })
    #expect(try store.queue.pendingTasks().isEmpty)
    // The observers: this process's refresh, a state after the other process's recorded failure.
    #expect(
      try await Self.eventually {
        mineStates.values.contains { $0.justFinishedFirstFetch } && theirStates.values.count >= 2
      }, "mine: \(mineStates.values.map(\.content)), theirs: \(theirStates.values.count)")
    #expect(try await theirs.currentState().refreshError?.message.hasPrefix("xxx") == true)
    #expect(try store.log.verify().isHealthy)
  }

  // MARK: refreshError and other processes

  /// A refresh fails here; its observer shows the error. Then another process records a success
  /// of the key: the observer's next state has the cache, and — as `currentState()` says — no
  /// error any more ("kept until a success"). Before, the observer kept the stale error.
  @Test func anotherProcesssSuccessEndsTheObserversRefreshError() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    defer { store.close() }
    struct Offline: Error {}
    let notes = try CacheRepository(
      key: "notes", ledger: store.ledger, maxAge: .seconds(3600),
      source: CacheSource(
        fetch: { () async throws -> String in throw Offline() }, save: { _ in }, load: { "saved" }),
      automaticRefresh: false)
    let states = Collected(notes.states())
    defer { states.cancel() }
    try #require(try await Self.eventually { !states.values.isEmpty })
    guard case .failed = await notes.refresh() else {
      Issue.record("the refresh did not fail")
      return
    }
    try #require(
      try await Self.eventually {
        states.values.last?.refreshError != nil && states.values.last?.isRefreshing == false
      })
    let child = try Child("ferry-test-worker", ["record-fetch", fixture.path, "notes"])
    #expect(try await child.wait() == 0)
    #expect(try await notes.currentState().refreshError == nil)
    let sawCache = try await Self.eventually {
      if case .cache = states.values.last?.content { return true } else { return false }
    }
    try #require(sawCache)
    #expect(
      states.values.last?.refreshError == nil, "the observer kept the error after another process's success")
  }

  /// Another process records a failed fetch of a key that has no cache: an observer that was
  /// already observing shows the ledger's failure as `refreshError`, as a new observer and
  /// `currentState()` do. Before, only observers started after it showed it.
  @Test func anotherProcesssFailureShowsInAnObserverAsInANewOne() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    defer { store.close() }
    try await store.ledger.recordFetch(
      key: "big-0", outcome: .success(isEmpty: false), at: Date(timeIntervalSince1970: 1_000))
    let notes = try CacheRepository(
      key: "big-0", ledger: store.ledger, maxAge: .seconds(1) * 1_000_000_000, source: Self.source(),
      automaticRefresh: false)
    let states = Collected(notes.states())
    defer { states.cancel() }
    try #require(try await Self.eventually { !states.values.isEmpty })
    #expect(states.values[0].refreshError == nil)
    let child = try Child("ferry-test-worker", ["record-large-failures", fixture.path, "1"])
    #expect(try await child.wait() == 0)
    #expect(try await notes.currentState().refreshError?.stage == .recorded)
    #expect(try await Self.eventually { states.values.count >= 2 })
    let newObserver = Collected(notes.states())
    defer { newObserver.cancel() }
    try #require(try await Self.eventually { !newObserver.values.isEmpty })
    #expect(newObserver.values[0].refreshError?.stage == .recorded)
    #expect(
      states.values.last?.refreshError?.stage == .recorded,
      "the observer's state disagrees with a new observer's")
  }

  // MARK: Another process's rebuild, stopped and killed part-way

  /// 300 keys fetched a moment ago; another process rebuilds every projection in chunks of 7 and
  /// is stopped after its first chunk (the cache ages reset, partly refolded), then SIGKILLed.
  /// Meanwhile and after, this process reads every key's age, the keys older than nothing, and
  /// refreshes keys: every key has its cache, and no refresh fetches (a read that saw the reset
  /// projection would take a fresh cache for none and fetch again).
  @Test func cacheReadsAndRefreshesDuringAnotherProcesssRebuildSeeEveryCache() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    defer { store.close() }
    let keys = (0..<300).map { "key-\($0)" }
    try await withThrowingTaskGroup(of: Void.self) { group in
      for lane in 0..<4 {
        group.addTask {
          for key in keys[(lane * 75)..<((lane + 1) * 75)] {
            try await store.ledger.recordFetch(key: key, outcome: .success(isEmpty: false))
          }
        }
      }
      try await group.waitForAll()
    }
    let fetches = Mutex(0)
    func repository(_ key: String) throws -> CacheRepository<String> {
      try CacheRepository(
        key: key, ledger: store.ledger, maxAge: .seconds(3600),
        source: CacheSource(
          fetch: {
            fetches.withLock { $0 += 1 }
            return "fresh"
          }, save: { _ in }, load: { "saved" }))
    }
    let goOn = fixture.path + ".go-on"
    defer { try? FileManager.default.removeItem(atPath: goOn) }
    let input = Pipe()
    let rebuilder = try Child(
      "ferry-test-worker", ["store-rebuild", fixture.path, "7"], stdin: input.fileHandleForReading,
      environment: [
        "FERRY_CRASH_POINT": "rebuild.chunk", "FERRY_CRASH_SIGNAL": "STOP", "FERRY_CRASH_GO_ON_FILE": goOn,
      ])
    defer { rebuilder.kill() }
    _ = try await rebuilder.waitForLine(startingWith: "open")
    say("go", to: input)
    try await pollUntil { isStopped(rebuilder.pid) || !rebuilder.process.isRunning }
    try #require(isStopped(rebuilder.pid), "the rebuild did not stop at its first chunk: \(rebuilder.output)")
    func check(_ moment: String) async throws {
      for key in keys {
        #expect(try store.ledger.state(key: key, maxAge: .seconds(3600)) != .noCache, "\(moment): \(key)")
      }
      #expect(try store.ledger.keys(olderThan: .seconds(3600)).isEmpty, "\(moment)")
      for key in keys.prefix(20) {
        #expect(await (try repository(key)).refresh() == .skipped(.notTooOld), "\(moment): \(key)")
        #expect(await (try repository(key)).refreshIfNoCache() == .successful, "\(moment): \(key)")
      }
    }
    try await check("while the rebuild is stopped")
    rebuilder.kill()
    try await pollUntil { !rebuilder.process.isRunning }
    try await check("after the rebuilder was killed")
    #expect(fetches.withLock { $0 } == 0)
    #expect(try store.log.verify().isHealthy)
  }

  /// This process waits until the queue is idle; another process runs its last task and compacts
  /// the task's events away before this process's tail reads them. The wait must still end (before,
  /// it waited for a change it could never see: a hang).
  @Test func waitUntilIdleEndsWhenAnotherProcessRunsTheLastTaskAndCompactsItAway() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    defer { store.close() }
    let id = try await store.queue.add(tag: "elsewhere", payload: ["n": 1])
    #expect(try !store.queue.isIdle())
    let idle = Collected(
      AsyncStream<Bool> { continuation in
        let task = Task {
          do {
            try await store.queue.waitUntilIdle()
            continuation.yield(true)
          } catch {
            continuation.yield(false)
          }
          continuation.finish()
        }
        continuation.onTermination = { _ in task.cancel() }
      })
    defer { idle.cancel() }
    let child = try Child("ferry-test-worker", ["act-then-compact", fixture.path, "run:elsewhere"])
    #expect(try await child.wait() == 0)
    #expect(child.output.contains("ran 1"), "\(child.output)")
    try #require(
      child.output.contains { $0.hasPrefix("compacted ") && $0 != "compacted 0" }, "\(child.output)")
    #expect(try store.queue.task(id) == nil)
    #expect(try store.queue.isIdle())
    #expect(try await Self.eventually { idle.isFinished }, "waitUntilIdle() never ended")
    #expect(idle.values == [true])
  }

  /// 200 observers of one key (and 50 streams nobody reads) while another process records a
  /// fetch of it: every observer sees the cache, and one tail serves them all.
  @Test func manyObserversAllSeeAnotherProcesssFetch() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    defer { store.close() }
    let notes = try CacheRepository(
      key: "notes", ledger: store.ledger, maxAge: .seconds(3600), source: Self.source(),
      automaticRefresh: false)
    let observers = (0..<200).map { _ in Collected(notes.states()) }
    let unread = (0..<50).map { _ in notes.states() }
    defer {
      for observer in observers { observer.cancel() }
      _ = unread
    }
    try #require(try await Self.eventually { observers.allSatisfy { !$0.values.isEmpty } })
    let child = try Child("ferry-test-worker", ["record-fetch", fixture.path, "notes"])
    #expect(try await child.wait() == 0)
    let all = try await Self.eventually {
      observers.allSatisfy {
        $0.values.contains { if case .cache = $0.content { return true } else { return false } }
      }
    }
    #expect(all, "\(observers.filter { $0.values.count < 2 }.count) observers saw nothing")
  }
}
