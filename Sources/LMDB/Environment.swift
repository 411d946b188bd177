import CFerryLMDB
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// An open LMDB environment: one directory holding `data.mdb` and `lock.mdb`.
///
/// Work happens in closure-scoped transactions that are finished exactly once when the closure
/// returns (committed) or throws (aborted). A closure is synchronous, so a transaction can never
/// cross an `await`.
///
/// ```swift
/// let env = try Environment.open(path: dir, databases: ["items"])
/// let items = try env.database("items")
/// try env.write { txn in try txn.put(items, key: [1], value: [42]) }
/// let value = try env.read { txn in try txn.get(items, key: [1]) }
/// ```
///
/// The map starts small and grows by itself: when a write transaction fills it (`MDB_MAP_FULL`),
/// the transaction is aborted, the map doubled and the whole closure run again — so a write
/// closure must be safe to run more than once. When another process has grown the map
/// (`MDB_MAP_RESIZED`), the new size is adopted and the transaction begun again.
public final class Environment: @unchecked Sendable {
  // Why @unchecked: LMDB documents an MDB_env as usable from many threads at once. It is opened
  // with MDB_NOTLS, so a read transaction is not tied to its thread's slot; a write transaction is
  // begun, used and finished inside one synchronous closure, hence on one thread. Growing the map
  // (which needs no other transaction open in this process) holds `resizeLock` exclusively while
  // every transaction holds it shared. The remaining mutable state lives in `state`, a Mutex.

  /// Options for opening an environment.
  public struct Options: Sendable {
    /// Open read-only: no write transaction can be begun, nothing on disk is changed.
    public var readOnly: Bool = false
    /// Create the directory (mode 0700, its parent must exist) when it is missing.
    public var createIfMissing: Bool = true
    /// The map size of a new environment, in bytes; an existing one keeps its stored size.
    public var initialMapSize: Int = 1 << 20
    /// The map never grows beyond this many bytes; past it a write fails with ``LMDBError/mapFull``.
    public var maxMapSize: Int = 1 << 40
    /// Most named databases the environment may hold.
    public var maxDatabases: UInt32 = 128
    /// Most concurrent read transactions across all processes.
    public var maxReaders: UInt32 = 126
    /// Whether commits are flushed to disk before they return.
    public var durability: Durability = .durable
    /// Check the data file's meta pages and length before LMDB maps it (``DataFileCheck``), and
    /// refuse a damaged one with `MDB_CORRUPTED` naming the problem. Turn off only to read a
    /// damaged store for salvage, read-only.
    public var checkDataFile: Bool = true
    /// Accept an existing zero-length data file as a new environment (what a creation killed
    /// before LMDB wrote its meta pages leaves). Off: an empty data file is damage.
    public var acceptEmptyDataFile: Bool = false
    /// Tests only: the LMDB version the open checks in place of the linked one, to show its
    /// refusal of another layout without building another LMDB (`LMDBVersion.isSupported`).
    package var lmdbVersionInPlaceOfLinked: LMDBVersion?

    /// The default options: read-write, create if missing, a 1 MiB map that grows, durable commits.
    public init() {}
  }

  /// How commits reach the disk.
  public enum Durability: Sendable, Equatable {
    /// Every commit is flushed (`fsync`) before it returns. The only mode for data a user was told is saved.
    case durable
    /// Commits are not flushed (`MDB_NOSYNC`): for throw-away scratch areas only, such as a rebuild
    /// that is compared and then deleted.
    case scratch
    /// Commits are not flushed (`MDB_NOSYNC`); their durability is the caller's, who makes what it
    /// acknowledges durable elsewhere first and calls ``Environment/sync()`` at its checkpoints —
    /// Ferry's write-ahead segment (`Specs/one-sync-commit.md`). Switched at run time with
    /// ``Environment/setDeferredSync(_:)``.
    case deferred
  }

  /// Live counters of an environment, for tests and benchmarks.
  public struct Counters: Sendable, Equatable {
    /// Write transactions committed.
    public var commits: Int = 0
    /// Write transactions aborted (including the ones retried after growing the map).
    public var aborts: Int = 0
    /// Times the map was grown by this process.
    public var mapGrowths: Int = 0
    /// Times a larger map set by another process was adopted.
    public var mapAdoptions: Int = 0
  }

