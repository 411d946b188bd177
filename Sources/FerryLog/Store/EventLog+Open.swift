import Foundation
import LMDB
import Synchronization

extension EventLog {
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
  static func openParts(at path: String, configuration: Configuration) throws -> Opened {
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
    /// The private copy this open reads instead of a store that needs recovery, if it does.
    var recoveredCopy: RecoveredCopy? = nil
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
      where [LMDBError.notFound, .incompatible, .badDatabase].contains(where: { $0.code == lmdb.code }):
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

  static func openStore(at path: String, configuration: Configuration) throws -> Opened {
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
      openLock = try StoreOpenLock.acquire(
        directory: path, readOnly: configuration.readOnly, keepUnsettled: wantsCopy(configuration))
    }
    let segmentPresent = WriteAheadSegment.exists(in: path)
    if let lock = openLock, lock.isUnsettled {
      return try openRecoveredCopy(of: path, configuration: configuration, lock: lock)
    }
    var restored: RestoredCheckpoint?
    do {
      if segmentPresent, !configuration.allowDamage, let lock = openLock, lock.isAlone {
        restored = try restoreCheckpoint(in: path, readOnly: configuration.readOnly, lock: lock)
      } else if segmentPresent, !configuration.allowDamage, let lock = openLock, lock.mustFindSettled {
        // No process has LMDB open, so no pin keeps the checkpoint and its frames are not in
        // data.mdb for sure: refused as a read-only open would refuse it, never checkpointed over.
        try restoreCheckpoint(in: path, readOnly: true, lock: lock)
      }
    } catch FerryLogError.needsRecovery(_) where wantsCopy(configuration) {
      // Copied under the lock, so that no read-write open settles or writes the store meanwhile.
      guard let lock = openLock else { throw FerryLogError.needsRecovery(path: path) }
      return try openRecoveredCopy(of: path, configuration: configuration, lock: lock)
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
    // A data file that is the checkpoint's, with no frame after it, is settled as it stands:
    // nothing to restore, nothing marked. An open refused after this point (a damaged page) must
    // not leave a mark that makes every later read-only open say "needs recovery" instead of
    // naming the damage (DirtyFlagTests).
    if metas == header.metas && scan.records.isEmpty { return RestoredCheckpoint(header: header, scan: scan) }
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
      // Another process's last frames may be unflushed claims (`CommandContext.mayDeferFlush`):
      // flushed first, so the mark never names what a power cut could still take.
      try segment?.flushFrames()
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

  /// The session of an open: its parts, and a writer started on them (none read-only).
  static func startSession(
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
      headMark: headMark, stale: opened.stale, recoveredCopy: opened.recoveredCopy)
  }

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
    // C reads a path only up to its first NUL: "a\0b" would open or create the store at "a".
    guard !path.utf8.contains(0) else {
      throw FerryLogError.invalidConfiguration(reason: "a store's path must not contain a NUL character")
    }
    var info = stat()
    if stat(path, &info) != 0 {
      let code = errno
      guard code == ENOENT else {
        if code == EACCES { throw FerryLogError.permissionDenied(path: path, detail: "cannot read \(path)") }
        if code == ENOTDIR {
          throw FerryLogError.notAStore(path: path, reason: "a part of its path is a file, not a directory")
        }
        if code == ENAMETOOLONG {
          throw FerryLogError.invalidConfiguration(
            reason: "the path \(path) is too long for the file system (\(path.utf8.count) bytes)")
        }
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
    case _ where error.code == EISDIR:
      // data.mdb was checked to be a file before LMDB opened it: the directory is the lock file.
      return .damagedStore(
        path: path,
        reason:
          "its lock file lock.mdb is a directory, not a file: remove that directory (LMDB makes the file anew)"
      )
    default: return FerryLogError(error, path: path)
    }
  }
}
