import FerryLog
import FerryTesting
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// A connectivity input set by hand that also tells how many of its change streams are open: a
/// refresh interval waiting for the network holds one, which is how a test knows it is waiting.
final class WatchedConnectivity: Connectivity {
  let manual: ManualConnectivity
  private let open = Mutex(0)

  init(online: Bool) { manual = ManualConnectivity(online: online) }

  var isOnline: Bool { manual.isOnline }
  var openStreams: Int { open.withLock { $0 } }
  func set(online: Bool) { manual.set(online: online) }

  func changes() -> AsyncStream<Bool> {
    open.withLock { $0 += 1 }
    let upstream = manual.changes()
    let (stream, continuation) = AsyncStream<Bool>.makeStream()
    let forward = Task {
      for await online in upstream { continuation.yield(online) }
      continuation.finish()
    }
    continuation.onTermination = { [self] _ in
      forward.cancel()
      open.withLock { $0 -= 1 }
    }
    return stream
  }
}

/// A repository's refresh interval (`refreshInterval`): while observed, one refresh per interval
/// after the key's last fetch, on the store's clock. Fetches are counted from the log's
/// `cache.fetched` events; every wait is for the clock's sleepers or the log, never for wall time.
@Suite struct CacheRefreshIntervalTests {
  static let interval = Duration.seconds(60)
  /// A max age that never ends: no max-age timer sleeps on the clock, so its sleepers are the
  /// intervals' timers alone.
  static let forever = Duration.seconds(Int64.max)

  /// The fetches of `key` the log holds, in order: when each finished (Unix ms) and whether it
  /// succeeded.
  static func fetches(_ store: FerryStore, _ key: String = "notes") throws -> [(at: Int64, succeeded: Bool)] {
    var fetches: [(at: Int64, succeeded: Bool)] = []
    try store.log.forEachEvent { event in
      guard event.type == "cache.fetched",
        case .fetched(let fetched, let at, let outcome) = try CacheEvent(event),
        fetched == key
      else { return }
      if case .success = outcome { fetches.append((at, true)) } else { fetches.append((at, false)) }
    }
    return fetches
  }

  /// The refreshes of `key` the gate held back, as the log records them.
  static func skips(_ store: FerryStore, _ key: String = "notes") throws -> Int {
    var count = 0
    try store.log.forEachEvent { event in
      if event.type == "cache.refreshSkipped", case .refreshSkipped(key, _) = try CacheEvent(event) {
        count += 1
      }
    }
    return count
  }

  /// Yields (never sleeps) until `condition` holds; false if it still does not after a great
  /// many turns (a hang detector counted in turns, not time).
  static func settle(_ condition: () throws -> Bool) async rethrows -> Bool {
    for _ in 0..<2_000_000 {
      if try condition() { return true }
      await Task.yield()
    }
    return try condition()
  }