  struct State {
    var isClosed = false
    var mapSize: Int
    var databases: [String: Database]
    var counters = Counters()
    var deferredSync = false
    var pins: [SnapshotPin] = []
    var writeBegins: (@Sendable (Transaction) throws -> Void)?
  }

  let env: OpaquePointer
  /// The environment's directory.
  public let path: String
  /// The options it was opened with.
  public let options: Options
  /// Whether this call created the directory (a brand-new environment).
  public let wasCreated: Bool
  /// The longest key LMDB accepts (`mdb_env_get_maxkeysize`), in bytes.
  public let maxKeySize: Int
  /// Stale reader slots cleared by `mdb_reader_check` at open.
  public let staleReadersCleared: Int

  let resizeLock: ReadWriteLock
  let state: Mutex<State>
  /// Serialises `mdb_dbi_open`, which LMDB forbids from concurrent transactions.
  let databaseOpening = Mutex(())
  /// The thread holding this environment's write transaction, to refuse a nested write (which
  /// would wait forever on LMDB's writer lock held by that same thread).
  let writingThread = Mutex<ThreadIdentity?>(nil)
  /// The directory's device and inode, registered in `openInProcess` while open.
  let identity: DirectoryIdentity

  /// A directory's device and inode number: its identity whatever path names it.
  struct DirectoryIdentity: Hashable, Sendable {
    let device: UInt64
    let inode: UInt64
  }

  /// Environments open in this process. LMDB's locks are per process: opening the same one twice
  /// and closing either copy would silently release the other's locks, so a second open is refused.
  static let openInProcess = Mutex(Set<DirectoryIdentity>())

