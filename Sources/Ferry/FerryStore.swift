import FerryLog
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
    /// The wall clock in Unix milliseconds: stamped on events, and "now" for eligibility and ages.
    public var clock: @Sendable () -> Int64 = wallClockMilliseconds
    /// Create the store when the directory is missing or empty.
    public var createIfMissing = true
    /// The map size of a new store.
    public var initialMapSize = 1 << 20
    /// Events replayed per transaction when projections are rebuilt or caught up.
    public var rebuildChunkSize = 20_000
    /// Compact by itself past an event count (off when nil; ``FerryStore/compact(retention:)`` any time).
    public var automaticCompaction: AutomaticCompaction?
    /// Waits until `clock` reads at least the given time (Unix milliseconds). Nil sleeps for the
    /// difference in real time; a test clock supplies one that waits for the test to advance it.
    public var sleep: (@Sendable (Int64) async -> Void)?

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
    var logConfiguration = EventLog.Configuration(
      projections: [TaskQueueProjection(), CacheAgesProjection()], catalog: catalog)
    logConfiguration.clock = configuration.clock
    logConfiguration.createIfMissing = configuration.createIfMissing
    logConfiguration.initialMapSize = configuration.initialMapSize
    logConfiguration.rebuildChunkSize = configuration.rebuildChunkSize
    let log = try EventLog.open(at: path, configuration: logConfiguration)
    do {
      let clock = configuration.clock
      let automatic = configuration.automaticCompaction
      let sleep =
        configuration.sleep ?? { @Sendable (until: Int64) in
          while !Task.isCancelled {
            let delay = until &- clock()
            if delay <= 0 { return }
            try? await Task.sleep(for: .milliseconds(delay))
          }
        }
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