  /// Waits until exactly `count` timers sleep on the clock: every interval timer has checked
  /// (and run) what was due and sleeps until its next interval.
  static func waitForTimers(_ clock: ManualClock, _ count: Int) async throws {
    try #require(
      await settle { clock.sleeperCount == count }, "\(clock.sleeperCount) timers sleep, not \(count)")
  }

  /// An observer of `repository` on a task of its own; cancel the task to stop observing.
  static func observe<Value: Sendable>(_ repository: CacheRepository<Value>) -> Task<Void, Never> {
    Task { for await _ in repository.states() {} }
  }

  /// A real source: the server's answer is a list of notes, the app's cache a variable; it counts
  /// its own calls (only to compare with the log) and fails while `failing` is set.
  final class Server: Sendable {
    let calls = Mutex(0)
    let failing = Mutex(false)
    let saved = Mutex<[String]?>(nil)

    var source: CacheSource<[String]> {
      CacheSource(
        fetch: { [self] in
          let call = calls.withLock { c -> Int in
            c += 1
            return c
          }
          struct Unreachable: Error {}
          if failing.withLock({ $0 }) { throw Unreachable() }
          return ["note \(call)"]
        },
        save: { [self] value in saved.withLock { $0 = value } },
        load: { [self] in saved.withLock { $0 } })
    }
  }

  @Test func itRefreshesAtEachIntervalAfterTheLastFetch() async throws {
    try await withStore { store, clock, fixture in
      let server = Server()
      try await store.ledger.makeFresh("notes")
      let start = fixture.time
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: Self.forever, source: server.source,
        refreshInterval: Self.interval)
      #expect(notes.refreshInterval == Self.interval)
      let observer = Self.observe(notes)
      defer { observer.cancel() }
      try await Self.waitForTimers(clock, 1)
      for tick in 1...3 {
        // A millisecond short of the interval: the timer still sleeps, nothing is fetched.
        clock.advance(by: Self.interval - .milliseconds(1))
        #expect(clock.sleeperCount == 1)
        clock.advance(by: .milliseconds(1))
        try await Self.waitForTimers(clock, 1)
        let fetches = try Self.fetches(store).dropFirst()  // the first is makeFresh's
        #expect(fetches.map(\.at) == (1...tick).map { start + Int64($0) * 60_000 })
        #expect(!fetches.contains { !$0.succeeded })
      }
      // The cache was never too old: the interval fetched regardless, and saved what it got.
      #expect(server.saved.withLock { $0 } == ["note 3"])
      #expect(server.calls.withLock { $0 } == 3)

      // A fetch in between (here a forced refresh) starts the interval again.
      clock.advance(by: .seconds(30))
      #expect(await notes.refresh(force: true) == .successful)
      let forcedAt = fixture.time
      try await Self.waitForTimers(clock, 1)
      clock.advance(by: .seconds(30))  // 60 s after the last interval fetch, 30 s after the forced one
      try await Self.waitForTimers(clock, 1)
      #expect(try Self.fetches(store).count == 5)
      clock.advance(by: .seconds(30))
      try await Self.waitForTimers(clock, 1)
      #expect(try Self.fetches(store).map(\.at).suffix(2) == [forcedAt, forcedAt + 60_000])
    }
  }

  @Test func observersAndRepositoriesOfOneKeyShareOneFetchPerInterval() async throws {
    try await withStore { store, clock, fixture in
      let server = Server()
      try await store.ledger.makeFresh("notes")
      let start = fixture.time
      let first = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: Self.forever, source: server.source,
        refreshInterval: Self.interval)
      // A second repository of the key, with an interval a second longer: its timers wake a
      // second after each fetch of the first, and find the key's last fetch too recent.
      let second = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: Self.forever, source: server.source,
        automaticRefresh: false, refreshInterval: Self.interval + .seconds(1))
      let observers = [Self.observe(first), Self.observe(first), Self.observe(second), Self.observe(second)]
      defer { for observer in observers { observer.cancel() } }
      try await Self.waitForTimers(clock, 4)
      for tick in 1...5 {
        clock.advance(by: Self.interval - .seconds(1))
        try await Self.waitForTimers(clock, 4)
        clock.advance(by: .seconds(1))  // both observers of the first wake at the same instant
        try await Self.waitForTimers(clock, 4)
        #expect(try Self.fetches(store).count == 1 + tick)
      }
      // Every fetch on the first's interval; none on the second's.
      #expect(try Self.fetches(store).map(\.at) == (0...5).map { start + Int64($0) * 60_000 })
      #expect(server.calls.withLock { $0 } == 5)
      #expect(try store.ledger.record("notes")?.fetchCount == 6)
    }
  }

  @Test func itStopsWhenObservingStops() async throws {
    try await withStore { store, clock, fixture in
      let server = Server()
      try await store.ledger.makeFresh("notes")
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: Self.forever, source: server.source,
        refreshInterval: Self.interval)
      let staying = Self.observe(notes)
      defer { staying.cancel() }
      let leaving = Self.observe(notes)
      try await Self.waitForTimers(clock, 2)
      clock.advance(by: Self.interval)
      try await Self.waitForTimers(clock, 2)
      #expect(try Self.fetches(store).count == 2)

      // One observer leaves: the other still refreshes, once per interval.
      leaving.cancel()
      await leaving.value
      try await Self.waitForTimers(clock, 1)
      clock.advance(by: Self.interval)
      try await Self.waitForTimers(clock, 1)
      #expect(try Self.fetches(store).count == 3)

      // The last one leaves: nothing waits on the clock any more, so no interval can fetch.
      staying.cancel()
      await staying.value
      try await Self.waitForTimers(clock, 0)
      for _ in 0..<10 { clock.advance(by: Self.interval) }
      #expect(clock.sleeperCount == 0)
      #expect(store.ledger.inFlight.withLock { $0.isEmpty })
      #expect(try Self.fetches(store).count == 3)
      #expect(server.calls.withLock { $0 } == 2)
    }
  }

  @Test func aFailingFetchIsTriedAgainOnlyAtTheNextInterval() async throws {
    try await withStore { store, clock, fixture in
      let server = Server()
      server.failing.withLock { $0 = true }
      try await store.ledger.makeFresh("notes")
      let start = fixture.time
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: Self.forever, source: server.source,
        refreshInterval: Self.interval)
      let observer = Self.observe(notes)
      defer { observer.cancel() }
      try await Self.waitForTimers(clock, 1)
      for tick in 1...3 {
        clock.advance(by: Self.interval - .milliseconds(1))
        #expect(clock.sleeperCount == 1)  // a failure is a fetch: the next waits a whole interval
        clock.advance(by: .milliseconds(1))
        try await Self.waitForTimers(clock, 1)
        let failures = try Self.fetches(store).filter { !$0.succeeded }
        #expect(failures.map(\.at) == (1...tick).map { start + Int64($0) * 60_000 })
      }
      server.failing.withLock { $0 = false }
      clock.advance(by: Self.interval)
      try await Self.waitForTimers(clock, 1)
      #expect(try Self.fetches(store).last?.succeeded == true)
      #expect(try Self.fetches(store).count == 5)
      #expect(server.calls.withLock { $0 } == 4)
    }
  }

  @Test func aRefreshTheGateHoldsBackWaitsForTheNextInterval() async throws {
    try await withStore { store, clock, fixture in
      let serverUp = Mutex(false)
      var configuration = TaskRunner.Configuration()
      configuration.collections = ["notes-changes": ["save-note"]]
      let runner = TaskRunner(queue: store.queue, configuration: configuration)
      runner.register(tag: "save-note") { _ in serverUp.withLock { $0 } ? .succeeded : .failed("offline") }
      let server = Server()
      try await store.ledger.makeFresh("notes")
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: Self.forever, source: server.source,
        refreshInterval: Self.interval,
        requires: try PendingTasksGate(runner: runner, collection: "notes-changes"))
      try await store.queue.add(tag: "save-note", payload: ["text": "buy eggs"])
      let observer = Self.observe(notes)
      defer { observer.cancel() }
      try await Self.waitForTimers(clock, 1)
      for tick in 1...3 {
        clock.advance(by: Self.interval)
        try await Self.waitForTimers(clock, 1)
        // Held back once per interval (the save failed again), never fetched, never again at once.
        #expect(try Self.skips(store) == tick)
        #expect(try Self.fetches(store).count == 1)
      }
      serverUp.withLock { $0 = true }
      clock.advance(by: Self.interval)
      try await Self.waitForTimers(clock, 1)
      #expect(try Self.skips(store) == 3)
      #expect(try Self.fetches(store).count == 2)
      #expect(try store.queue.pendingTasks().isEmpty)
      #expect(server.calls.withLock { $0 } == 1)
    }
  }

  @Test func offlineItWaitsForTheNetworkInsteadOfFetching() async throws {
    try await withStore { store, clock, fixture in
      let server = Server()
      let network = WatchedConnectivity(online: true)
      try await store.ledger.makeFresh("notes")
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: Self.forever, source: server.source,
        refreshInterval: Self.interval, connectivity: network)
      let observer = Self.observe(notes)
      defer { observer.cancel() }
      try await Self.waitForTimers(clock, 1)
      network.set(online: false)
      clock.advance(by: Self.interval)
      // Due, but offline: it waits for the network, not on the clock, and fetches nothing.
      try #require(await Self.settle { network.openStreams == 1 })
      #expect(clock.sleeperCount == 0)
      for _ in 0..<5 { clock.advance(by: Self.interval) }
      #expect(try Self.fetches(store).count == 1)
      network.set(online: true)  // back: one refresh at once (it was due), then one per interval
      try await Self.waitForTimers(clock, 1)
      #expect(try Self.fetches(store).map(\.at).last == fixture.time)
      #expect(try Self.fetches(store).count == 2)
      #expect(network.openStreams == 0)
      #expect(server.calls.withLock { $0 } == 1)
    }
  }

  @Test func anotherProcesssFetchStartsTheIntervalAgain() async throws {
    try await withStore { store, clock, fixture in
      let server = Server()
      try await store.ledger.makeFresh("notes")
      let start = fixture.time
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: Self.forever, source: server.source,
        refreshInterval: Self.interval)
      let observer = Self.observe(notes)
      defer { observer.cancel() }
      try await Self.waitForTimers(clock, 1)
      clock.advance(by: .seconds(30))
      // Another process (an app extension, say) fetches the key half-way through the interval.
      let child = try Child("ferry-test-worker", ["record-fetch", fixture.path, "notes", "\(fixture.time)"])
      #expect(try await child.wait() == 0)
      clock.advance(by: .seconds(30))  // the timer wakes at the old interval's end: not due
      try await Self.waitForTimers(clock, 1)
      #expect(try Self.fetches(store).map(\.at) == [start, start + 30_000])
      #expect(server.calls.withLock { $0 } == 0)
      clock.advance(by: .seconds(30))  // an interval after the other process's fetch
      try await Self.waitForTimers(clock, 1)
      #expect(try Self.fetches(store).map(\.at) == [start, start + 30_000, start + 90_000])
      #expect(server.calls.withLock { $0 } == 1)
    }
  }

  @Test func intervalsUnderAMillisecondAreRefused() async throws {
    try await withStore { store, clock, fixture in
      let source = Server().source
      for interval in [Duration.zero, .microseconds(999), .seconds(-1)] {
        #expect(throws: FerryError.self) {
          try CacheRepository(
            key: "notes", ledger: store.ledger, maxAge: .seconds(1), source: source, refreshInterval: interval
          )
        }
      }
      let shortest = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(1), source: source,
        refreshInterval: .milliseconds(1))
      #expect(shortest.refreshInterval == .milliseconds(1))
    }
  }
}
