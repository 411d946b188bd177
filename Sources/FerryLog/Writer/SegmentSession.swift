import LMDB
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// One process's use of a store's write-ahead segment (`Specs/one-sync-commit.md`): the open
/// file, the pin that keeps the last checkpoint's pages from reuse, and when to checkpoint next.
///
/// Used by the writer thread (commits, maintenance jobs) and by open and close, never at the same
/// time; the mutable state sits in a Mutex all the same.
final class SegmentSession: Sendable {
  let directory: String
  let fd: Int32
  let storeId: [UInt8]
  /// When to checkpoint next.
  let limits: Limits

  /// Checkpoint after this many frames, frame bytes or bytes of data-file pages freed since the
  /// last checkpoint, whichever comes first (`EventLog.Configuration.segmentCheckpointCommits`…).
  struct Limits: Sendable {
    var frames: Int
    var bytes: Int
    var freedBytes: Int

    init(_ configuration: EventLog.Configuration) {
      frames = max(1, configuration.segmentCheckpointCommits)
      bytes = max(4096, configuration.segmentCheckpointBytes)
      freedBytes = max(4096, configuration.segmentCheckpointFreedBytes)
    }
  }

  struct State {
    /// This process's pin: the state of a checkpoint at or before the current one. Nil until
    /// this process has made a checkpoint itself; it may write no frame before.
    var pin: SnapshotPin?
    var framesSinceCheckpoint = 0
    var bytesSinceCheckpoint = 0
    /// Data-file pages freed by commits (of any process) after this process's pin, counted
    /// through `freedCountedThrough`: the pages LMDB cannot reuse before the next checkpoint.
    var pagesFreedSinceCheckpoint = 0
    var freedCountedThrough: UInt64 = 0
    var pageSize = 4096
    /// The offset of a frame flushed for a transaction not yet known to be committed.
    var unconfirmedFrame: UInt64?
    var checkpoints = 0
    var frames = 0
    /// The file's size (frames never shrink it; one that runs past the end grows it).
    var fileSize = 0
  }
  private let state = Mutex(State())

  init(directory: String, fd: Int32, storeId: [UInt8], limits: Limits) {
    self.directory = directory
    self.fd = fd
    self.storeId = storeId
    self.limits = limits
    let size = WriteAheadSegment.size(fd)
    state.withLock { $0.fileSize = size }
  }

  /// Whether ``closeFile()`` closed `fd`.
  private let fileClosed = Atomic<Bool>(false)

  /// Closes the segment file, once: at close or suspension of the log, after its last checkpoint
  /// (a suspended process keeps no file of the store open). Nothing uses the session afterwards.
  func closeFile() {
    if !fileClosed.exchange(true, ordering: .acquiringAndReleasing) { close(fd) }
  }

  deinit { closeFile() }

  /// Counts for tests and benchmarks: checkpoints made and frames written by this process.
  var counts: (checkpoints: Int, frames: Int) { state.withLock { ($0.checkpoints, $0.frames) } }

  // MARK: - Creating