  /// Opens (and, unless read-only, creates) the environment at `path`, then opens every named
  /// database in `databases` in one committed transaction.
  ///
  /// Errors: ``LMDBError/versionMismatch`` when the LMDB linked is not one whose pages Ferry reads
  /// (`LMDBVersion.isSupported`), ``LMDBError/noSuchFile`` for a missing directory (or its parent),
  /// ``LMDBError/notADirectory``, ``LMDBError/permissionDenied``, ``LMDBError/invalid`` for a file
  /// that is not LMDB's, ``LMDBError/notFound`` for a database missing from a read-only environment.
  public static func open(
    path: String, options: Options = Options(), databases: [String] = []
  ) throws -> Environment {
    // First: every check below, and Ferry's reads of the file after, assume LMDB 0.9's pages.
    try LMDBVersion.requireSupported(options.lmdbVersionInPlaceOfLinked ?? .linked)
    var created = false
    var info = stat()
    if stat(path, &info) == 0 {
      if (info.st_mode & S_IFMT) != S_IFDIR {
        throw LMDBError(code: ENOTDIR, message: "\(path) exists and is not a directory")
      }
    } else if errno == ENOENT {
      guard options.createIfMissing && !options.readOnly else {
        throw LMDBError(code: ENOENT, message: "no directory at \(path)")
      }
      if mkdir(path, 0o700) != 0 {
        let code = errno
        throw LMDBError(code: code, operation: "creating directory \(path)")
      }
      created = true
    } else {
      let code = errno
      throw LMDBError(code: code, operation: "reading \(path)")
    }

    guard stat(path, &info) == 0 else {
      let code = errno
      throw LMDBError(code: code, operation: "reading \(path)")
    }
    // `st_dev` is a signed 32-bit number on Apple platforms: a negative one must not trap.
    let identity = DirectoryIdentity(
      device: UInt64(truncatingIfNeeded: info.st_dev), inode: UInt64(truncatingIfNeeded: info.st_ino))
    let registered = openInProcess.withLock { $0.insert(identity).inserted }
    guard registered else {
      throw LMDBError(
        code: EBUSY,
        message:
          "the environment at \(path) is already open in this process; close it before opening it again")
    }
    var keepRegistration = false
    defer { if !keepRegistration { _ = openInProcess.withLock { $0.remove(identity) } } }

    var envPointer: OpaquePointer?
    try check(mdb_env_create(&envPointer), "mdb_env_create")
    guard let env = envPointer else {
      throw LMDBError(code: ENOMEM, message: "mdb_env_create returned no environment")
    }
    do {
      try check(mdb_env_set_maxdbs(env, MDB_dbi(options.maxDatabases)), "mdb_env_set_maxdbs")
      try check(mdb_env_set_maxreaders(env, options.maxReaders), "mdb_env_set_maxreaders")
      let dataFileExists = access(path + "/data.mdb", F_OK) == 0
      if dataFileExists && options.checkDataFile {
        // Another process committing while the two meta pages are read can make them look out of
        // step for a moment; damage stays. Judged on a few reads.
        var check = try DataFileCheck.read(path + "/data.mdb")
        for _ in 0..<4 where check.problem != nil && check.fileSize > 0 {
          usleep(2_000)
          check = try DataFileCheck.read(path + "/data.mdb")
        }
        if check.fileSize > 0 && !check.isLMDB && check.metas[0] != nil {
          throw LMDBError(code: MDB_INVALID, message: "data.mdb does not start with LMDB's meta page")
        }
        if !(check.fileSize == 0 && options.acceptEmptyDataFile && !options.readOnly),
          let problem = check.problem
        {
          throw LMDBError(code: MDB_CORRUPTED, message: problem)
        }
      }
      if !options.checkDataFile && !options.readOnly {
        throw LMDBError(code: EINVAL, message: "a data file is opened without its checks only read-only")
      }
      if !dataFileExists {
        // An existing environment keeps the size stored in its file; a new one starts small.
        try check(mdb_env_set_mapsize(env, options.initialMapSize), "mdb_env_set_mapsize")
      }
      var flags = UInt32(MDB_NOTLS)
      if options.readOnly { flags |= UInt32(MDB_RDONLY) }
      if options.durability != .durable { flags |= UInt32(MDB_NOSYNC) }
      try check(mdb_env_open(env, path, flags, 0o600), "opening LMDB environment at \(path)")
      if created || !dataFileExists {
        // Make the new directory entry and the new files durable before anything is acknowledged.
        try fsyncDirectory(path)
        try fsyncDirectory(parentDirectory(of: path))
      }
    } catch {
      mdb_env_close(env)
      throw error
    }

    var cleared: Int32 = 0
    mdb_reader_check(env, &cleared)
    var envInfo = MDB_envinfo()
    mdb_env_info(env, &envInfo)
    let resizeLock: ReadWriteLock
    do { resizeLock = try ReadWriteLock() } catch {
      mdb_env_close(env)
      throw error
    }
    let environment = Environment(
      env: env, path: path, options: options, created: created, identity: identity, resizeLock: resizeLock,
      maxKeySize: Int(mdb_env_get_maxkeysize(env)), staleReadersCleared: Int(cleared),
      mapSize: envInfo.me_mapsize)
    keepRegistration = true
    if options.checkDataFile {
      // With the newest state pinned by a read transaction (no page of it can be reused meanwhile),
      // LMDB's free-page list is checked against the live trees, read from a read-only map of the
      // file: a damaged list would make the next write overwrite pages in use.
      do {
        let problem = try environment.read { txn in
          try DataFileCheck.freeListProblem(path + "/data.mdb", transaction: UInt64(mdb_txn_id(txn.txn)))
        }
        if let problem { throw LMDBError(code: MDB_CORRUPTED, message: problem) }
      } catch {
        environment.close()
        throw error
      }
    }
    try environment.openDatabases(databases)
    return environment
  }

  private init(
    env: OpaquePointer, path: String, options: Options, created: Bool, identity: DirectoryIdentity,
    resizeLock: ReadWriteLock, maxKeySize: Int, staleReadersCleared: Int, mapSize: Int
  ) {
    self.env = env
    self.resizeLock = resizeLock
    self.identity = identity
    self.path = path
    self.options = options
    self.wasCreated = created
    self.maxKeySize = maxKeySize
    self.staleReadersCleared = staleReadersCleared
    self.state = Mutex(State(mapSize: mapSize, databases: [:], deferredSync: options.durability != .durable))
  }

