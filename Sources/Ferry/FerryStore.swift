import FerryLog
import Foundation
import Synchronization

/// One Ferry store: the event log with both sides on it — the task queue (push) and the cache
/// ledger (pull) — so that a refresh can wait for the changes the server has not seen yet.
///
/// ```swift
/// let store = try await FerryStore.open(at: path)
/// try await store.queue.add(tag: "save-note", payload: note)
/// let age = try store.ledger.state(key: "notes", maxAge: .seconds(3600))
/// ```
public final class FerryStore: Sendable {
  /// How a store is opened.
  public struct Configuration: Sendable {
    /// The clock the store reads "now" from — the time stamped on events, and "now" for retry
    /// times, time limits and cache ages — and waits on (retry timers, time limits, max-age
    /// notices).
    ///
    /// The default, `ContinuousClock()` with no ``startDate``, is the system's: "now" is `Date()`
    /// (so a change of the system's time shows at once) and waits are real sleeps.
    ///
    /// Any other clock (or a ``startDate``) makes time elapse on that clock: "now" is the store's
    /// start date plus the time elapsed on `clock` since the store opened, and waiting until a
    /// time sleeps on `clock` until its matching instant. A test clock that a test advances by
    /// hand (FerryTesting's `ManualClock`, or any `Clock<Duration>` such as a package's test
    /// clock) thus drives every retry, time limit and cache age, and no test sleeps. Cancelling a
    /// wait's task ends it at once, whatever the clock. Time is kept in whole milliseconds: an
    /// elapsed time is rounded toward zero to the millisecond.
    ///
    /// ```swift
    /// var configuration = FerryStore.Configuration()
    /// configuration.clock = testClock                              // any Clock<Duration>
    /// configuration.startDate = Date(timeIntervalSince1970: 1_700_000_000)
    /// let store = try await FerryStore.open(at: path, configuration: configuration)
    /// ```
    public var clock: any Clock<Duration> = ContinuousClock()
    /// The wall time that ``clock``'s reading at open stands for. Nil: the clock's own date for a
    /// ``DatedClock`` (FerryTesting's `ManualClock` is one), `Date()` at open for any other clock.
    /// A store reopened on a clock that was advanced meanwhile needs this moved on too — or a
    /// ``DatedClock``, which knows its date. Taken to the millisecond; one that is no time at all
    /// (an infinite or NaN interval) is refused at open.
    public var startDate: Date?
    /// Create the store when the directory is missing or empty.
    public var createIfMissing = true
    /// The map size of a new store.
    public var initialMapSize = 1 << 20
    /// Events replayed per transaction when projections are rebuilt or caught up.
    public var rebuildChunkSize = 20_000
    /// Compact by itself past an event count (off when nil; ``FerryStore/compact(retention:)`` any time).
    public var automaticCompaction: AutomaticCompaction?

    /// The defaults.
    public init() {}
  }

  /// The event log beneath both sides.
  public let log: EventLog
  /// The push side.
  public let queue: TaskQueue
  /// The pull side.
  public let ledger: CacheLedger
  /// The automatic compaction task, when configured.
  let automaticCompaction = Mutex<Task<Void, Never>?>(nil)

  /// Every event type of a Ferry store, at its current schema version.
  static let catalog = EventCatalog(
    TaskEvent.types.map { type in
      if let upcaster = TaskEvent.upcasters[type] {
        return EventCatalog.EventType(type, version: 2, upcasters: [1: upcaster])
      }
      return EventCatalog.EventType(type, version: 1)
    } + CacheEvent.types.map { EventCatalog.EventType($0, version: 1) })

  /// Opens (or creates) the store at `path`. Runs that a crash cut short — whose owner process is
  /// gone — are logged as interrupted and are ready again (see ``TaskQueue/interruptedAtOpen``);
  /// runs of a process that is alive are never touched.
  public static func open(
    at path: String, configuration: Configuration = Configuration()
  ) async throws -> FerryStore {
    guard configuration.rebuildChunkSize >= 1 else {
      throw FerryError.invalidArgument(
        "rebuildChunkSize must be at least 1 event, not \(configuration.rebuildChunkSize)")
    }
    if let startDate = configuration.startDate, !startDate.timeIntervalSince1970.isFinite {
      throw FerryError.invalidArgument(
        "startDate must be a time, not \(startDate.timeIntervalSince1970) s since 1970")
    }
    var logConfiguration = EventLog.Configuration(
      projections: [TaskQueueProjection(), CacheAgesProjection()], catalog: catalog)
    let time = StoreTime(configuration.clock, startDate: configuration.startDate)
    logConfiguration.clock = time.now
    logConfiguration.createIfMissing = configuration.createIfMissing
    logConfiguration.initialMapSize = configuration.initialMapSize
    logConfiguration.rebuildChunkSize = configuration.rebuildChunkSize
    let log = try EventLog.open(at: path, configuration: logConfiguration)
    do {
      let (clock, sleep) = (time.now, time.sleep)
      let automatic = configuration.automaticCompaction
      let store = FerryStore(
        log: log, queue: TaskQueue(log: log, clock: clock, sleep: sleep),
        ledger: CacheLedger(log: log, clock: clock, sleep: sleep))
      // Runs whose owner is gone (a crash) are interrupted and ready again; a live owner's runs
      // (another process is in a handler right now) are left alone.
      store.queue.setInterruptedAtOpen(try await store.queue.recover(sweepingTokens: true))
      if let automatic { store.startAutomaticCompaction(automatic) }
      return store
    } catch {
      log.close()
      throw error
    }
  }

  init(log: EventLog, queue: TaskQueue, ledger: CacheLedger) {
    self.log = log
    self.queue = queue
    self.ledger = ledger
  }

  /// Waits for pending writes and closes the store (both sides).
  public func close() {
    automaticCompaction.withLock { $0?.cancel() }
    queue.close()
    ledger.close()
  }
}
