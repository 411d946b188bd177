import CoreMetrics
import FerryLog
import Foundation
import Logging
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
    /// Compact by itself past an event count (off when nil; ``FerryStore/compact(retention:progress:)`` any time).
    public var automaticCompaction: AutomaticCompaction?
    /// Where Ferry writes log records (swift-log). Nil, the default, logs nothing at all: a library
    /// must not print unasked, and swift-log's default handler — the one in use until the app
    /// calls `LoggingSystem.bootstrap` — prints to standard output. So the app passes the logger
    /// it wants, typically `Logger(label: "ferry")` after bootstrapping (its log level filters).
    ///
    /// Records carry structured metadata (``FerryLogMetadata``: task id, tag, attempt, group,
    /// sequence, cache key) at these levels: `info` the store's open, close and compactions;
    /// `notice` runs interrupted (a crash, a stopped pass), rebuilds at open, retryable failures,
    /// recorded errors, time-limit cancellations; `warning` dead tasks and handlers left running
    /// past their time limit; `error` a store refused as damaged or missing commits, failed
    /// commits (disk full, I/O); `debug` adds, runs started and succeeded, cancels, resolves,
    /// payload updates, pause and resume, passes, cache fetches; `trace` every group commit.
    ///
    /// **Payloads are never logged.** Failure and error messages are, as handlers and the app
    /// wrote them, and so are tags, group ids and cache keys: keep personal data out of those.
    public var logger: Logger?
    /// Where Ferry's metrics go (swift-metrics). Nil, the default, uses `MetricsSystem.factory`
    /// as it is when the store opens: swift-metrics' no-op handler unless the app bootstrapped a
    /// backend before opening — and then nothing is measured at all, not even a clock read. A
    /// factory given here is used instead of the global one (a store of its own, a test's).
    ///
    /// Tags are a metric dimension: keep them a small, fixed set (the first 64 distinct tags get
    /// their own series, later ones are counted as `other`). The DocC article "Logging and metrics" lists every metric.
    public var metricsFactory: (any MetricsFactory)?
    /// Dimensions added to every metric of this store (default none). Two stores in one process
    /// that report to one backend share every series unless each has its own, e.g.
    /// `configuration.metricsDimensions = [("store", "notes")]`.
    public var metricsDimensions: [(String, String)] = []
    /// How often the queue gauges (`ferry_queue_depth`, `ferry_queue_running`, `ferry_queue_ready`,
    /// `ferry_queue_oldest_pending_age_seconds`) are read again while metrics are on: at most this
    /// often after changes, and at this interval while the store is open (the age grows by itself).
    /// They are also read at open and at the end of every pass. Each reading is O(1).
    public var gaugeInterval: Duration = .seconds(5)
    /// Acknowledge each commit after one flush of a write-ahead segment instead of LMDB's two
    /// (`EventLog.Configuration.writeAheadSegment`; `Specs/one-sync-commit.md`). On by default;
    /// `false` commits with LMDB's two flushes instead (no `ferry-segment` file beside the store).
    /// The store remembers it: only an open that finds no other process using the store turns it
    /// on or off, and an open that shares the store follows what the store does.
    public var writeAheadSegment = true
    /// How long the store's writer thread polls for the next write before it sleeps while one
    /// caller writes alone and without pause (`EventLog.Configuration.writerSpin`: never with
    /// several callers, on a one-processor machine, or while writes come further apart).
    /// `.zero` never polls; nil, the default, polls 50 µs with the write-ahead segment and not
    /// without it. Experimental (`@_spi(Experimental) import Ferry`).
    @_spi(Experimental) public var writerSpin: Duration? = nil
    /// The id a store created by this open gets (``EventLog/Configuration/storeIdAtCreation``).
    package var storeIdAtCreation: EventID?
    /// Tests and benchmarks: the segment's checkpoint limits in place of the log's defaults
    /// (``EventLog/Configuration/segmentCheckpointCommits``, …`FreedBytes`).
    package var segmentCheckpointCommits: Int?
    package var segmentCheckpointFreedBytes: Int?
    /// On iOS, tvOS, watchOS and visionOS: suspend the store (``FerryStore/suspend()``) when the
    /// app enters the background and resume it (``FerryStore/resume()``) when it returns to the
    /// foreground, following `UIApplication`'s notifications. Off by default; an app whose store
    /// sits in an app-group container turns it on, or calls the two itself (from its scene
    /// delegate, or around a background task). Ignored on other platforms.
    public var suspendsWhenBackgrounded = false

    /// The defaults.
    public init() {}
  }

  /// The event log beneath both sides: the engine, for Ferry's own tools and tests
  /// (`@_spi(Engine) import Ferry`); an app never needs it.
  @_spi(Engine) public let log: EventLog
  /// The push side.
  public let queue: TaskQueue
  /// The pull side.
  public let ledger: CacheLedger
  /// The automatic compaction task, when configured.
  let automaticCompaction = Mutex<Task<Void, Never>?>(nil)
  /// The task that reads the queue gauges now and then, while metrics are on (Observability.swift).
  let gaugeTimer = Mutex<Task<Void, Never>?>(nil)
  /// What the open asked for that a resume starts again.
  let automaticPolicy: AutomaticCompaction?
  let gaugeInterval: Duration
  /// Whether the store is suspended, and what to start again at resume (Suspension.swift).
  let suspension = Suspension()
  /// The observers of the app's lifecycle (``Configuration/suspendsWhenBackgrounded``).
  let lifecycle = Mutex<[any NSObjectProtocol]>([])
  /// Whether the app's last lifecycle move was to the background (the store follows it).
  let appWantsSuspension = Mutex(false)

  /// Every event type of a Ferry store, at its current schema version.
  static let catalog = EventCatalog(
    TaskEvent.types.map { type in
      EventCatalog.EventType(
        type, version: TaskEvent.schemaVersions[type] ?? 1, upcasters: TaskEvent.upcasters[type] ?? [:])
    } + CacheEvent.types.map { EventCatalog.EventType($0, version: 1) })

  /// Opens (or creates) the store at `path`. Runs that a crash cut short — whose owner process is
  /// gone — are logged as interrupted and are ready again (see ``TaskQueue/interruptedAtOpen``);
  /// runs of a process that is alive are never touched.
  ///
  /// - Parameters:
  ///   - path: The store's directory; a store is created in it when it is missing or empty, unless
  ///     ``Configuration/createIfMissing`` is off.
  ///   - configuration: How to open it: the clock, logging, metrics, automatic compaction.
  /// - Returns: The open store; ``close()`` it when done.
  /// - Throws: ``FerryError/invalidArgument(_:)`` for a configuration it cannot use (a
  ///   ``Configuration/rebuildChunkSize`` under 1, a ``Configuration/startDate`` that is no time);
  ///   ``FerryError/noSuchStore(path:)`` when there is no store and ``Configuration/createIfMissing`` is off;
  ///   ``FerryError/notAStore(path:reason:)``, ``FerryError/alreadyOpen(path:)``,
  ///   ``FerryError/permissionDenied(path:detail:)``, ``FerryError/newerFormat(path:message:)``,
  ///   ``FerryError/unsupportedLMDB(found:supported:)`` or ``FerryError/damaged(path:message:)`` when the
  ///   directory cannot be opened as a store of this Ferry; ``FerryError/diskFull(path:)``,
  ///   ``FerryError/quotaExceeded(path:)``, ``FerryError/ioError(path:detail:)`` or
  ///   ``FerryError/storage(_:)`` when creating it, or interrupting the runs a crash cut short, fails.
  public static func open(
    at path: String, configuration: Configuration = Configuration()
  ) async throws(FerryError) -> FerryStore {
    try await engine {
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
      logConfiguration.logger = configuration.logger
      logConfiguration.metricsFactory = configuration.metricsFactory
      logConfiguration.metricsDimensions = configuration.metricsDimensions
      logConfiguration.writeAheadSegment = configuration.writeAheadSegment
      logConfiguration.writerSpin = configuration.writerSpin
      logConfiguration.storeIdAtCreation = configuration.storeIdAtCreation
      if let commits = configuration.segmentCheckpointCommits {
        logConfiguration.segmentCheckpointCommits = commits
      }
      if let freed = configuration.segmentCheckpointFreedBytes {
        logConfiguration.segmentCheckpointFreedBytes = freed
      }
      let log = try EventLog.open(at: path, configuration: logConfiguration)
      do {
        let (clock, sleep) = (time.now, time.sleep)
        let automatic = configuration.automaticCompaction
        let store = FerryStore(
          log: log, queue: TaskQueue(log: log, clock: clock, sleep: sleep),
          ledger: CacheLedger(log: log, clock: clock, sleep: sleep), automaticCompaction: automatic,
          gaugeInterval: configuration.gaugeInterval)
        // Runs whose owner is gone (a crash) are interrupted and ready again; a live owner's runs
        // (another process is in a handler right now) are left alone.
        store.queue.setInterruptedAtOpen(try await store.queue.recover(sweepingTokens: true, inWriter: false))
        if let automatic { store.startAutomaticCompaction(automatic) }
        store.startObserving(gaugeInterval: configuration.gaugeInterval)
        if configuration.suspendsWhenBackgrounded { store.followAppLifecycle() }
        return store
      } catch {
        log.close()
        throw error
      }
    }
  }

  init(
    log: EventLog, queue: TaskQueue, ledger: CacheLedger, automaticCompaction: AutomaticCompaction? = nil,
    gaugeInterval: Duration = .seconds(5)
  ) {
    self.log = log
    self.queue = queue
    self.ledger = ledger
    self.automaticPolicy = automaticCompaction
    self.gaugeInterval = gaugeInterval
    queue.cacheInvalidated.withLock { $0 = { [weak ledger] keys in ledger?.invalidated(keys) } }
  }

  /// The store's identity: random, made with the store, never changed — kept by compaction,
  /// `ferry compact --copy` and `ferry salvage` (the same store, repaired); a store created anew
  /// has another, and so does one `ferry import` builds (a new store with the old one's events:
  /// each task's ``RunningTask/idempotencyKey``, an event id, comes along unchanged).
  ///
  /// - Throws: ``FerryError/malformedEvent(sequence:type:reason:)`` when the store has no id;
  ///   ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public var storeId: String { get throws(FerryError) { try queue.storeId } }

  /// Closes the store (both sides). Synchronous: it returns once every write already handed to
  /// the writer (an add, a run's outcome, a recorded fetch whose call is under way) is committed —
  /// blocking the calling thread meanwhile — and the store is closed. A write asked for after it
  /// began throws ``FerryError/closed``. It does not wait for handlers still running: their
  /// outcomes can no longer be logged, and the next open interrupts those runs (their tasks run
  /// again). Call it without `await`, from a `defer` too.
  public func close() {
    stopFollowingAppLifecycle()
    automaticCompaction.withLock { $0?.cancel() }
    stopObserving()
    queue.close()
    ledger.close()
  }
}