  deinit {
    close()
  }

  /// Closes the environment, waiting for transactions of this process to end. Later calls throw
  /// ``LMDBError/badTransaction``. Closing twice is harmless.
  ///
  /// Close before opening the same directory again in this process: LMDB's locks are per process.
  public func close() {
    resizeLock.lockExclusive()
    defer { resizeLock.unlockExclusive() }
    let wasOpen = state.withLock { s in
      defer { s.isClosed = true }
      return !s.isClosed
    }
    if wasOpen {
      for pin in state.withLock({ $0.pins }) { pin.end() }
      state.withLock { $0.pins = [] }
      mdb_env_close(env)
      _ = Environment.openInProcess.withLock { $0.remove(identity) }
    }
  }

  /// Whether ``close()`` was called.
  public var isClosed: Bool { state.withLock { $0.isClosed } }

  private func ensureOpen() throws {
    if state.withLock({ $0.isClosed }) {
      throw LMDBError(code: MDB_BAD_TXN, message: "the environment at \(path) is closed")
    }
  }

  /// Opens the named databases in one committed transaction, creating missing ones unless the
  /// environment is read-only or `create` is false. Names already open are skipped.
  ///
  /// `then`, when given, runs inside that same transaction with every handle asked for, so that a
  /// new store's databases and its first records are committed together.
  public func openDatabases(
    _ names: [String], create: Bool = true, then: ((Transaction, [String: Database]) throws -> Void)? = nil
  ) throws {
    let known = state.withLock { s in s.databases }
    let missing = names.filter { known[$0] == nil }
    if missing.isEmpty && then == nil { return }
    let creating = create && !options.readOnly
    var opened: [String: Database] = [:]
    let body: (Transaction) throws -> Void = { txn in
      opened = [:]
      for name in missing {
        var dbi: MDB_dbi = 0
        let rc = mdb_dbi_open(txn.txn, name, creating ? UInt32(MDB_CREATE) : 0, &dbi)
        if rc == MDB_NOTFOUND {
          throw LMDBError(code: MDB_NOTFOUND, message: "database '\(name)' does not exist in \(self.path)")
        }
        try txn.check(rc, "opening database '\(name)'")
        opened[name] = Database(dbi: dbi, name: name)
      }
      if let then {
        var all: [String: Database] = [:]
        for name in names { all[name] = opened[name] ?? known[name] }
        try then(txn, all)
      }
    }
    try databaseOpening.withLock { _ in
      if creating || (then != nil && !options.readOnly) {
        try write(body)
      } else {
        // A read-only transaction is committed (not aborted) so that its handles stay open.
        try read(commitWhenDone: true, body)
      }
    }
    state.withLock { s in s.databases.merge(opened) { old, _ in old } }
  }

  /// The names of every named database in the environment (the keys of LMDB's main database).
  public func namedDatabases() throws -> [String] {
    try read { txn in
      var dbi: MDB_dbi = 0
      try txn.check(mdb_dbi_open(txn.txn, nil, 0, &dbi), "opening the main database")
      let main = Database(dbi: dbi, name: "(main)")
      var names: [String] = []
      try txn.withCursor(main) { cursor in
        try cursor.scan(from: nil) { key, _ in
          names.append(String(decoding: key, as: UTF8.self))
          return true
        }
      }
      return names
    }
  }

  /// The handle of a database opened earlier; ``LMDBError/badDatabase`` if it was never opened.
  public func database(_ name: String) throws -> Database {
    guard let db = state.withLock({ $0.databases[name] }) else {
      throw LMDBError(code: MDB_BAD_DBI, message: "database '\(name)' was not opened in \(path)")
    }
    return db
  }

  /// The names of the databases opened so far.
  public var openDatabaseNames: [String] { state.withLock { Array($0.databases.keys).sorted() } }