  /// Creates the segment of a store whose every commit so far was flushed: written beside as a
  /// temporary file (zeros to its full size, then the first checkpoint's header), flushed, renamed
  /// into place and the directory flushed. Returns the open session, holding its first pin.
  static func create(
    environment: Environment, txn: Transaction, core: StoreCore, directory: String, storeId: [UInt8],
    limits: Limits
  ) throws -> SegmentSession {
    let temporary = WriteAheadSegment.path(in: directory) + ".new"
    unlink(temporary)
    let fd = systemOpen(temporary, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
    guard fd >= 0 else {
      throw WriteAheadSegment.ioFailure(
        errno, directory: directory, doing: "creating the write-ahead segment")
    }
    let zeros = [UInt8](repeating: 0, count: 1 << 20)
    do {
      var offset = 0
      while offset < WriteAheadSegment.initialSize {
        try WriteAheadSegment.write(fd, zeros, at: offset, directory: directory)
        offset += zeros.count
      }
      try WriteAheadSegment.flush(fd, directory: directory)
    } catch {
      close(fd)
      unlink(temporary)
      throw error
    }
    let session = SegmentSession(
      directory: directory, fd: fd, storeId: storeId, limits: limits)
    _ = try session.checkpoint(
      environment: environment, txn: txn, committedHead: core.head(txn), previous: nil)
    guard rename(temporary, WriteAheadSegment.path(in: directory)) == 0 else {
      throw WriteAheadSegment.ioFailure(
        errno, directory: directory, doing: "renaming the write-ahead segment into place")
    }
    try fsyncDirectory(directory)
    return session
  }

  /// Opens an existing segment (its header must be readable).
  static func open(
    directory: String, storeId: [UInt8], limits: Limits
  ) throws -> (SegmentSession, WriteAheadSegment.Header) {
    let fd = try WriteAheadSegment.open(in: directory, readOnly: false)
    let header: WriteAheadSegment.Header
    do {
      header = try WriteAheadSegment.currentHeader(fd, directory: directory)
    } catch {
      close(fd)
      throw error
    }
    return (
      SegmentSession(
        directory: directory, fd: fd, storeId: storeId, limits: limits), header
    )
  }

  // MARK: - Checkpoints

  /// Makes the committed state durable and the segment's new starting point: flushes the data
  /// file, pins that state (this runs inside a write transaction, so it is exactly the committed
  /// one), copies its meta pages into the other header slot with a new salt and flushes that —
  /// from then on frames of the old cycle no longer chain — and only then lets go of the old pin.
  /// Returns the cursor of the new cycle's first frame and the salt its frames carry.
  @discardableResult
  func checkpoint(
    environment: Environment, txn: Transaction, committedHead: UInt64
  ) throws
    -> (cursor: WriteAheadSegment.Cursor, salt: UInt64)
  {
    let previous = try WriteAheadSegment.currentHeader(fd, directory: directory)
    return try checkpoint(
      environment: environment, txn: txn, committedHead: committedHead, previous: previous)
  }

  private func checkpoint(
    environment: Environment, txn: Transaction, committedHead: UInt64, previous: WriteAheadSegment.Header?
  ) throws -> (cursor: WriteAheadSegment.Cursor, salt: UInt64) {
    try environment.sync()
    CrashPoint.reach(CrashPoint.checkpointSynced)
    let pageSize = try environment.info().pageSize
    let metas = try WriteAheadSegment.readMetas(in: directory, pageSize: pageSize)
    let pin = try environment.pinSnapshot()
    guard WriteAheadSegment.newestTransaction(metas) == pin.transaction else {
      environment.release(pin)
      throw FerryLogError.damagedStore(
        path: directory,
        reason:
          "its newest meta page names transaction \(WriteAheadSegment.newestTransaction(metas)) where LMDB's committed state is \(pin.transaction)"
      )
    }
    var salt: UInt64 = 0
    while salt == 0 { salt = UInt64.random(in: .min ... .max) }
    let header = WriteAheadSegment.Header(
      counter: (previous?.counter ?? 0) &+ 1, salt: salt, checkpointHead: committedHead,
      checkpointTransaction: pin.transaction, storeId: storeId, pageSize: UInt32(pageSize), metas: metas)
    do {
      try WriteAheadSegment.writeHeader(header, to: fd, directory: directory)
    } catch {
      environment.release(pin)
      throw error
    }
    CrashPoint.reach(CrashPoint.checkpointWritten)
    let old = state.withLock { s -> SnapshotPin? in
      defer {
        s.pin = pin
        s.framesSinceCheckpoint = 0
        s.bytesSinceCheckpoint = 0
        s.pagesFreedSinceCheckpoint = 0
        s.freedCountedThrough = pin.transaction
        s.pageSize = pageSize
        s.checkpoints += 1
      }
      return s.pin
    }
    if let old { environment.release(old) }
    return (
      WriteAheadSegment.Cursor(
        counter: header.counter, offset: UInt64(WriteAheadSegment.framesStart), chain: header.seed), salt
    )
  }

  /// A checkpoint in a transaction of its own (after maintenance, at close): commits nothing.
  func checkpointNow(environment: Environment, core: StoreCore) throws {
    try environment.write { txn in
      _ = try checkpoint(environment: environment, txn: txn, committedHead: core.head(txn))
    }
  }

  /// A process that shares the store checkpoints — and so takes its pin — at the start of its
  /// first write transaction, whatever writes (a commit, a catch-up, a rebuild, a compaction):
  /// never before, so that an open or a read never waits for another process's writer lock only
  /// to checkpoint a store it does not write to.
  func checkpointAtFirstWrite(environment: Environment, core: StoreCore) {
    environment.setWriteBegins { [self] txn in
      guard state.withLock({ $0.pin == nil }) else { return }
      _ = try checkpoint(environment: txn.environment, txn: txn, committedHead: core.head(txn))
    }
  }

  /// Whether this process holds a pin: it has checkpointed, and may have written since.
  var holdsPin: Bool { state.withLock { $0.pin != nil } }

  // MARK: - Commits

  /// Where this transaction's frame goes (checkpointing first when this process holds no pin yet
  /// or enough has been written since the last checkpoint), and the salt it carries.
  func beginCommit(
    environment: Environment, txn: Transaction, core: StoreCore
  ) throws
    -> (cursor: WriteAheadSegment.Cursor, salt: UInt64)
  {
    let counted = state.withLock { s in s.pin == nil ? nil : s.freedCountedThrough }
    // Pages freed since the pin are the data file's growth over the flushed path's: no commit
    // reuses them before the next checkpoint, whatever writes them (a commit of many tasks frees
    // many pages, one add a few).
    let freed = try counted.map { try environment.pagesFreed(after: $0) }
    let due = state.withLock { s in
      if let freed, freed.through > s.freedCountedThrough {
        s.pagesFreedSinceCheckpoint += freed.pages
        s.freedCountedThrough = freed.through
      }
      return s.pin == nil || s.framesSinceCheckpoint >= limits.frames
        || s.bytesSinceCheckpoint >= limits.bytes
        || s.pagesFreedSinceCheckpoint * s.pageSize >= limits.freedBytes
    }
    // A new cycle starts at its beginning: nothing to read.
    if due { return try checkpoint(environment: environment, txn: txn, committedHead: core.head(txn)) }
    let header = try WriteAheadSegment.currentHeader(fd, directory: directory)
    // The cursor a committed frame left, when it belongs to the current checkpoint; otherwise no
    // frame has been committed since it (its own transaction may have been aborted), and the
    // cycle starts at the beginning.
    if let stored = try txn.get(core.meta, key: WriteAheadSegment.cursorKey).flatMap(
      WriteAheadSegment.Cursor.init(bytes:)),
      stored.counter == header.counter, stored.offset >= UInt64(WriteAheadSegment.framesStart)
    {
      return (stored, header.salt)
    }
    return (
      WriteAheadSegment.Cursor(
        counter: header.counter, offset: UInt64(WriteAheadSegment.framesStart), chain: header.seed),
      header.salt
    )
  }

  /// Writes the batch's sealed records as one frame at the cursor, records the next cursor in the
  /// transaction and flushes the frame — the one flush the callers wait for — unless `flush` is
  /// false (a claim's frame: the next flushed frame, of any process, carries it to the disk with
  /// it, since a flush of the file covers every write before it). A frame that would run past the
  /// file's end starts a new cycle (a checkpoint of the state before this transaction).
  func writeFrame(
    environment: Environment, txn: Transaction, core: StoreCore,
    begun: (cursor: WriteAheadSegment.Cursor, salt: UInt64),
    first: UInt64, records: [[UInt8]], flush: Bool = true
  ) throws {
    var cursor = begun.cursor
    var salt = begun.salt
    var (bytes, crc) = WriteAheadSegment.frame(
      records: records, first: first, salt: salt, chain: cursor.chain)
    let fileSize = UInt64(state.withLock { $0.fileSize })
    if cursor.offset + UInt64(bytes.count) > fileSize && cursor.offset > UInt64(WriteAheadSegment.framesStart)
    {
      (cursor, salt) = try checkpoint(environment: environment, txn: txn, committedHead: first - 1)
      (bytes, crc) = WriteAheadSegment.frame(records: records, first: first, salt: salt, chain: cursor.chain)
    }
    let next = WriteAheadSegment.Cursor(
      counter: cursor.counter, offset: cursor.offset + UInt64(bytes.count), chain: crc)
    try txn.put(core.meta, key: WriteAheadSegment.cursorKey, value: next.bytes)
    try WriteAheadSegment.write(fd, bytes, at: Int(cursor.offset), directory: directory)
    state.withLock { s in
      s.unconfirmedFrame = cursor.offset
      s.fileSize = max(s.fileSize, Int(next.offset))
    }
    if flush {
      try WriteAheadSegment.flush(fd, directory: directory)
      CrashPoint.reach(CrashPoint.frameFlushed)
    }
    state.withLock { s in
      s.framesSinceCheckpoint += 1
      s.bytesSinceCheckpoint += bytes.count
      s.frames += 1
    }
  }

  /// Flushes every frame written so far, by any process (frames a claim left unflushed).
  func flushFrames() throws {
    try WriteAheadSegment.flush(fd, directory: directory)
  }

  /// The transaction of the last frame committed.
  func confirmFrame() {
    state.withLock { $0.unconfirmedFrame = nil }
  }

  /// The transaction of the last frame did not commit, and its callers are told it failed: the
  /// frame is unmade (its magic zeroed and flushed), so that a power cut before the next frame
  /// overwrites it cannot bring its events back. Best effort: failing here leaves a frame that a
  /// recovery would replay, events whose callers were told of an error.
  func abandonFrame() {
    guard
      let offset = state.withLock({ s -> UInt64? in
        defer { s.unconfirmedFrame = nil }
        return s.unconfirmedFrame
      })
    else { return }
    let zeros = [UInt8](repeating: 0, count: 4)
    try? WriteAheadSegment.write(fd, zeros, at: Int(offset), directory: directory)
    try? WriteAheadSegment.flush(fd, directory: directory)
  }

  /// Lets go of this process's pin (at close, after the last checkpoint).
  func releasePin(_ environment: Environment) {
    if let pin = state.withLock({ s -> SnapshotPin? in
      defer { s.pin = nil }
      return s.pin
    }) {
      environment.release(pin)
    }
  }

  /// Holds `pin` (taken by the open right after LMDB opened the restored checkpoint).
  func adopt(_ pin: SnapshotPin, _ environment: Environment) {
    let old = state.withLock { s -> SnapshotPin? in
      defer { s.pin = pin }
      return s.pin
    }
    if let old { environment.release(old) }
  }

  /// Takes a pin on the committed state without a checkpoint: recovery, which restored the
  /// checkpoint's state before anything was written, holds it while it replays.
  func pinRestoredState(_ environment: Environment) throws {
    adopt(try environment.pinSnapshot(), environment)
  }
}

/// Who else has the store open: every Ferry open holds a shared `fcntl` lock on `ferry-open.lock`
/// for its lifetime; a read-write open that gets the lock exclusively is alone, and only then
/// may it restore a checkpoint, replay the segment, or turn the segment on or off. It keeps the
/// exclusive lock until the store is settled, then shares it (`fcntl` converts atomically).
///
/// An alone open that starts to settle a store with a segment marks the file *unsettled* (its
/// one byte `1`) before it writes anything, and clears the mark (`0`) just before it shares the
/// lock. An open that waited for the lock and finds the mark set got it because the alone open
/// died before the store was settled — its checkpoint restored, its frames perhaps not replayed:
/// a read-write open lets go and tries again (to be alone and settle it), a read-only one
/// refuses with `needsRecovery`.
final class StoreOpenLock: Sendable {
  static let fileName = "ferry-open.lock"
  /// Directories (device:inode) this process holds the lock of: POSIX record locks belong to the
  /// process, so a second open here would share — and on close release — the first one's lock.
  private static let held = Mutex(Set<String>())

