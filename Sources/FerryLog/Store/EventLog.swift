import CFerryLMDB
import CoreMetrics
import Foundation
import LMDB
import Logging
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

  /// How a log is opened.
  public struct Configuration: Sendable {
    /// The projections to keep materialized.
    public var projections: [any Projection]
    /// The accepted event types and their upcasters; nil accepts any valid type name and upcasts nothing.
    public var catalog: EventCatalog?
    /// Open read-only: nothing is written, projections are not caught up (see ``EventLog/staleProjections``).
    public var readOnly: Bool = false
    /// Create the store when the directory is missing or empty.
    public var createIfMissing: Bool = true
    /// The map size of a new store; it doubles whenever it fills.
    public var initialMapSize: Int = 1 << 20
    /// The map never grows past this.
    public var maxMapSize: Int = 1 << 40
    /// Keep the event-id index, so that an event appended again with the same id is stored once.
    /// Off by default: the index costs every commit one more B-tree and every rebuild about a
    /// tenth of its work. Turning it on for an existing store builds it from the log at open.
    public var idempotentAppends: Bool = false
    /// The largest payload accepted, in bytes.
    public var maxPayloadSize: Int = 16 << 20
    /// The most events one group commit writes.
    public var maxEventsPerCommit: Int = 8192
    /// Events replayed per transaction by a rebuild.
    public var rebuildChunkSize: Int = 20_000
    /// How long the writer thread polls for the next append before it sleeps while one caller
    /// appends alone, in small steps and without pause — a loop of adds, a serial runner finishing
    /// one task and claiming the next: the last eight commits each served one append of at most
    /// two events, and the last came within four times this after the queue emptied. Waking a
    /// sleeping thread costs tens of microseconds on many machines (more in virtual machines),
    /// which such a caller pays on every commit. The writer never polls with more to gather —
    /// several callers, a runner whose lanes share each command — (it sleeps, so that the work
    /// gathers into one commit), on a one-processor machine, or when appends come further apart
    /// (an idle store's writer sleeps); at most 10 ms. `.zero` never polls.
    ///
    /// nil, the default: 50 µs in a store with a write-ahead segment, where a commit's one flush
    /// is short enough for the wake-up to show (a serial run loop 10 % faster in the benchmark),
    /// and no polling without it, where the benchmark measured no gain. `Statistics.writerSpins`
    /// counts the polls.
    public var writerSpin: Duration? = nil
    /// The wall clock, in Unix milliseconds, stamped on new events.
    public var clock: @Sendable () -> Int64 = wallClockMilliseconds
    /// Open a damaged store anyway, read-only only, to read what is left (salvage, inspection):
    /// skips the data file's meta-page checks and the lost-commit check that otherwise refuse it
    /// with ``FerryLogError/damagedStore(path:reason:)`` or ``FerryLogError/lostCommits(path:acknowledged:found:)``.
    /// Reads may still fail, or crash the process inside LMDB: read such a store from a child process.
    public var allowDamage: Bool = false
    /// Where the log writes its log records (swift-log): nil, the default, logs nothing. A
    /// library must not print unasked — swift-log's default handler, used before the app calls
    /// `LoggingSystem.bootstrap`, prints to standard output — so the app hands Ferry a logger:
    /// `Logger(label: "ferry")` after bootstrapping. Records carry sequences, counts and paths,
    /// never an event's payload. Per-commit lines are at `trace`; a store refused as damaged and a
    /// failed commit (disk full, I/O) at `error`.
    public var logger: Logger?
    /// Where the log's metrics go (swift-metrics): nil, the default, uses `MetricsSystem.factory`
    /// as it is at open — the no-op handler unless the app bootstrapped a backend, and then
    /// nothing is measured at all. A factory given here is used instead (one per store, say, or
    /// a test's). The DocC article "Logging and metrics" lists the metrics.
    public var metricsFactory: (any MetricsFactory)?
    /// Dimensions added to every metric of this store, e.g. `[("store", "notes")]`: two stores in
    /// one process reporting to one backend keep their series apart only with different ones.
    public var metricsDimensions: [(String, String)] = []
    /// Acknowledge each group commit after one flush of a write-ahead segment instead of LMDB's
    /// two (data pages, then meta page): `Specs/one-sync-commit.md`. Off by default; experimental.
    ///
    /// The store remembers it: a store with a segment is format 3, which Ferry before this option
    /// refuses to open. It is turned on or off only by an open that finds no other process using
    /// the store; an open that shares the store follows what the store does, whatever this says.
    /// A store's segment is recovered (its frames replayed) by the next read-write open that is
    /// alone after a crash or power cut; a read-only open that is alone then fails with
    /// ``FerryLogError/needsRecovery(path:)``.
    public var writeAheadSegment: Bool = false
    /// With the segment on: checkpoint (flush LMDB, start a new segment cycle) after this many
    /// group commits since the last checkpoint. Until a checkpoint LMDB reuses no page freed since
    /// the previous one, so the data file grows by about this many commits' pages.
    public var segmentCheckpointCommits: Int = 256
    /// With the segment on: checkpoint after this many bytes of frames since the last checkpoint.
    public var segmentCheckpointBytes: Int = 4 << 20
    /// The id a store created by this open gets (a new one when nil): `ferry salvage` gives the
    /// store it rebuilds the damaged store's id, so the store stays the same store.
    package var storeIdAtCreation: EventID?
    /// Tests only: the LMDB version the open checks in place of the linked one.
    package var lmdbVersionInPlaceOfLinked: LMDBVersion?

    /// A configuration with the given projections and catalog, and defaults for everything else.
    public init(projections: [any Projection] = [], catalog: EventCatalog? = nil) {
      self.projections = projections
      self.catalog = catalog
    }
  }

  /// Counters since open, for tests and benchmarks.
  public struct Statistics: Sendable, Equatable {
    /// Write transactions that committed appends (group commits).
    public var commits: Int = 0
    /// `append` calls that completed.
    public var appendCalls: Int = 0
    /// Events written (duplicates excluded).
    public var eventsAppended: Int = 0
    /// Events not written because their id was already in the log.
    public var duplicatesSkipped: Int = 0
    /// The most `append` calls that shared one commit.
    public var largestBatch: Int = 0
    /// Times the writer polled for its next job before sleeping (``Configuration/writerSpin``).
    public var writerSpins: Int = 0
    /// Of those, the times a job came while it polled (the writer did not sleep).
    public var writerSpinsCaught: Int = 0
  }

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

    init(
      environment: Environment, core: StoreCore, writer: GroupCommitWriter?, segment: SegmentSession?,
      openLock: StoreOpenLock?, headMark: HeadMark?, stale: [String: String]
    ) {
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

  private let life: Mutex<Life>
  /// Serialises ``suspend()``, ``resume()`` and ``close()``.
  private let transitions = Mutex(())

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
  /// Reads whose body ran in the writer's transaction (``read(_:)``, ReadInWriter.swift).
  let readsInWriter = Atomic<Int>(0)
  /// The log's logger and metrics (``Configuration/logger``, ``Configuration/metricsFactory``).
  package let instruments: LogInstruments

  // MARK: Opening

  /// Opens the store at `path`, creating it when it is missing (or an empty directory) unless the
  /// configuration says otherwise.
  ///
  /// At open, a projection whose version changed is emptied and rebuilt from the log, and one that
  /// is behind (an interrupted rebuild, another process's appends) is caught up, before this returns.
  ///
  /// Throws ``FerryLogError/noSuchStore(path:)``, ``FerryLogError/notAStore(path:reason:)``,
  /// ``FerryLogError/newerFormat(path:found:supported:)``, ``FerryLogError/permissionDenied(path:detail:)``,
  /// ``FerryLogError/unsupportedLMDB(found:supported:)``.
  public static func open(at path: String, configuration: Configuration = Configuration()) throws -> EventLog
  {
    EventLog(try openParts(at: path, configuration: configuration), path: path, configuration: configuration)
  }

  /// Everything an open sets up, before the writer starts (an open's, or a resume's).
  private static func openParts(at path: String, configuration: Configuration) throws -> Opened {
    do {
      return try openReporting(at: path, configuration: configuration)
    } catch let error as FerryLogError {
      LogInstruments.refused(error, path: path, logger: configuration.logger)
      throw error
    }
  }

  /// What an open found and holds, before the writer starts.
  struct Opened {
    let environment: Environment
    let core: StoreCore
    let stale: [String: String]
    let created: Bool
    let replayed: Int
    let headMark: HeadMark?
    let segment: SegmentSession?
    let openLock: StoreOpenLock?
    let head: UInt64
  }

  private static func openReporting(at path: String, configuration: Configuration) throws -> Opened {
    do {
      do {
        return try openStore(at: path, configuration: configuration)
      } catch let error as LMDBError {
        throw translateOpenError(error, path: path)
      }
    } catch let error as FerryLogError {
      // A directory whose head mark names a store that LMDB no longer reads as one (its main
      // database's record damaged: other database names, a missing `events`) is a damaged store.
      guard !configuration.allowDamage, case .mark(let mark) = HeadMark.read(in: path), !mark.isCreating
      else {
        throw error
      }
      switch error {
      case .notAStore(_, let reason):
        throw FerryLogError.damagedStore(
          path: path,
          reason:
            "it held a store with events up to sequence \(mark.head), but LMDB now reads it as no store: \(reason)"
        )
      case .storage(let lmdb)
      where lmdb.code == MDB_NOTFOUND || lmdb.code == MDB_INCOMPATIBLE || lmdb.code == MDB_BAD_DBI:
        throw FerryLogError.damagedStore(
          path: path,
          reason:
            "it held a store with events up to sequence \(mark.head), but LMDB cannot open its databases: \(lmdb.message)"
        )
      default: throw error
      }
    }
  }

  /// Refuses an LMDB whose page layout Ferry's own reads of the data file (damage checks, the
  /// write-ahead segment, salvage's raw scan) were not written for.
  package static func requireSupportedLMDB(_ lmdb: LMDBVersion = .linked) throws(FerryLogError) {
    guard lmdb.isSupported else {
      throw FerryLogError.unsupportedLMDB(found: lmdb.description, supported: LMDBVersion.supportedRange)
    }
  }

  private static func openStore(at path: String, configuration: Configuration) throws -> Opened {
    // Before anything reads the store's files (the segment's checkpoint, LMDB's meta pages): those
    // reads know LMDB 0.9's page layout only.
    try requireSupportedLMDB(configuration.lmdbVersionInPlaceOfLinked ?? .linked)
    var projections = configuration.projections
    if configuration.idempotentAppends { projections.append(EventIDIndex()) }
    try validate(projections: projections, userProjections: configuration.projections)
    guard (0...EventRecord.maxPayloadSize).contains(configuration.maxPayloadSize) else {
      throw FerryLogError.invalidConfiguration(
        reason:
          "maxPayloadSize must be between 0 and \(EventRecord.maxPayloadSize) bytes (the record format's limit)"
      )
    }

    if configuration.allowDamage && !configuration.readOnly {
      throw FerryLogError.invalidConfiguration(reason: "a damaged store may only be opened read-only")
    }
    let place = try checkDirectory(path, configuration: configuration)
    // Who else has the store open decides whether this open may restore a checkpoint and replay
    // the write-ahead segment (Specs/one-sync-commit.md §4): taken before LMDB reads the file.
    var openLock: StoreOpenLock? = nil
    var isDirectory: ObjCBool = false
    if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue {
      openLock = try StoreOpenLock.acquire(directory: path, readOnly: configuration.readOnly)
    }
    let segmentPresent = WriteAheadSegment.exists(in: path)
    var restored: RestoredCheckpoint?
    do {
      if segmentPresent, !configuration.allowDamage, let lock = openLock, lock.isAlone {
        restored = try restoreCheckpoint(in: path, readOnly: configuration.readOnly, lock: lock)
      }
    } catch {
      openLock?.release()
      throw error
    }
    var options = Environment.Options()
    options.durability = segmentPresent && !configuration.readOnly ? .deferred : .durable
    options.readOnly = configuration.readOnly
    options.createIfMissing = configuration.createIfMissing
    options.checkDataFile = !configuration.allowDamage
    options.acceptEmptyDataFile = place == .interruptedCreation
    options.initialMapSize = configuration.initialMapSize
    options.maxMapSize = configuration.maxMapSize
    options.lmdbVersionInPlaceOfLinked = configuration.lmdbVersionInPlaceOfLinked
    let environment: Environment
    do {
      environment = try Environment.open(path: path, options: options)
      if openLock == nil {
        openLock = try StoreOpenLock.acquire(directory: path, readOnly: configuration.readOnly)
      }
    } catch {
      openLock?.release()
      throw error
    }
    // Alone with a restored checkpoint: pin it before anything is written, so that no write of
    // this open reuses its pages until the segment is replayed and a new checkpoint taken.
    var recoveryPin: SnapshotPin?
    do {
      if segmentPresent, !configuration.readOnly, openLock?.isAlone == true {
        let pin = try environment.pinSnapshot()
        recoveryPin = pin
        // LMDB takes its transaction counter from the meta pages only when it is the first to
        // open `lock.mdb`; a process holding that file without Ferry's open lock (LMDB's tools,
        // a Ferry that predates the segment) leaves the dead writer's counter there, which the
        // restored checkpoint contradicts. Nothing may be written on top of that.
        if let restored, pin.transaction != restored.header.checkpointTransaction {
          throw FerryLogError.ioError(
            path: path,
            detail:
              "another process has LMDB's lock file (lock.mdb) open without Ferry's open lock, so the write-ahead segment cannot be recovered now (LMDB counts transaction \(pin.transaction), its checkpoint \(restored.header.checkpointTransaction)); nothing was replayed: close that process and open the store again"
          )
        }
      }
    } catch {
      environment.close()
      openLock?.release()
      throw error
    }
    do {
      return try finishOpening(
        environment, path: path, configuration: configuration, projections: projections, openLock: openLock,
        recoveryPin: recoveryPin, restored: restored)
    } catch {
      environment.close()
      openLock?.release()
      throw error
    }
  }

  /// Alone with a store that has a segment, before LMDB maps it: a read-write open puts the last
  /// checkpoint's meta pages back (`one-sync-commit.md` §4); a read-only one refuses a store whose
  /// segment holds anything past that checkpoint, which only a read-write open can replay.
  /// Returns, read-write, the checkpoint restored and the frames after it (replayed later in the
  /// open, which holds the lock exclusively until then: nothing changes them meanwhile).
  @discardableResult
  private static func restoreCheckpoint(
    in path: String, readOnly: Bool, lock: StoreOpenLock
  ) throws
    -> RestoredCheckpoint?
  {
    let fd = try WriteAheadSegment.open(in: path, readOnly: true)
    defer { WriteAheadSegment.closeFile(fd) }
    let header = try WriteAheadSegment.currentHeader(fd, directory: path)
    let metas = try checkBelongs(header, in: path)
    let scan = try WriteAheadSegment.scan(fd, header: header)
    if readOnly {
      if metas != header.metas || !scan.records.isEmpty {
        throw FerryLogError.needsRecovery(path: path)
      }
      return nil
    }
    // The head mark names the highest sequence ever acknowledged, and every acknowledged event is
    // in the checkpoint or a chained frame: a chain that stops short of it is a damaged segment
    // (a flipped frame, a torn header slot), and restoring its checkpoint could only lose more.
    // Refused before anything is written: the data file keeps its newer state for salvage.
    let reaches = header.checkpointHead &+ UInt64(scan.records.count)
    if case .mark(let mark) = HeadMark.read(in: path), !mark.isCreating, mark.head > reaches {
      throw FerryLogError.lostCommits(path: path, acknowledged: mark.head, found: reaches)
    }
    // From the first write until this open shares the lock, an open that waited for it must not
    // take the store for settled: if this one dies, the checkpoint may be restored and its frames
    // not yet replayed (StoreOpenLock).
    try lock.markUnsettled()
    _ = try WriteAheadSegment.restoreMetas(header, current: metas, in: path)
    return RestoredCheckpoint(header: header, scan: scan)
  }

  /// What an alone read-write open found in the segment before LMDB mapped the file.
  struct RestoredCheckpoint {
    let header: WriteAheadSegment.Header
    let scan: WriteAheadSegment.Scan
  }

  /// Refuses a segment that was not made beside this data file, before its meta pages are written
  /// into it (which cannot be undone): one whose store id is not the one the head mark names (a
  /// segment copied in from another store), or whose checkpoint is newer than anything the data
  /// file holds (an older data file copied in under the segment). A checkpoint's meta pages were
  /// flushed before its header was written, and a meta slot is only ever rewritten with a higher
  /// transaction id, so the data file's newest is at least the checkpoint's.
  /// Returns the data file's meta pages as it read them.
  private static func checkBelongs(_ header: WriteAheadSegment.Header, in path: String) throws -> [UInt8] {
    if case .mark(let mark) = HeadMark.read(in: path), !mark.isCreating,
      header.storeId != HeadMark.creatingId,
      mark.storeId != header.storeId
    {
      throw FerryLogError.damagedStore(
        path: path,
        reason:
          "its write-ahead segment belongs to another store (id \(hexString(header.storeId))) than this one (id \(hexString(mark.storeId))); nothing was written"
      )
    }
    let metas = try WriteAheadSegment.readMetas(in: path, pageSize: Int(header.pageSize))
    let newest = WriteAheadSegment.newestTransaction(metas)
    if newest < header.checkpointTransaction {
      throw FerryLogError.damagedStore(
        path: path,
        reason:
          "its data file's newest transaction (\(newest)) is older than its write-ahead segment's checkpoint (\(header.checkpointTransaction)): one of them was replaced; nothing was written"
      )
    }
    return metas
  }

  private static func finishOpening(
    _ environment: Environment, path: String, configuration: Configuration, projections: [any Projection],
    openLock: StoreOpenLock?, recoveryPin: SnapshotPin?, restored: RestoredCheckpoint?
  ) throws -> Opened {
    let existing = Set(try environment.namedDatabases())
    var isNew: Bool
    var storedFormat = storeFormatVersion
    if existing.contains("meta") {
      try environment.openDatabases(["meta"], create: false)
      let meta = try environment.database("meta")
      let format = try environment.read { txn in try txn.get(meta, key: MetaKey.format) }
      guard let format, let version = UInt32(bigEndianBytes: format) else {
        throw FerryLogError.notAStore(path: path, reason: "its meta database has no format version")
      }
      if version > newestReadableFormat {
        throw FerryLogError.newerFormat(path: path, found: version, supported: newestReadableFormat)
      }
      storedFormat = version
      guard existing.contains("events") else {
        throw FerryLogError.notAStore(path: path, reason: "it has no events database")
      }
      isNew = false
    } else if existing.isEmpty {
      if configuration.readOnly {
        throw FerryLogError.notAStore(path: path, reason: "the LMDB environment is empty")
      }
      CrashPoint.reach(CrashPoint.creatingStore)
      isNew = true
    } else {
      throw FerryLogError.notAStore(
        path: path,
        reason:
          "the LMDB environment holds other databases (\(existing.sorted().prefix(3).joined(separator: ", ")))"
      )
    }

    // Every database handle, opened in one committed transaction; a new store's metadata with them.
    var names = ["events", "meta"]
    var tablesByProjection: [String: [String]] = [:]
    for projection in projections {
      let databaseNames = BoundProjection.databaseNames(of: projection)
      tablesByProjection[projection.name] = databaseNames
      names += databaseNames + BoundProjection.snapshotDatabaseNames(of: projection)
    }
    var stale: [String: String] = [:]
    if configuration.readOnly {
      try environment.openDatabases(["events", "meta"], create: false)
      for projection in projections {
        let databaseNames = tablesByProjection[projection.name] ?? []
        if databaseNames.allSatisfy(existing.contains) {
          let snapshots = BoundProjection.snapshotDatabaseNames(of: projection)
          try environment.openDatabases(databaseNames + snapshots.filter(existing.contains), create: false)
        } else {
          stale[projection.name] = "its tables do not exist in this store"
        }
      }
    } else if !isNew, storedFormat >= storeFormatVersion, names.allSatisfy(existing.contains) {
      // Nothing to create or upgrade: the handles come from a read transaction, so that an open
      // does not wait for another process that holds LMDB's writer lock (an app extension
      // suspended mid-commit, a long compaction).
      try environment.openDatabases(names, create: false)
    } else {
      let clock = configuration.clock
      var createdHere = false
      try environment.openDatabases(names, create: true) { txn, databases in
        guard let meta = databases["meta"] else { return }
        createdHere = false
        if !isNew {
          if storedFormat < storeFormatVersion {
            try txn.put(meta, key: MetaKey.format, value: storeFormatVersion.bigEndianBytes)
          }
          return
        }
        // Another process creating the same store at the same moment may have committed first:
        // then this is its store, and its metadata stays.
        if try txn.get(meta, key: MetaKey.format) != nil { return }
        createdHere = true
        try txn.put(meta, key: MetaKey.format, value: storeFormatVersion.bigEndianBytes)
        try txn.put(meta, key: MetaKey.createdAt, value: clock().bigEndianBytes)
        let storeId = configuration.storeIdAtCreation ?? EventID.make(milliseconds: clock())
        try txn.put(meta, key: MetaKey.storeId, value: storeId.bytes)
        // An empty log's projections are current: their state goes in with the store's creation,
        // so a crash right after it never leaves a store whose projections were "never built".
        for projection in projections {
          try txn.put(
            meta, key: MetaKey.projection(projection.name),
            value: ProjectionState(version: projection.version, position: 0).bytes)
        }
      }
      isNew = isNew && createdHere
    }

    let bound = try projections.filter { stale[$0.name] == nil }.map {
      try BoundProjection.bind($0, in: environment)
    }
    let core = StoreCore(
      events: try environment.database("events"), meta: try environment.database("meta"), projections: bound,
      eventIndex: configuration.idempotentAppends && stale[EventIDIndex.projectionName] == nil
        ? bound.first { $0.name == EventIDIndex.projectionName }?.databases[EventIDIndex.table] : nil,
      catalog: configuration.catalog)

    // The write-ahead segment: replayed, created or removed by an open that is alone; followed by
    // one that shares the store. Before the head mark is read: a mark may name frames only.
    var segment: SegmentSession?
    if !configuration.readOnly {
      segment = try settleSegment(
        environment, core: core, path: path, configuration: configuration, storedFormat: storedFormat,
        isAlone: openLock?.isAlone ?? false, recoveryPin: recoveryPin, restored: restored)
    }

    // The head mark: the log must reach the highest sequence this store ever acknowledged. It is
    // read before the log's head: a mark is written only after its commit is durable, so a
    // snapshot begun after reading it holds at least that head, even while another process appends.
    let found = HeadMark.read(in: path)
    // One snapshot for the head, the store id and the record count (O(1): the log must hold
    // exactly `head − removed` records; only when it does not are the keys walked, to name the
    // first missing or misplaced sequence).
    let (logHead, storeId, countProblem) = try environment.read { txn in
      (
        try core.head(txn), try txn.get(core.meta, key: MetaKey.storeId),
        configuration.allowDamage
          ? nil : try core.countProblem(txn).map { ($0, try core.walkKeys(txn).problem) }
      )
    }
    let markId = storeId ?? HeadMark.creatingId
    if !configuration.allowDamage, case .mark(let mark) = found, !mark.isCreating {
      if mark.storeId != markId {
        throw FerryLogError.damagedStore(
          path: path,
          reason:
            "its data file belongs to another store (id \(hexString(markId))) than the one this directory held (id \(hexString(mark.storeId)))"
        )
      }
      if mark.head > logHead {
        throw FerryLogError.lostCommits(path: path, acknowledged: mark.head, found: logHead)
      }
    }
    if let (problem, gap) = countProblem {
      throw gap ?? FerryLogError.damagedStore(path: path, reason: problem)
    }
    var headMark: HeadMark?
    if !configuration.readOnly {
      let opened = HeadMark(directory: path, storeId: markId)
      opened.advance(to: logHead)
      headMark = opened
    }

    var replayed = 0
    if configuration.readOnly {
      try environment.read { txn in
        let head = try core.head(txn)
        for target in bound {
          if let reason = try core.staleness(of: target, head: head, txn) { stale[target.name] = reason }
        }
      }
    } else {
      replayed = try prepareProjections(
        core, environment: environment, chunk: configuration.rebuildChunkSize, reset: [])
    }

    if let segment, openLock?.isAlone == true {
      // Whatever recovery and catch-up wrote becomes the checkpoint the next frames follow.
      try segment.checkpointNow(environment: environment, core: core)
    }
    openLock?.share()

    let liveCore = StoreCore(
      events: core.events, meta: core.meta, projections: bound.filter { stale[$0.name] == nil },
      eventIndex: stale[EventIDIndex.projectionName] == nil ? core.eventIndex : nil, catalog: core.catalog)
    let head = try environment.read { txn in try core.head(txn) }
    return Opened(
      environment: environment, core: liveCore, stale: stale, created: isNew, replayed: replayed,
      headMark: headMark, segment: segment, openLock: openLock, head: head)
  }

  private init(_ opened: Opened, path: String, configuration: Configuration) {
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

  /// The session of an open: its parts, and a writer started on them (none read-only).
  private static func startSession(
    _ opened: Opened, configuration: Configuration, notifier: HeadNotifier, ownRanges: OwnRanges,
    instruments: LogInstruments
  ) -> Session {
    let (environment, core, headMark, segment) = (
      opened.environment, opened.core, opened.headMark, opened.segment
    )
    var writer: GroupCommitWriter?
    if !configuration.readOnly {
      let started = GroupCommitWriter(
        environment: environment, core: core, maxEventsPerCommit: configuration.maxEventsPerCommit,
        catchUpChunk: configuration.rebuildChunkSize,
        prepare: { events in try EventLog.prepare(events, configuration: configuration) },
        onOwnRange: { range, committing in
          ownRanges.ranges.withLock { ranges in
            if committing {
              if let last = ranges.last, last.upperBound &+ 1 == range.lowerBound {
                ranges[ranges.count - 1] = last.lowerBound...range.upperBound
              } else {
                ranges.append(range)
              }
              if ranges.count > 10_000 { ranges.removeFirst(ranges.count - 10_000) }
            } else if let last = ranges.last, last.upperBound == range.upperBound {
              if last.lowerBound >= range.lowerBound {
                ranges.removeLast()
              } else {
                ranges[ranges.count - 1] = last.lowerBound...(range.lowerBound - 1)
              }
            }
          }
        },
        onDurable: { head in headMark?.advance(to: head) },
        onCommit: { head in notifier.publish(head) }, instruments: instruments, segment: segment,
        spin: configuration.writerSpin ?? (segment != nil ? .microseconds(50) : .zero))
      started.start()
      writer = started
    }
    return Session(
      environment: environment, core: core, writer: writer, segment: segment, openLock: opened.openLock,
      headMark: headMark, stale: opened.stale)
  }

  deinit {
    close()
  }

  /// Waits for queued appends to finish, then closes the store. Later calls throw ``FerryLogError/closed``.
  /// Close a log before opening its directory again in the same process.
  public func close() {
    transitions.withLock { _ in
      let (wasOpen, wasSuspended, session) = life.withLock { life in
        defer { life.isClosed = true }
        return (!life.isClosed, life.isSuspended, life.session)
      }
      guard wasOpen else { return }
      notifier.close()
      // A suspension ended the session already (its open lock's descriptor is closed).
      if !wasSuspended { Self.end(session) }
    }
  }

  /// Stops the session's writer once every write handed to it is committed, and lets go of the
  /// store: checkpoint, environment, open lock. Ending a session twice is harmless.
  private static func end(_ session: Session) {
    session.writer?.stop()
    if let segment = session.segment, !session.environment.isClosed {
      // Everything written becomes the checkpoint (the next open then has nothing to replay);
      // a failure here loses nothing: the frames are still there for the next open.
      try? segment.checkpointNow(environment: session.environment, core: session.core)
      segment.releasePin(session.environment)
    }
    session.segment?.closeFile()
    session.headMark?.closeFile()
    session.environment.close()
    session.openLock?.release()
  }

  // MARK: Suspension

  /// Lets go of the store without closing the log: waits until every write already handed to the
  /// writer is committed (blocking the calling thread meanwhile), stops the writer, closes the
  /// LMDB environment and gives up every file lock this log holds (LMDB's on `lock.mdb` and
  /// Ferry's on `ferry-open.lock`), so that a process holding it may be suspended — iOS ends a
  /// suspended app that holds a lock in a shared container — and another process may open the
  /// store meanwhile, alone.
  ///
  /// Until ``resume()`` every call that reads or writes throws ``FerryLogError/suspended`` at
  /// once, and so does a call the suspension overtook (its write was not handed to the writer
  /// before the suspension, or its read had not begun); tails (``tail(after:pollInterval:chunkSize:)``)
  /// wait. Suspending a suspended or closed log does nothing.
  public func suspend() {
    transitions.withLock { _ in
      let session = life.withLock { life -> Session? in
        guard !life.isClosed, !life.isSuspended else { return nil }
        life.isSuspended = true
        return life.session
      }
      guard let session else { return }
      Self.end(session)
      instruments.suspended(path: path)
    }
  }

  /// Opens the store again after ``suspend()``, as ``open(at:configuration:)`` would — the same
  /// checks, recovery of the write-ahead segment, and projections caught up with whatever other
  /// processes appended meanwhile — and takes its locks again. Does nothing unless suspended.
  /// When the open fails (the store was damaged or removed meanwhile) the log stays suspended and
  /// the open's error is thrown; resume may be tried again.
  public func resume() throws {
    try transitions.withLock { _ in
      guard life.withLock({ !$0.isClosed && $0.isSuspended }) else { return }
      var again = configuration
      again.storeIdAtCreation = nil
      // The store exists: a resume never creates one where it went missing.
      again.createIfMissing = false
      let opened = try Self.openParts(at: path, configuration: again)
      let session = Self.startSession(
        opened, configuration: configuration, notifier: notifier, ownRanges: ownRanges,
        instruments: instruments)
      life.withLock { life in
        life.session = session
        life.isSuspended = false
      }
      instruments.resumed(path: path, replayed: opened.replayed)
      // Other processes' appends made while suspended: waiting tails read them.
      notifier.publish(opened.head)
    }
  }

  /// Whether the log is suspended (``suspend()``) now.
  public var isSuspended: Bool { life.withLock { $0.isSuspended } }

  /// The error for a call the log cannot serve now: ``FerryLogError/closed`` once closed,
  /// ``FerryLogError/suspended`` otherwise (the writer or environment it used belongs to a
  /// session that a suspension ended).
  var unavailable: FerryLogError {
    life.withLock { $0.isClosed } ? .closed : .suspended
  }

  /// Whether the log was closed or suspended: a call must not begin.
  var isUnavailable: Bool { life.withLock { $0.isClosed || $0.isSuspended } }

  /// Whether this open of the log appended the event at `sequence` (as opposed to another process).
  public func appendedHere(_ sequence: UInt64) -> Bool {
    appendedHere(allOf: sequence...sequence)
  }

  /// Whether this open of the log appended every event in `range` (false when another process
  /// appended any of them, or this open no longer remembers).
  public func appendedHere(allOf range: ClosedRange<UInt64>) -> Bool {
    ownRanges.ranges.withLock { ranges in
      var low = 0
      var high = ranges.count
      while low < high {
        let middle = (low + high) / 2
        if ranges[middle].upperBound < range.lowerBound { low = middle + 1 } else { high = middle }
      }
      var next = range.lowerBound
      while low < ranges.count, ranges[low].lowerBound <= next {
        if ranges[low].upperBound >= range.upperBound { return true }
        next = ranges[low].upperBound + 1
        low += 1
      }
      return false
    }
  }

  /// Whether ``close()`` was called.
  public var isClosed: Bool { life.withLock { $0.isClosed } }

  private static func validate(projections: [any Projection], userProjections: [any Projection]) throws {
    var seen = Set<String>()
    for projection in projections {
      guard TableNaming.isValidName(projection.name) else {
        throw FerryLogError.invalidConfiguration(
          reason: "projection name '\(projection.name)' must be 1 to 48 characters from A-Z a-z 0-9 . _ -")
      }
      guard seen.insert(projection.name).inserted else {
        throw FerryLogError.invalidConfiguration(reason: "two projections are named '\(projection.name)'")
      }
      guard !projection.tables.isEmpty, Set(projection.tables).count == projection.tables.count,
        projection.tables.allSatisfy({ TableNaming.isValidName($0) })
      else {
        throw FerryLogError.invalidConfiguration(
          reason:
            "projection '\(projection.name)' must declare distinct table names of 1 to 48 characters from A-Z a-z 0-9 . _ -"
        )
      }
    }
    if let reserved = userProjections.first(where: { $0.name.hasPrefix("ferry.") }) {
      throw FerryLogError.invalidConfiguration(
        reason: "projection names starting with 'ferry.' are Ferry's own ('\(reserved.name)')")
    }
  }

  /// Refuses a path that is a file, or a non-empty directory that holds no store.
  /// What the directory holds, as far as opening it is concerned.
  enum Place: Equatable {
    /// A store (a data file of some length).
    case existing
    /// A store is to be created here (the directory now exists, with the creation mark in it).
    case new
    /// A zero-length data file that no acknowledged commit ever reached: a creation killed
    /// before LMDB wrote its meta pages. LMDB initializes it.
    case interruptedCreation
  }

  /// Decides whether `path` holds a store or may get a new one — never creating one where a store
  /// was (its head mark says so) or where something else is — and, for a new store, makes the
  /// directory and writes the creation mark before LMDB creates its files. Safe against another
  /// process creating the same store at the same moment: both end up opening one store.
  private static func checkDirectory(_ path: String, configuration: Configuration) throws -> Place {
    let creating = !configuration.readOnly && configuration.createIfMissing
    var info = stat()
    if stat(path, &info) != 0 {
      let code = errno
      guard code == ENOENT else {
        if code == EACCES { throw FerryLogError.permissionDenied(path: path, detail: "cannot read \(path)") }
        throw FerryLogError(LMDBError(code: code, operation: "reading \(path)"), path: path)
      }
      guard creating else { throw FerryLogError.noSuchStore(path: path) }
      if mkdir(path, 0o700) != 0 && errno != EEXIST {
        let code = errno
        if code == ENOENT { throw FerryLogError.noSuchStore(path: path) }
        throw FerryLogError(LMDBError(code: code, operation: "creating directory \(path)"), path: path)
      }
      guard stat(path, &info) == 0 else { throw FerryLogError.noSuchStore(path: path) }
    }
    guard (info.st_mode & S_IFMT) == S_IFDIR else {
      throw FerryLogError.notAStore(path: path, reason: "it is a file, not a directory")
    }
    guard access(path, R_OK | X_OK) == 0 else {
      throw FerryLogError.permissionDenied(path: path, detail: "this user may not read the directory \(path)")
    }
    let mark = HeadMark.read(in: path)
    let heldAStore: UInt64? = {
      if case .mark(let contents) = mark, !contents.isCreating { return contents.head }
      return nil
    }()
    var dataFile = stat()
    if stat(path + "/data.mdb", &dataFile) == 0 {
      guard (dataFile.st_mode & S_IFMT) == S_IFREG else {
        throw FerryLogError.damagedStore(path: path, reason: "data.mdb is not a regular file")
      }
      guard dataFile.st_size == 0 else { return .existing }
      if configuration.allowDamage { return .existing }
      if let held = heldAStore {
        throw FerryLogError.damagedStore(
          path: path,
          reason:
            "data.mdb is empty (0 bytes) but this directory held a store with events up to sequence \(held)")
      }
      guard creating else {
        if case .mark = mark {
          throw FerryLogError.notAStore(
            path: path,
            reason:
              "a store is being created here (or its creation was killed): open it read-write to finish it")
        }
        throw FerryLogError.damagedStore(path: path, reason: "data.mdb is empty (0 bytes)")
      }
      return .interruptedCreation
    }
    if let held = heldAStore {
      throw FerryLogError.damagedStore(
        path: path,
        reason: "data.mdb is missing but this directory held a store with events up to sequence \(held)")
    }
    // lock.mdb alone is what a first open that died before creating data.mdb leaves behind; the
    // creation mark is written just before it, and the open lock (ferry-open.lock) before that.
    // Another process creating the store right now may have added data.mdb since it was looked
    // for: then it is a store.
    let entries = ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).filter {
      $0 != "lock.mdb" && $0 != HeadMark.fileName && $0 != StoreOpenLock.fileName
    }
    if entries.contains("data.mdb") { return .existing }
    guard creating else { throw FerryLogError.notAStore(path: path, reason: "it has no data.mdb") }
    if !entries.isEmpty {
      throw FerryLogError.notAStore(
        path: path,
        reason:
          "the directory is not empty and has no data.mdb (found \(entries.sorted().prefix(3).joined(separator: ", ")))"
      )
    }
    if mark == .missing || mark == .unreadable {
      HeadMark.write(HeadMark.Contents(storeId: HeadMark.creatingId, head: 0), in: path)
    }
    return .new
  }

  private static func translateOpenError(_ error: LMDBError, path: String) -> FerryLogError {
    switch error {
    case .noSuchFile: return .noSuchStore(path: path)
    case .alreadyOpen: return .alreadyOpen(path: path)
    case .notADirectory: return .notAStore(path: path, reason: "it is not a directory")
    case .permissionDenied, .readOnlyFileSystem, .notPermitted:
      return .permissionDenied(path: path, detail: error.message)
    case .invalid, .versionMismatch:
      return .notAStore(
        path: path, reason: "data.mdb is not an LMDB file this version can read (\(error.message))")
    default: return FerryLogError(error, path: path)
    }
  }

  // MARK: Appending

  /// Appends events as one atomic unit and returns their sequence numbers once they are durable.
  ///
  /// An event whose id is already in the log (with idempotent appends on) is not stored again;
  /// its existing sequence number is returned. Throws ``FerryLogError/invalidEvent(reason:)`` for
  /// a bad type or an oversized payload, ``FerryLogError/unknownEventType(type:sequence:)`` for a
  /// type outside the catalog, ``FerryLogError/projectionFailed(projection:sequence:underlying:)``
  /// when a projection rejects an event (nothing of this call is written), ``FerryLogError/closed``.
  ///
  /// Cancelling the calling task does not withdraw events already handed to the writer.
  public func append(_ events: [NewEvent]) async throws -> [UInt64] {
    guard let writer else {
      throw FerryLogError.permissionDenied(path: path, detail: "the store is open read-only")
    }
    if events.isEmpty { return [] }
    if isUnavailable { throw unavailable }
    let prepared = try Self.prepare(events, configuration: configuration)
    let outcome = try await withUnsafeThrowingContinuation {
      (continuation: UnsafeContinuation<GroupCommitWriter.AppendOutcome, any Error>) in
      let request = GroupCommitWriter.AppendRequest(work: .events(prepared), continuation: continuation)
      if !writer.submit(.append(request)) {
        continuation.resume(throwing: unavailable)
      }
    }
    return outcome.sequences
  }

  /// Appends one event and returns its sequence number once it is durable.
  public func append(_ event: NewEvent) async throws -> UInt64 {
    let sequences = try await append([event])
    guard let sequence = sequences.first else {
      throw FerryLogError.invalidEvent(reason: "the writer returned no sequence")
    }
    return sequence
  }

  static func prepare(_ events: [NewEvent], configuration: Configuration) throws -> [PreparedEvent] {
    let now = configuration.clock()
    return try events.map { event in
      guard EventRecord.isValidType(event.type) else {
        throw FerryLogError.invalidEvent(
          reason:
            "event type '\(event.type)' must be 1 to \(EventRecord.maxTypeLength) characters from A-Z a-z 0-9 . _ : -"
        )
      }
      guard event.payload.count <= configuration.maxPayloadSize else {
        throw FerryLogError.invalidEvent(
          reason:
            "payload of \(event.payload.count) bytes exceeds the maximum of \(configuration.maxPayloadSize)")
      }
      guard event.schemaVersion >= 1 else {
        throw FerryLogError.invalidEvent(reason: "schema versions start at 1")
      }
      let catalogType = try configuration.catalog?.validatedType(of: event)
      let timestamp = event.timestamp ?? now
      let id = event.id ?? EventID.make(milliseconds: timestamp)
      let record = try EventRecord.encodeUnsealed(
        type: event.type, schemaVersion: event.schemaVersion, timestamp: timestamp, id: id,
        payload: event.payload, typeChecked: true)
      var current = (version: event.schemaVersion, payload: event.payload)
      // An event at its type's current version is its own upcast.
      if let catalog = configuration.catalog, let catalogType, event.schemaVersion != catalogType.version {
        let probe = LoggedEvent(
          sequence: 0, type: event.type, schemaVersion: event.schemaVersion, timestamp: timestamp, id: id,
          payload: event.payload)
        do {
          let upcast = try catalog.upcast(probe)
          current = (upcast.schemaVersion, upcast.payload)
        } catch {
          throw FerryLogError.invalidEvent(
            reason: "its payload cannot be upcast to the current schema: \(error)")
        }
      }
      return PreparedEvent(
        type: event.type, schemaVersion: event.schemaVersion, currentSchemaVersion: current.version,
        currentPayload: current.payload, timestamp: timestamp, id: id, payload: event.payload, record: record,
        // What the appender already decoded, when the projections see the payload it gave.
        decoded: current.version == event.schemaVersion ? event.decoded : nil)
    }
  }

  // MARK: Reading

  /// The last sequence number in the log (0 when it is empty).
  public func head() throws -> UInt64 {
    try guarded { try environment.read { txn in try core.head(txn) } }
  }

  /// The store id a directory's head mark names, read without opening the store — a damaged
  /// store's too (the mark is a file of its own); nil when there is none.
  package static func markedStoreId(at path: String) -> EventID? {
    guard case .mark(let mark) = HeadMark.read(in: path), !mark.isCreating else { return nil }
    return EventID(bytes: mark.storeId)
  }

  /// The store's identity: made at random when the store was created and never changed — kept
  /// by compaction, `ferry compact --copy` and `ferry salvage`; a store created anew (even at the
  /// same path, or by `ferry import`) has another. Nil only for a store whose creation never finished.
  public func storeId() throws -> EventID? {
    try guarded {
      try environment.read { txn in try txn.get(core.meta, key: MetaKey.storeId).flatMap(EventID.init(bytes:))
      }
    }
  }

  /// The event at `sequence`, decoded and upcast; nil when there is none.
  public func event(at sequence: UInt64) throws -> LoggedEvent? {
    try guarded {
      try environment.read { txn in
        try txn.withValue(core.events, key: sequence.bigEndianBytes) { buffer in
          try buffer.map { try core.decode($0, sequence: sequence) }
        }
      }
    }
  }

  /// The stored bytes of the record at `sequence`, exactly as on disk; nil when there is none.
  public func record(at sequence: UInt64) throws -> [UInt8]? {
    try guarded { try environment.read { txn in try txn.get(core.events, key: sequence.bigEndianBytes) } }
  }

  /// Up to `limit` events after `sequence`, in order, read in one short read transaction.
  public func events(after sequence: UInt64, limit: Int = 1000) throws -> [LoggedEvent] {
    try events(after: sequence, limit: limit, upcast: true)
  }

  func events(after sequence: UInt64, limit: Int, upcast: Bool) throws -> [LoggedEvent] {
    try guarded {
      var result: [LoggedEvent] = []
      if limit <= 0 || sequence == .max { return result }
      try environment.read { txn in
        // Gaps are allowed only where compaction removed events on purpose.
        let compacted = try core.compactedThrough(txn)
        var expected = sequence + 1
        try txn.withCursor(core.events) { cursor in
          try cursor.scan(from: (sequence + 1).bigEndianBytes) { key, value in
            guard let current = UInt64(bigEndianBytes: key) else {
              throw FerryLogError.corruptRecord(
                sequence: expected, reason: "its key has \(key.count) bytes, not 8"
              )
            }
            if let problem = StoreCore.orderProblem(current, expected: expected, compacted: compacted) {
              throw problem
            }
            expected = current &+ 1
            result.append(
              upcast
                ? try core.decode(value, sequence: current) : try EventRecord.decode(value, sequence: current)
            )
            return result.count < limit
          }
        }
      }
      return result
    }
  }

  /// Calls `body` with every event from `first` through `last` (the head when nil), reading in
  /// chunks of `chunkSize` so that no read transaction stays open long.
  public func forEachEvent(
    from first: UInt64 = 1, through last: UInt64? = nil, chunkSize: Int = 1000,
    _ body: (LoggedEvent) throws -> Void
  ) throws {
    try forEach(from: first, through: last, chunkSize: chunkSize, upcast: true, body)
  }

  /// Like ``forEachEvent(from:through:chunkSize:_:)``, but with every record exactly as stored:
  /// not upcast, and readable without a catalog entry for its type (for export and statistics).
  public func forEachRecord(
    from first: UInt64 = 1, through last: UInt64? = nil, chunkSize: Int = 1000,
    _ body: (LoggedEvent) throws -> Void
  ) throws {
    try forEach(from: first, through: last, chunkSize: chunkSize, upcast: false, body)
  }

  private func forEach(
    from first: UInt64, through last: UInt64?, chunkSize: Int, upcast: Bool,
    _ body: (LoggedEvent) throws -> Void
  ) throws {
    var after = first > 0 ? first - 1 : 0
    let (head, removedBefore) = try read { view in
      (try view.core.head(view.transaction), try view.core.compaction(view.transaction)?.removed ?? 0)
    }
    let end = min(last ?? head, head)
    var seen: UInt64 = 0
    while after < end {
      let chunk = try events(after: after, limit: max(1, chunkSize), upcast: upcast)
      guard !chunk.isEmpty else {
        // Nothing after `after` up to the head: only compaction may have removed that (the head
        // is then its point); anything else is a log that ends before its head.
        guard try compactionState().map({ $0.through >= end }) ?? false else {
          throw FerryLogError.sequenceGap(expected: after + 1, found: nil)
        }
        break
      }
      for event in chunk where event.sequence <= end {
        try body(event)
        seen += 1
        after = event.sequence
      }
      if let lastRead = chunk.last?.sequence, lastRead >= end { break }
    }
    // A scan of the whole log must meet every record it holds (`head − removed`): a damaged branch
    // page can make a cursor skip a leaf inside the compacted range, where gaps are otherwise
    // legal. Skipped when a compaction ran during the scan (its removals are not this scan's).
    guard first <= 1, end == head else { return }
    let removedAfter = try read { view in try view.core.compaction(view.transaction)?.removed ?? 0 }
    guard removedAfter == removedBefore, head >= removedBefore, seen != head - removedBefore else { return }
    throw FerryLogError.damagedStore(
      path: path,
      reason:
        "a scan of the whole log met \(seen) records, but its head \(head) less the \(removedBefore) compaction removed makes \(head - removedBefore)"
    )
  }

  /// Reader slots left by dead processes that were cleared when this log was opened.
  public var environmentStaleReadersCleared: Int { environment.staleReadersCleared }

  /// Reads projections through one consistent snapshot.
  ///
  /// ```swift
  /// let n = try log.read { view in try view.tables(of: "countByType").count("counts") }
  /// ```
  ///
  /// A projection the log has moved past — another process appended without folding it, or is
  /// rebuilding it in chunks, or was killed part-way through a rebuild — is first caught up through
  /// this process's writer (what an append here does first), and `body` runs again on a snapshot
  /// that has it. When that snapshot is behind again (another process keeps appending without
  /// folding, or rebuilds back to back, and won the race), `body` runs once more inside the
  /// writer's own transaction, on the writer's thread, after the writer has folded what is behind:
  /// there the projections are at the head whatever other processes do. So `body` may run more
  /// than once, on another thread than the caller's; it should only read the view, and not depend
  /// on the calling thread (thread or task locals, locks the caller holds). While it runs in the
  /// writer's transaction this process's appends, and other processes' writes, wait for it.
  ///
  /// The read waits for the writer at most a second for the catch-up and four seconds in all,
  /// blocking its thread: when another process holds LMDB's write lock for longer (an app
  /// extension suspended mid-rebuild), it throws
  /// ``FerryLogError/projectionNotCurrent(projection:reason:)`` rather than hang — a read on an
  /// app's main thread — with a reason that says the writer did not get to the read. A `body` the
  /// writer has begun is waited for; one it has not is never run after the read gave up.
  ///
  /// Still ``FerryLogError/projectionNotCurrent(projection:reason:)``, at once: a read-only open (no
  /// writer), a read on the writer's own thread (a compaction's predicate: it would wait for
  /// itself), a read inside another read (its thread holds a snapshot the writer may have to wait
  /// for, to grow the map). A projection stored at another version is never folded or served: its
  /// read gets the error after the rounds above. A closed log throws ``FerryLogError/closed``.
  public func read<R>(_ body: (LogView) throws -> R) throws -> R {
    try read(body, inWriter: true)
  }

  /// ``read(_:)`` for a caller with a way to wait for the writer that does not block a thread
  /// (``execute(_:)``, which suspends): a snapshot and, after one catch-up, another — then
  /// ``FerryLogError/projectionNotCurrent(projection:reason:)``, never a turn in the writer's
  /// transaction, so it blocks its thread a second at most where ``read(_:)`` may take four.
  package func readCatchingUpOnly<R>(_ body: (LogView) throws -> R) throws -> R {
    try read(body, inWriter: false)
  }

  /// A snapshot; when a projection is behind, ``readBehind(_:_:inWriter:)``.
  private func read<R>(_ body: (LogView) throws -> R, inWriter: Bool) throws -> R {
    let behind: FerryLogError
    do {
      return try readSnapshot(body)
    } catch let error as FerryLogError {
      guard case .projectionNotCurrent = error else { throw error }
      behind = error
    }
    return try readBehind(body, behind, inWriter: inWriter)
  }

  /// `body` on a new read snapshot.
  private func readSnapshot<R>(_ body: (LogView) throws -> R) throws -> R {
    try guarded {
      // One session for the whole read: a resume meanwhile must not mix two environments' handles.
      let session = self.session
      return try session.environment.read { txn in
        try body(LogView(core: session.core, transaction: txn, stale: session.stale))
      }
    }
  }

  /// The rest of ``read(_:)`` once its snapshot found a projection behind the log (`behind`):
  /// one catch-up and a new snapshot, then, `inWriter`, `body` in the writer's transaction.
  private func readBehind<R>(
    _ body: (LogView) throws -> R, _ behind: FerryLogError, inWriter: Bool
  ) throws -> R {
    // Only a writer this thread may wait for can help: none read-only; not on its own thread
    // (it would wait for itself); not on a thread holding another transaction of the store — a
    // read inside a read: the writer's transaction may have to grow the map, which waits for
    // that transaction to end, which waits for the writer.
    guard let writer, !writer.isCurrentThread, !environment.callingThreadHoldsTransaction else {
      throw behind
    }
    let deadline = DispatchTime.now() + Self.readWriterWait
    var notCurrent = behind
    switch try catchUpBehind(writer) {
    case .refused:
      throw unavailable
    case .pending:
      // The writer did not finish the catch-up in a second (another process holds LMDB's write
      // lock, or this process's writer is on a long job): the job stays queued, and the read's
      // turn in the writer's transaction queues behind it, until the deadline.
      guard inWriter else { throw behind }
    case .done:
      // One new snapshot: behind again means another process keeps moving the projection (it
      // appends without folding it, or rebuilds back to back) and won this race; more rounds
      // would mostly lose too. The writer's transaction cannot lose it.
      do {
        return try readSnapshot(body)
      } catch let error as FerryLogError {
        guard case .projectionNotCurrent = error else { throw error }
        notCurrent = error
      }
    }
    guard inWriter else { throw notCurrent }
    return try readInWriter(body, writer: writer, until: deadline, notCurrent: notCurrent)
  }

  /// How long a read waits for its catch-up before it runs in the writer's transaction instead.
  static let readCatchUpWait: DispatchTimeInterval = .seconds(1)

  /// The longest ``read(_:)`` waits for this process's writer in all — its catch-up
  /// (``readCatchUpWait`` at most), then for the writer to begin the transaction it reads in —
  /// before it throws ``FerryLogError/projectionNotCurrent(projection:reason:)``. Bounded, because
  /// another process may hold LMDB's write lock for as long as it is stopped (an app extension
  /// suspended mid-rebuild, a debugger), and a read on an app's main thread must not freeze the
  /// app for that long; four seconds, because a read is rarely worth more to an app and rarely
  /// needs as much (the writer's turn normally comes within a commit or a rebuild chunk).
  static let readWriterWait: DispatchTimeInterval = .seconds(readWriterWaitSeconds)
  /// ``readWriterWait`` in whole seconds (for messages).
  static let readWriterWaitSeconds = 4

  /// What became of a read's catch-up.
  enum CatchUp {
    /// The writer folded what was behind (or found nothing behind).
    case done
    /// The writer has not finished it within ``readCatchUpWait``; it stays queued.
    case pending
    /// The writer is stopping: the log is closed.
    case refused
  }

  /// Folds into this process's projections what the log holds past them, on the writer thread
  /// (waiting for it, ``readCatchUpWait`` at most), and checkpoints when the store has a
  /// write-ahead segment. The caller checked that this thread may wait for the writer (see
  /// ``readBehind(_:_:)``).
  func catchUpBehind(_ writer: GroupCommitWriter) throws -> CatchUp {
    let core = self.core
    let environment = self.environment
    let chunk = configuration.rebuildChunkSize
    let segment = self.segment
    let outcome = Mutex<Result<Int, any Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    let accepted = writer.submit(
      .exclusive {
        let result = Result {
          let folded = try Self.foldBehind(core, environment: environment, chunk: chunk)
          if folded > 0 { try segment?.checkpointNow(environment: environment, core: core) }
          return folded
        }
        outcome.withLock { $0 = result }
        done.signal()
      })
    guard accepted else { return .refused }
    // Bounded: another process may hold LMDB's write lock for long (an app extension suspended
    // mid-rebuild). The job stays queued and catches up when it can.
    guard done.wait(timeout: .now() + Self.readCatchUpWait) == .success else { return .pending }
    switch outcome.withLock({ $0 }) {
    case .failure(let error): throw FerryLogError.wrap(error, path: path)
    case .success, nil: return .done
    }
  }

  /// How many reads since open ran their body in the writer's transaction, their projection
  /// still behind after a catch-up (for tests).
  package var readsRunInWriter: Int { readsInWriter.load(ordering: .relaxed) }

  /// Counters of commits and appends since open.
  public var statistics: Statistics { writer?.statistics.withLock { $0 } ?? Statistics() }

  /// Counters of the storage engine in this process (commits, aborts, map growths).
  public var storageCounters: StorageCounters { StorageCounters(environment.counters) }

  /// The map size and how much of it is used.
  public func storageInfo() throws -> StorageInfo { StorageInfo(try guarded { try environment.info() }) }

  /// Runs `body`, turning storage errors into ``FerryLogError`` and refusing work after close.
  func guarded<R>(_ body: () throws -> R) throws -> R {
    let began = life.withLock { life -> Session? in life.isClosed || life.isSuspended ? nil : life.session }
    guard let began else { throw unavailable }
    do {
      return try body()
    } catch let error as LMDBError {
      // A suspension (or close) ended the session under the call: its environment is closed.
      if isUnavailable || began !== session { throw unavailable }
      throw FerryLogError(error, path: path)
    }
  }
}