  /// Runs `body` in a write transaction and commits it; aborts it if `body` throws.
  ///
  /// `body` may run more than once: when the map fills, the transaction is aborted, the map
  /// grown and `body` run again from the start. It must not have effects outside the transaction
  /// that a second run would repeat.
  @discardableResult
  public func write<R>(_ body: (Transaction) throws -> R) throws -> R {
    if options.readOnly {
      throw LMDBError(code: EACCES, message: "the environment at \(path) is open read-only")
    }
    let me = ThreadIdentity.current
    if writingThread.withLock({ $0 }) == me {
      throw LMDBError(
        code: MDB_BAD_TXN,
        message: "a write transaction was begun inside another on the same thread (it would wait forever)")
    }
    try growAheadIfNeeded()
    // Each begin counts its own adoptions; the retries after a full map are bounded by the map's
    // growth, which stops at maxMapSize.
    while true {
      let pointer = try beginHoldingResizeLock(flags: 0, kind: "write")
      writingThread.withLock { $0 = me }
      let txn = Transaction(txn: pointer, environment: self, readOnly: false)
      do {
        if let begins = state.withLock({ $0.writeBegins }) { try begins(txn) }
        let result = try body(txn)
        try txn.commit()
        writingThread.withLock { $0 = nil }
        defer { resizeLock.unlockShared() }
        try flushDriveCache()
        state.withLock { $0.counters.commits += 1 }
        return result
      } catch {
        txn.abortIfOpen()
        writingThread.withLock { $0 = nil }
        resizeLock.unlockShared()
        state.withLock { $0.counters.aborts += 1 }
        if txn.hitMapFull {
          try grow()
          continue
        }
        throw error
      }
    }
  }

  /// On Apple platforms `fsync` (what LMDB calls) leaves data in the drive's cache; only
  /// `F_FULLFSYNC` reaches the medium, so a durable commit asks for it before returning.
  private func flushDriveCache() throws {
    #if canImport(Darwin)
      guard options.durability == .durable else { return }
      var fd: mdb_filehandle_t = -1
      if mdb_env_get_fd(env, &fd) == MDB_SUCCESS && fd >= 0 && fcntl(fd, F_FULLFSYNC) != 0 {
        let code = errno
        throw LMDBError(code: code, operation: "F_FULLFSYNC after a commit")
      }
    #endif
  }

  /// Grows the map before a write once it is three-quarters used, so that writes rarely fill it
  /// (a full map costs an aborted transaction, and growing must wait for every reader to finish).
  private func growAheadIfNeeded() throws {
    guard resizeLock.sharedDepth == 0 else { return }
    let (used, size) = try withOpenEnvironment { () -> (Int, Int) in
      var info = MDB_envinfo()
      mdb_env_info(env, &info)
      var stat = MDB_stat()
      mdb_env_stat(env, &stat)
      return ((info.me_last_pgno + 1) * Int(stat.ms_psize), info.me_mapsize)
    }
    if used > size / 4 * 3 && size < options.maxMapSize { try grow() }
  }

  /// Runs `body` in a read-only transaction (a consistent snapshot), then ends it.
  ///
  /// Keep read transactions short: a long one keeps old pages alive and makes the file grow
  /// while another transaction writes. Scan large ranges in chunks.
  @discardableResult
  public func read<R>(_ body: (Transaction) throws -> R) throws -> R {
    try read(commitWhenDone: false, body)
  }

  @discardableResult
  private func read<R>(commitWhenDone: Bool, _ body: (Transaction) throws -> R) throws -> R {
    let pointer = try beginHoldingResizeLock(flags: UInt32(MDB_RDONLY), kind: "read")
    let txn = Transaction(txn: pointer, environment: self, readOnly: true)
    defer {
      txn.abortIfOpen()
      resizeLock.unlockShared()
    }
    let result = try body(txn)
    if commitWhenDone { try txn.commit() }
    return result
  }