  let fd: Int32
  let key: String
  /// Whether no other process had the store open when this one took the lock.
  let isAlone: Bool
  /// Whether this open marked the store unsettled (cleared by ``share()``).
  private let marked = Atomic<Bool>(false)
  /// A read-only open that asked to keep the lock of a store marked unsettled: it reads a
  /// recovered copy, and holds the lock only while it copies the files.
  let isUnsettled: Bool
  /// An open that shares the lock only with opens that have not opened LMDB (a read-write one
  /// after waiting in vain to be alone): it may follow the store only if it needs no recovery.
  let mustFindSettled: Bool

  private init(
    fd: Int32, key: String, isAlone: Bool, isUnsettled: Bool = false, mustFindSettled: Bool = false
  ) {
    self.fd = fd
    self.key = key
    self.isAlone = isAlone
    self.isUnsettled = isUnsettled
    self.mustFindSettled = mustFindSettled
  }

  static func identity(of directory: String) -> String? {
    var info = stat()
    guard stat(directory, &info) == 0 else { return nil }
    return "\(info.st_dev):\(info.st_ino)"
  }

  /// Takes the lock of the store in `directory` (which must exist). Nil when this process holds
  /// it already (the store is open here: opening it again is refused later), or when a read-only
  /// open finds no lock file and cannot make one.
  /// `keepUnsettled` (read-only): a store marked unsettled returns the lock held shared and
  /// marked ``isUnsettled`` instead of failing with `needsRecovery`.
  static func acquire(directory: String, readOnly: Bool, keepUnsettled: Bool = false) throws -> StoreOpenLock?
  {
    guard let key = identity(of: directory) else { return nil }
    let claimed = held.withLock { set -> Bool in
      if set.contains(key) { return false }
      set.insert(key)
      return true
    }
    guard claimed else { return nil }
    let path = directory + "/" + fileName
    let fd = systemOpen(path, (readOnly ? O_RDONLY : O_RDWR | O_CREAT) | O_CLOEXEC | O_NONBLOCK, 0o600)
    guard fd >= 0 else {
      let code = errno
      // Every read-write open makes the file and keeps it open: a read-only open that finds none
      // shares the store with nobody — it is alone (and so checks for a segment to replay).
      if readOnly && code == ENOENT {
        return StoreOpenLock(fd: -1, key: key, isAlone: !lmdbIsOpenElsewhere(directory))
      }
      held.withLock { _ = $0.remove(key) }
      if readOnly { return nil }
      throw WriteAheadSegment.ioFailure(code, directory: directory, doing: "opening \(fileName)")
    }
    var info = stat()
    guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else {
      close(fd)
      held.withLock { _ = $0.remove(key) }
      throw FerryLogError.damagedStore(path: directory, reason: "\(fileName) is not a regular file")
    }
    var alone = false
    var mustFindSettled = false
    let start = ContinuousClock.now
    while true {
      if !readOnly && lock(fd, type: F_WRLCK, wait: false) {
        // Alone by this file, but a process may have the store open under a lock file that was
        // deleted (and this one made anew): LMDB's own lock tells. Such an open shares the store.
        // (A store marked unsettled is settled alone as before: its segment holds commits that
        // reading it as it is would miss.)
        if !isMarkedUnsettled(fd) && lmdbIsOpenElsewhere(directory) {
          _ = lock(fd, type: F_RDLCK, wait: true)
          break
        }
        alone = true
        break
      }
      guard lock(fd, type: F_RDLCK, wait: true) else {
        let code = errno
        close(fd)
        held.withLock { _ = $0.remove(key) }
        throw WriteAheadSegment.ioFailure(code, directory: directory, doing: "locking \(fileName)")
      }
      if isMarkedUnsettled(fd) {
        // The open that was settling the store died: it is for an alone read-write open to
        // settle, never to be read or written as it stands.
        if readOnly && keepUnsettled {
          return StoreOpenLock(fd: fd, key: key, isAlone: false, isUnsettled: true)
        }
        if readOnly || ContinuousClock.now - start > .seconds(30) {
          close(fd)
          held.withLock { _ = $0.remove(key) }
          throw FerryLogError.needsRecovery(path: directory)
        }
        _ = lock(fd, type: F_UNLCK, wait: false)
        usleep(UInt32.random(in: 1_000...20_000))
        continue
      }
      if readOnly {
        var probe = flock()
        probe.l_type = Int16(F_WRLCK)
        probe.l_whence = Int16(SEEK_SET)
        probe.l_start = 0
        probe.l_len = 0
        let lmdbOpen = lmdbIsOpenElsewhere(directory)
        alone = fcntl(fd, F_GETLK, &probe) == 0 && probe.l_type == Int16(F_UNLCK) && !lmdbOpen
        // Shared only with opens that have not opened LMDB (another reader deciding or copying, a
        // read-write open waiting to be alone): nobody settled the store, so it is checked as an
        // alone read-only open checks it — read as it stands, a read-write open would then share it.
        mustFindSettled = !alone && !lmdbOpen && WriteAheadSegment.exists(in: directory)
      } else if WriteAheadSegment.exists(in: directory), !lmdbIsOpenElsewhere(directory) {
        // Shared only with opens that have not opened LMDB: a read-only open deciding whether the
        // store needs recovery, or copying it to read a recovered copy (`one-sync-commit.md` §5).
        // Followed as it stands, a store that needs recovery would be checkpointed over its frames:
        // try again to be alone; past the wait the open must find the store settled.
        if ContinuousClock.now - start < .seconds(30) {
          _ = lock(fd, type: F_UNLCK, wait: false)
          usleep(UInt32.random(in: 1_000...20_000))
          continue
        }
        mustFindSettled = true
      }
      break
    }
    let held = StoreOpenLock(fd: fd, key: key, isAlone: alone, mustFindSettled: mustFindSettled)
    // Alone read-write, an open settles the store whatever the dead open that marked it left —
    // also when that one had already removed the segment (turning it off) and this one marks
    // nothing itself: it clears the mark when it shares the lock, or the mark would stay for good.
    if alone && !readOnly && isMarkedUnsettled(fd) { held.marked.store(true, ordering: .relaxed) }
    return held
  }