/// A consistent snapshot of a log's projections, valid only inside ``EventLog/read(_:)``.
public struct LogView {
  let core: StoreCore
  let transaction: Transaction
  let stale: [String: String]
  var fixedHead: UInt64? = nil
  /// Whether to check each projection's stored state against the log (not for a scratch rebuild).
  var checksState = true

  /// The head of the log in this snapshot (for a view of the past, the sequence it was built up to).
  public func head() throws -> UInt64 { try fixedHead ?? core.head(transaction) }

  /// The event at `sequence` in this snapshot, decoded and upcast; nil when there is none (or it
  /// is past the head of a view of the past).
  public func event(at sequence: UInt64) throws -> LoggedEvent? {
    if let fixedHead, sequence > fixedHead { return nil }
    return try transaction.withValue(core.events, key: sequence.bigEndianBytes) { buffer in
      try buffer.map { try core.decode($0, sequence: sequence) }
    }
  }

  /// The tables of the projection named `name`.
  public func tables(of name: String) throws -> ProjectionReader {
    if let reason = stale[name] { throw FerryLogError.projectionNotCurrent(projection: name, reason: reason) }
    guard let target = core.projections.first(where: { $0.name == name }) else {
      throw FerryLogError.invalidConfiguration(reason: "no projection named '\(name)' is registered")
    }
    // Another process may have appended without it, rebuilt it at another version, or a rebuild
    // may have failed part-way: never serve rows that do not match the log.
    if checksState, let reason = try core.staleness(of: target, head: core.head(transaction), transaction) {
      throw FerryLogError.projectionNotCurrent(projection: name, reason: reason)
    }
    return ProjectionReader(tables: target.tables(in: transaction))
  }
}

/// The sequence ranges one open of a log appended.
final class OwnRanges: Sendable {
  let ranges = Mutex<[ClosedRange<UInt64>]>([])
}