  /// Begins a transaction with the resize lock held shared, adopting another process's larger map
  /// first when LMDB asks; on return the caller owns the lock and the transaction.
  private func beginHoldingResizeLock(flags: UInt32, kind: String) throws -> OpaquePointer {
    var adoptions = 0
    while true {
      resizeLock.lockShared()
      do { try ensureOpen() } catch {
        resizeLock.unlockShared()
        throw error
      }
      var txnPointer: OpaquePointer?
      let rc = mdb_txn_begin(env, nil, flags, &txnPointer)
      if rc == MDB_MAP_RESIZED {
        resizeLock.unlockShared()
        try adoptMapSize(attempt: &adoptions)
        continue
      }
      guard rc == MDB_SUCCESS, let pointer = txnPointer else {
        resizeLock.unlockShared()
        throw LMDBError(code: rc, operation: "beginning a \(kind) transaction")
      }
      return pointer
    }
  }

  /// The current map size in bytes.
  public var mapSize: Int { state.withLock { $0.mapSize } }

  /// Whether the calling thread holds a transaction of this environment open (a read inside a
  /// read). Such a thread must not wait for another thread's write: that write may have to grow
  /// the map or adopt another process's map size, which waits until every transaction of this
  /// process has ended — its own included.
  public var callingThreadHoldsTransaction: Bool { resizeLock.sharedDepth > 0 }

  /// Counters of commits, aborts and map growth since open.
  public var counters: Counters { state.withLock { $0.counters } }

  /// What `mdb_env_info` and `mdb_env_stat` report about the environment.
  public struct Info: Sendable, Equatable {
    /// The map size in bytes.
    public var mapSize: Int
    /// The last page number in use.
    public var lastPage: Int
    /// The page size in bytes.
    public var pageSize: Int
    /// Reader slots in use.
    public var readers: Int
    /// Reader slots available.
    public var maxReaders: Int
    /// The id of the last committed transaction: it changes with every commit, by any process.
    public var lastTransaction: Int = 0
    /// Bytes of the map in use: `(lastPage + 1) * pageSize`.
    public var usedBytes: Int { (lastPage + 1) * pageSize }
  }

  /// Runs `body` while the environment is open and cannot be closed or resized under it.
  private func withOpenEnvironment<R>(_ body: () throws -> R) throws -> R {
    resizeLock.lockShared()
    defer { resizeLock.unlockShared() }
    try ensureOpen()
    return try body()
  }

  /// Map size, pages in use, page size and readers.
  public func info() throws -> Info {
    try withOpenEnvironment {
      var info = MDB_envinfo()
      mdb_env_info(env, &info)
      var stat = MDB_stat()
      mdb_env_stat(env, &stat)
      return Info(
        mapSize: info.me_mapsize, lastPage: info.me_last_pgno, pageSize: Int(stat.ms_psize),
        readers: Int(info.me_numreaders), maxReaders: Int(info.me_maxreaders),
        lastTransaction: info.me_last_txnid)
    }
  }

  /// Clears reader slots left by processes that died (`mdb_reader_check`); returns how many.
  @discardableResult
  public func readerCheck() throws -> Int {
    try withOpenEnvironment {
      var dead: Int32 = 0
      try check(mdb_reader_check(env, &dead), "mdb_reader_check")
      return Int(dead)
    }
  }

  /// Flushes the data file to disk (`mdb_env_sync(force: 1)`; on Apple platforms then
  /// `F_FULLFSYNC`, which reaches the medium where `fsync` stops at the drive's cache).
  public func sync() throws {
    try withOpenEnvironment {
      try check(mdb_env_sync(env, 1), "mdb_env_sync")
      #if canImport(Darwin)
        var fd: mdb_filehandle_t = -1
        if mdb_env_get_fd(env, &fd) == MDB_SUCCESS && fd >= 0 && fcntl(fd, F_FULLFSYNC) != 0 {
          let code = errno
          throw LMDBError(code: code, operation: "F_FULLFSYNC of the data file")
        }
      #endif
    }
  }

  /// Whether commits are flushed (false) or left to ``sync()`` (true): `MDB_NOSYNC` switched on or
  /// off for this process's later commits. Call it with no write transaction under way.
  public func setDeferredSync(_ deferred: Bool) throws {
    try withOpenEnvironment {
      try check(mdb_env_set_flags(env, UInt32(MDB_NOSYNC), deferred ? 1 : 0), "mdb_env_set_flags")
      state.withLock { $0.deferredSync = deferred }
    }
  }

