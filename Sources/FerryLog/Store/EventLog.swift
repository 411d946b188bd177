import LMDB
import Synchronization

/// An append-only, durable log of events in an LMDB environment, with projections kept in the
/// same transaction as every append.
///
/// ```swift
/// let log = try EventLog.open(at: "/path/to/store", configuration: .init(projections: [CountByType()]))
/// let sequence = try await log.append(NewEvent(type: "item.added", payload: bytes))
/// let count = try log.read { view in try view.tables(of: "countByType").get("counts", key: key) }
/// ```
///
/// `append` returns only once its events are committed and flushed to disk. Appends from many
/// callers at once share one transaction and one flush (group commit).
public final class EventLog: Sendable {
  /// The store format this code writes and the newest it opens.
  /// The store format this code writes: 2 since records carry their sequence (record format 2).
  /// A read-write open of a format 1 store raises it to 2 before writing any format 2 record, so
  /// that an older Ferry refuses the store (`newerFormat`) instead of failing on its new records.
  public static let storeFormatVersion: UInt32 = 2
  /// The store format of a store with a write-ahead segment (``Configuration/writeAheadSegment``):
  /// 3, so that code which does not replay the segment — older Ferry — refuses the store instead
  /// of writing commits a recovery would roll back. Back to ``storeFormatVersion`` when the segment
  /// is turned off.
  public static let segmentFormatVersion: UInt32 = 3
  /// The newest store format this code opens.
  public static let newestReadableFormat: UInt32 = 3
  /// The type of the marker `ferry salvage` writes where a damaged store's event could not be
  /// recovered: one per lost sequence number, empty payload, schema version 1. It keeps the log
  /// gap-free and says, in the log itself, what was lost; projections ignore it.
  public static let lostEventType = "ferry.lost"

  /// The store's directory.
  public let path: String
  /// The configuration it was opened with.
  public let configuration: Configuration
  /// Projections that a read-only open found missing, of another version, or behind the log,
  /// with the reason. Always empty for a read-write log, which rebuilds or catches them up at open.
  public var staleProjections: [String: String] { session.stale }
  /// Whether this open created the store.
  public let wasCreated: Bool
  /// Events replayed into projections at open (catching up or rebuilding after a version change).
  public let eventsReplayedAtOpen: Int

  /// What one open (or resume) of the store holds: everything ``suspend()`` lets go of.
  final class Session: Sendable {
    let environment: Environment
    let core: StoreCore
    let writer: GroupCommitWriter?
    let segment: SegmentSession?
    let openLock: StoreOpenLock?
    let headMark: HeadMark?
    let stale: [String: String]
    /// The private copy read in place of a store that needed recovery (removed at the end).
    let recoveredCopy: RecoveredCopy?

    init(
      environment: Environment, core: StoreCore, writer: GroupCommitWriter?, segment: SegmentSession?,
      openLock: StoreOpenLock?, headMark: HeadMark?, stale: [String: String],
      recoveredCopy: RecoveredCopy? = nil
    ) {
      self.recoveredCopy = recoveredCopy
      self.headMark = headMark
      self.environment = environment
      self.core = core
      self.writer = writer
      self.segment = segment
      self.openLock = openLock
      self.stale = stale
    }
  }

  /// Whether the log is open, suspended (``suspend()``) or closed, and the session it uses: the
  /// last one, closed, while suspended or closed.
  struct Life {
    var session: Session
    var isClosed = false
    var isSuspended = false
  }

  let life: Mutex<Life>
  /// Serialises ``suspend()``, ``resume()`` and ``close()``.
  let transitions = Mutex(())

  /// The current session (one consistent set of environment, core and writer).
  var session: Session { life.withLock { $0.session } }
  var environment: Environment { session.environment }
  var core: StoreCore { session.core }
  var writer: GroupCommitWriter? { session.writer }
  /// This process's use of the store's write-ahead segment, when the store has one.
  var segment: SegmentSession? { session.segment }
  /// The shared lock every open holds on `ferry-open.lock` (nil when none could be taken).
  var openLock: StoreOpenLock? { session.openLock }
  let notifier = HeadNotifier()
  /// The sequence ranges this open appended (merged when adjacent), so that a tail can tell them
  /// from other processes' appends.
  let ownRanges = OwnRanges()
  /// Reads whose body ran in the writer's transaction (``read(_:)``, ReadInWriterTransaction.swift).
  let readsInWriter = Atomic<Int>(0)
  /// The log's logger and metrics (``Configuration/logger``, ``Configuration/metricsFactory``).
  package let instruments: LogInstruments

  init(_ opened: Opened, path: String, configuration: Configuration) {
    self.path = path
    self.configuration = configuration
    self.wasCreated = opened.created
    self.eventsReplayedAtOpen = opened.replayed
    let instruments = LogInstruments(
      logger: configuration.logger, metricsFactory: configuration.metricsFactory,
      dimensions: configuration.metricsDimensions)
    self.instruments = instruments
    instruments.opened(
      path: path, created: opened.created, replayed: opened.replayed, readOnly: configuration.readOnly)
    life = Mutex(
      Life(
        session: Self.startSession(
          opened, configuration: configuration, notifier: notifier, ownRanges: ownRanges,
          instruments: instruments)))
  }

  deinit {
    close()
  }
}