  /// Whether another process has the store's LMDB environment open: every LMDB open holds a shared
  /// `fcntl` lock on the first byte of `lock.mdb` for its lifetime (`mdb_env_setup_locks`). Asked
  /// without taking a lock (`F_GETLK`); this process has no environment on the store open here
  /// (``held``), so closing the descriptor drops no lock of its own. Ferry's open lock alone can be
  /// fooled — `ferry-open.lock` deleted under a live app, a new one made by the next open — and
  /// an open that took itself for alone then restored a checkpoint's meta pages under the live
  /// writer (SegmentStoreCommandTests).
  private static func lmdbIsOpenElsewhere(_ directory: String) -> Bool {
    let fd = systemOpen(directory + "/lock.mdb", O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0)
    guard fd >= 0 else { return false }
    defer { close(fd) }
    var probe = flock()
    probe.l_type = Int16(F_WRLCK)
    probe.l_whence = Int16(SEEK_SET)
    probe.l_start = 0
    probe.l_len = 1
    return fcntl(fd, F_GETLK, &probe) == 0 && probe.l_type != Int16(F_UNLCK)
  }

  /// Whether the file's mark says an alone open began to settle the store and has not finished.
  private static func isMarkedUnsettled(_ fd: Int32) -> Bool {
    var byte: UInt8 = 0
    return pread(fd, &byte, 1, 0) == 1 && byte == UInt8(ascii: "1")
  }