  /// Runs `begins` at the start of every later write transaction of this environment (each run
  /// of it, see ``write(_:)``), before its body: a caller that must do something in the first
  /// transaction that writes — and only if one ever comes — does it there. Nil removes it.
  public func setWriteBegins(_ begins: (@Sendable (Transaction) throws -> Void)?) {
    state.withLock { $0.writeBegins = begins }
  }

  /// Whether commits are currently left unflushed (``setDeferredSync(_:)``, or a `.scratch` or
  /// `.deferred` open).
  public var isSyncDeferred: Bool { state.withLock { $0.deferredSync } }

  /// Holds the newest committed state with a read transaction that reads nothing, so that LMDB
  /// reuses none of its pages — in any process — until ``release(_:)``. Begun inside a
  /// write transaction of this process, it holds exactly the state that transaction started
  /// from. It takes no part in this process's resize lock: the map may grow while it is held.
  public func pinSnapshot() throws -> SnapshotPin {
    try withOpenEnvironment {
      var pointer: OpaquePointer?
      let rc = mdb_txn_begin(env, nil, UInt32(MDB_RDONLY), &pointer)
      guard rc == MDB_SUCCESS, let pointer else {
        throw LMDBError(code: rc, operation: "pinning the newest snapshot")
      }
      let pin = SnapshotPin(txn: pointer, transaction: UInt64(mdb_txn_id(pointer)))
      state.withLock { $0.pins.append(pin) }
      return pin
    }
  }

  /// Ends a pin (see ``pinSnapshot()``); harmless twice. Pins still held are released by ``close()``.
  public func release(_ pin: SnapshotPin) {
    pin.end()
    state.withLock { $0.pins.removeAll { $0 === pin } }
  }

  /// The pages freed by the committed transactions after `transaction`, in any process, and the
  /// last such transaction: the free-page database's records keyed above it. While a snapshot at
  /// or before `transaction` is pinned, these are exactly the pages LMDB may not reuse yet. Reads
  /// the records' sizes only (a record is a count word and one word a page).
  public func pagesFreed(after transaction: UInt64) throws -> (pages: Int, through: UInt64) {
    try withOpenEnvironment {
      var pointer: OpaquePointer?
      try check(mdb_txn_begin(env, nil, UInt32(MDB_RDONLY), &pointer), "reading the free-page list")
      guard let txn = pointer else { return (0, transaction) }
      defer { mdb_txn_abort(txn) }
      var cursor: OpaquePointer?
      // Database 0 is LMDB's free-page database; its cursor is open to read transactions only.
      try check(mdb_cursor_open(txn, 0, &cursor), "reading the free-page list")
      defer { mdb_cursor_close(cursor) }
      var start = Int(clamping: transaction &+ 1)
      var pages = 0
      var through = transaction
      try withUnsafeMutableBytes(of: &start) { startBytes in
        var key = MDB_val(mv_size: startBytes.count, mv_data: startBytes.baseAddress)
        var value = MDB_val()
        var rc = mdb_cursor_get(cursor, &key, &value, MDB_SET_RANGE)
        while rc == MDB_SUCCESS {
          guard key.mv_size == MemoryLayout<Int>.size, let raw = key.mv_data else { break }
          let id = UInt64(raw.loadUnaligned(as: UInt.self))
          if id > transaction {
            pages += max(0, value.mv_size / MemoryLayout<Int>.size - 1)
            through = max(through, id)
          }
          rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT)
        }
        if rc != MDB_NOTFOUND && rc != MDB_SUCCESS { try check(rc, "reading the free-page list") }
      }
      return (pages, through)
    }
  }

  /// Writes a copy of the environment into the existing, empty directory `path`,
  /// compacting it (omitting free pages) when asked (`mdb_env_copy2`).
  public func copy(to path: String, compact: Bool) throws {
    try withOpenEnvironment {
      try check(
        mdb_env_copy2(env, path, compact ? UInt32(MDB_CP_COMPACT) : 0), "copying environment to \(path)")
    }
  }

  /// Doubles the map (up to `maxMapSize`). Waits until no transaction of this process is open.
  private func grow() throws {
    if resizeLock.sharedDepth > 0 {
      throw LMDBError(
        code: MDB_MAP_FULL,
        message: "the map of \(path) is full and cannot grow while this thread holds another transaction open"
      )
    }
    resizeLock.lockExclusive()
    defer { resizeLock.unlockExclusive() }
    try ensureOpen()
    var info = MDB_envinfo()
    mdb_env_info(env, &info)
    let current = info.me_mapsize
    guard current < options.maxMapSize else {
      throw LMDBError(
        code: MDB_MAP_FULL,
        message: "the map of \(path) is full at its maximum size of \(options.maxMapSize) bytes")
    }
    let next = min(max(current * 2, current + (1 << 20)), options.maxMapSize)
    try check(mdb_env_set_mapsize(env, next), "growing the map to \(next) bytes")
    state.withLock {
      $0.mapSize = next
      $0.counters.mapGrowths += 1
    }
  }

  /// Adopts the larger map size another process has set (`mdb_env_set_mapsize(env, 0)`).
  /// Bounded: a map that still does not hold the newest meta page's pages after
  /// ``maxMapAdoptions`` tries is a damaged meta page (its last page lies beyond any map LMDB can
  /// set), not another process growing the file.
  private func adoptMapSize(attempt: inout Int) throws {
    attempt += 1
    if attempt > Self.maxMapAdoptions {
      throw LMDBError(
        code: MDB_CORRUPTED,
        message:
          "its newest meta page names pages beyond the map even after adopting the map size \(Self.maxMapAdoptions) times"
      )
    }
    try adoptMapSize()
  }

  /// How many times in a row a transaction adopts a map size before the file is judged damaged.
  static let maxMapAdoptions = 8

  private func adoptMapSize() throws {
    if resizeLock.sharedDepth > 0 {
      throw LMDBError(
        code: MDB_MAP_RESIZED,
        message: "another process grew the map of \(path); finish this thread's open transaction to adopt it")
    }
    resizeLock.lockExclusive()
    defer { resizeLock.unlockExclusive() }
    try ensureOpen()
    try check(mdb_env_set_mapsize(env, 0), "adopting the map size set by another process")
    var info = MDB_envinfo()
    mdb_env_info(env, &info)
    state.withLock {
      $0.mapSize = info.me_mapsize
      $0.counters.mapAdoptions += 1
    }
  }
}

/// A read transaction held only to keep one committed state's pages from being reused
/// (``Environment/pinSnapshot()``).
public final class SnapshotPin: Sendable {
  /// The transaction id of the pinned state.
  public let transaction: UInt64
  /// The transaction's address (an `MDB_txn *`), 0 once ended.
  private let txn: Atomic<UInt>

  init(txn: OpaquePointer, transaction: UInt64) {
    self.txn = Atomic(UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(txn))))
    self.transaction = transaction
  }

  /// Aborts the read transaction (once); false when it had already ended.
  @discardableResult
  func end() -> Bool {
    let address = txn.exchange(0, ordering: .acquiringAndReleasing)
    guard address != 0, let pointer = OpaquePointer(bitPattern: address) else { return false }
    mdb_txn_abort(pointer)
    return true
  }
}

func parentDirectory(of path: String) -> String {
  var trimmed = Substring(path)
  while trimmed.count > 1 && trimmed.hasSuffix("/") { trimmed = trimmed.dropLast() }
  guard let slash = trimmed.lastIndex(of: "/") else { return "." }
  if slash == trimmed.startIndex { return "/" }
  return String(trimmed[..<slash])
}

/// Flushes a directory's entries (a file created, renamed or removed in it): `fsync`, and
/// `F_FULLFSYNC` on Apple platforms (``DiskFlush``). Throws ``LMDBError`` with the OS error.
package func fsyncDirectory(_ path: String) throws {
  if let code = DiskFlush.flushDirectory(path) {
    throw LMDBError(code: code, operation: "fsync of directory \(path)")
  }
}