  /// Marks the store unsettled (an alone read-write open, before it writes anything to settle it).
  func markUnsettled() throws {
    guard fd >= 0 else { return }
    var byte = UInt8(ascii: "1")
    guard pwrite(fd, &byte, 1, 0) == 1 else {
      throw WriteAheadSegment.ioFailure(errno, directory: key, doing: "marking \(Self.fileName)")
    }
    marked.store(true, ordering: .relaxed)
  }

  private static func lock(_ fd: Int32, type: Int32, wait: Bool) -> Bool {
    var request = flock()
    request.l_type = Int16(type)
    request.l_whence = Int16(SEEK_SET)
    request.l_start = 0
    request.l_len = 0
    while true {
      if fcntl(fd, wait ? F_SETLKW : F_SETLK, &request) == 0 { return true }
      if errno == EINTR { continue }
      return false
    }
  }

  /// Turns an exclusive lock into a shared one (atomically), letting other opens in.
  func share() {
    guard fd >= 0 else { return }
    if marked.exchange(false, ordering: .relaxed) {
      var byte = UInt8(ascii: "0")
      _ = pwrite(fd, &byte, 1, 0)
    }
    _ = Self.lock(fd, type: F_RDLCK, wait: true)
  }

  /// Lets go of the lock (at close).
  func release() {
    if fd >= 0 { close(fd) }
    Self.held.withLock { _ = $0.remove(key) }
  }
}

extension EventLog {
  /// What an open does about the write-ahead segment (`one-sync-commit.md` §4 and §6): alone with
  /// a store that has one, it replays the frames past the restored checkpoint, then keeps the
  /// segment or — not asked for — removes it; alone with one that has none, it creates one when
  /// asked for. An open that shares the store follows it: a segment if the store has one.
  static func settleSegment(
    _ environment: Environment, core: StoreCore, path: String, configuration: Configuration,
    storedFormat: UInt32, isAlone: Bool, recoveryPin: SnapshotPin?, restored: RestoredCheckpoint? = nil
  ) throws -> SegmentSession? {
    let present = WriteAheadSegment.exists(in: path)
    let storeId = try environment.read { try $0.get(core.meta, key: MetaKey.storeId) } ?? HeadMark.creatingId
    let limits = SegmentSession.Limits(configuration)
    guard isAlone else {
      guard present else { return nil }
      let (session, _) = try SegmentSession.open(
        directory: path, storeId: storeId, limits: limits)
      if !environment.isSyncDeferred { try environment.setDeferredSync(true) }
      // A checkpoint, and with it a pin, before this process writes anything unflushed (its own
      // catch-up at open, a rebuild, a compaction — not only frames): the process whose pin keeps
      // the current checkpoint's pages may close or die at any moment, and a pinless write here
      // would then reuse pages a recovery restores. In the first write transaction, not here: an
      // open must not wait for another process's writer lock when it has nothing to write.
      session.checkpointAtFirstWrite(environment: environment, core: core)
      return session
    }
    // Alone: a segment half-made by an open that died (or lost power) while creating it is never
    // used — only a renamed one is — and is removed here, where no other open can be making one.
    unlink(WriteAheadSegment.path(in: path) + ".new")
    if present {
      let (session, header) = try SegmentSession.open(
        directory: path, storeId: storeId, limits: limits)
      if let recoveryPin {
        session.adopt(recoveryPin, environment)
      } else {
        try session.pinRestoredState(environment)
      }
      if header.storeId != storeId && header.storeId != HeadMark.creatingId {
        throw FerryLogError.damagedStore(
          path: path,
          reason: "its write-ahead segment belongs to another store (id \(hexString(header.storeId)))")
      }
      let head = try environment.read { try core.head($0) }
      guard head == header.checkpointHead else {
        throw FerryLogError.damagedStore(
          path: path,
          reason:
            "its log ends at sequence \(head), but the write-ahead segment's checkpoint was taken at \(header.checkpointHead)"
        )
      }
      // The scan made before LMDB mapped the file, when it was of this header (it always is when
      // this open restored the checkpoint; read again otherwise).
      let scan =
        try restored.flatMap { $0.header == header ? $0.scan : nil }
        ?? WriteAheadSegment.scan(session.fd, header: header)
      try replaySegment(scan.records, core: core, environment: environment)
      if configuration.writeAheadSegment { return session }
      // Turned off: the replayed state made durable, then the segment removed, then the format.
      try environment.sync()
      guard unlink(WriteAheadSegment.path(in: path)) == 0 || errno == ENOENT else {
        throw WriteAheadSegment.ioFailure(errno, directory: path, doing: "removing the write-ahead segment")
      }
      try fsyncDirectory(path)
      session.releasePin(environment)
      try environment.setDeferredSync(false)
      try environment.write { txn in
        try txn.put(core.meta, key: MetaKey.format, value: storeFormatVersion.bigEndianBytes)
      }
      return nil
    }
    if let recoveryPin { environment.release(recoveryPin) }
    if configuration.writeAheadSegment {
      // Turned on: the format first (flushed, as every commit so far), so that no code that
      // ignores the segment ever writes beside it; then the segment.
      var raised = false
      do {
        try environment.write { txn in
          try txn.put(core.meta, key: MetaKey.format, value: segmentFormatVersion.bigEndianBytes)
        }
        raised = true
        let session = try environment.write { txn in
          try SegmentSession.create(
            environment: environment, txn: txn, core: core, directory: path, storeId: storeId,
            limits: limits)
        }
        try environment.setDeferredSync(true)
        return session
      } catch let error where isOutOfSpace(error) {
        // No room for the segment's preallocated file (a full disk or quota): this open commits
        // flushed, as a store without the segment does, rather than leave the store unopenable
        // on a disk the flushed commits still fit; the next open alone tries again.
        unlink(WriteAheadSegment.path(in: path) + ".new")
        if raised {
          try environment.write { txn in
            try txn.put(core.meta, key: MetaKey.format, value: storeFormatVersion.bigEndianBytes)
          }
        }
        return nil
      }
    }
    if storedFormat == segmentFormatVersion {
      // A segment being turned on when its process died: the store never used it.
      try environment.write { txn in
        try txn.put(core.meta, key: MetaKey.format, value: storeFormatVersion.bigEndianBytes)
      }
    }
    return nil
  }

  /// Whether `error` says the disk, or the user's quota, is full.
  static func isOutOfSpace(_ error: any Error) -> Bool {
    switch error {
    case FerryLogError.diskFull, FerryLogError.quotaExceeded: return true
    case let error as LMDBError: return error.code == ENOSPC || error.code == EDQUOT
    default: return false
    }
  }

  /// Puts the records of the frames past the checkpoint back into the log, in transactions of
  /// 10,000 (the projections are caught up by the open's usual catch-up after). Each record is
  /// checked first; the frames' chain already vouched for their bytes.
  static func replaySegment(
    _ records: [(sequence: UInt64, bytes: [UInt8])], core: StoreCore, environment: Environment
  ) throws {
    var index = 0
    while index < records.count {
      let chunk = records[index..<min(index + 10_000, records.count)]
      try environment.write { txn in
        for (sequence, bytes) in chunk {
          _ = try EventRecord.decode(bytes, sequence: sequence)
          try txn.put(core.events, key: sequence.bigEndianBytes, value: bytes, flags: .append)
        }
      }
      CrashPoint.reach(CrashPoint.segmentReplay)
      index += chunk.count
    }
  }
}
