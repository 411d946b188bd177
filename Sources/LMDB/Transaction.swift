import CFerryLMDB

/// A read or write transaction, valid only inside the closure given to ``Environment/read(_:)``
/// or ``Environment/write(_:)``.
///
/// The environment finishes it exactly once, when the closure ends; a reference kept past that
/// point is inert and every call on it throws ``LMDBError/badTransaction``. It is not `Sendable`:
/// it stays on the thread that runs the closure.
public final class Transaction {
  let txn: OpaquePointer
  /// The environment the transaction belongs to.
  public unowned let environment: Environment
  /// Whether this is a read-only transaction.
  public let isReadOnly: Bool
  @exclusivity(unchecked) private(set) var isFinished = false
  /// Set when an operation failed with `MDB_MAP_FULL`, so the environment grows the map and retries
  /// even if the caller's code wrapped or swallowed the error.
  @exclusivity(unchecked) private(set) var hitMapFull = false
  /// The first LMDB error any operation of this transaction returned, even if the caller's code
  /// caught it: after most errors LMDB refuses the rest of the transaction.
  @exclusivity(unchecked) public private(set) var firstFailure: LMDBError?
  /// Cursors kept for reuse, one per database (indexed by its handle, a small number), while not
  /// in use: opening one costs an allocation, and a dictionary hashed the handle twice per use.
  @exclusivity(unchecked) private var idleCursors: [Cursor?] = []

  /// ``Environment/maxKeySize``, kept here: every key operation checks it, and reaching it through
  /// the unowned `environment` retained and released the environment each time.
  package let maxKeySize: Int

  init(txn: OpaquePointer, environment: Environment, readOnly: Bool) {
    self.txn = txn
    self.environment = environment
    self.isReadOnly = readOnly
    self.maxKeySize = environment.maxKeySize
  }

  func check(_ rc: Int32, _ operation: @autoclosure () -> String) throws(LMDBError) {
    if rc == MDB_SUCCESS { return }
    if rc == MDB_MAP_FULL { hitMapFull = true }
    let error = LMDBError(code: rc, operation: operation())
    if firstFailure == nil && rc != MDB_NOTFOUND && rc != MDB_KEYEXIST { firstFailure = error }
    throw error
  }

  private func ensureOpen() throws(LMDBError) {
    if isFinished {
      throw LMDBError(code: MDB_BAD_TXN, message: "the transaction was already committed or aborted")
    }
  }

  private func closeCursors() {
    for case let cursor? in idleCursors {
      cursor.isClosed = true
      mdb_cursor_close(cursor.cursor)
    }
    idleCursors = []
  }

  /// LMDB's id of this transaction: a write transaction's is one more than the last committed
  /// write transaction's, in any process.
  public var id: UInt64 { UInt64(mdb_txn_id(txn)) }

  func commit() throws(LMDBError) {
    try ensureOpen()
    closeCursors()
    isFinished = true
    try check(mdb_txn_commit(txn), "committing a transaction")
  }

  func abortIfOpen() {
    if isFinished { return }
    closeCursors()
    isFinished = true
    mdb_txn_abort(txn)
  }

  /// Checks that a key is one LMDB can hold: 1 to ``Environment/maxKeySize`` bytes.
  public func validateKey(_ count: Int, in db: Database) throws(LMDBError) {
    if count == 0 || count > maxKeySize {
      throw LMDBError(
        code: MDB_BAD_VALSIZE,
        message:
          "a key of \(count) bytes cannot be stored in '\(db.name)': keys hold 1 to \(maxKeySize) bytes"
      )
    }
  }

  /// The value stored under `key`, copied out, or nil.
  public func get(_ db: Database, key: [UInt8]) throws -> [UInt8]? {
    try withValue(db, key: key) { buffer in buffer.map { Array($0) } }
  }

  /// Calls `body` with the bytes stored under `key` (nil when absent). The buffer points into the
  /// map and is valid only during the call.
  public func withValue<R>(
    _ db: Database, key: [UInt8], _ body: (UnsafeRawBufferPointer?) throws -> R
  ) throws -> R {
    try key.withUnsafeBytes { k in try withValue(db, key: k, body) }
  }

  /// ``withValue(_:key:_:)`` with the key's bytes held elsewhere.
  public func withValue<R>(
    _ db: Database, key: UnsafeRawBufferPointer, _ body: (UnsafeRawBufferPointer?) throws -> R
  ) throws -> R {
    try ensureOpen()
    try validateKey(key.count, in: db)
    var data = MDB_val()
    var keyVal = MDB_val(mv_size: key.count, mv_data: UnsafeMutableRawPointer(mutating: key.baseAddress))
    let rc = mdb_get(txn, db.dbi, &keyVal, &data)
    if rc == MDB_NOTFOUND { return try body(nil) }
    try check(rc, "reading from '\(db.name)'")
    return try body(UnsafeRawBufferPointer(start: data.mv_data, count: data.mv_size))
  }

  /// Stores `value` under `key`.
  ///
  /// With ``PutFlags/noOverwrite`` an existing key throws ``LMDBError/keyExists``; with
  /// ``PutFlags/append`` a key that does not sort last throws ``LMDBError/keyExists``.
  public func put(_ db: Database, key: [UInt8], value: [UInt8], flags: PutFlags = []) throws {
    try key.withUnsafeBytes { k in
      try value.withUnsafeBytes { v in try put(db, key: k, value: v, flags: flags) }
    }
  }

  /// ``put(_:key:value:flags:)`` from bytes held elsewhere (LMDB copies them). Never with bytes
  /// this environment handed out (`withValue`, a cursor): LMDB reads them after it has begun
  /// changing the page they may lie on (a dirty page of this transaction, say) and stores what
  /// moved there — hence package-only.
  package func put(
    _ db: Database, key: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, flags: PutFlags = []
  ) throws {
    try ensureOpen()
    try validateKey(key.count, in: db)
    var keyVal = MDB_val(mv_size: key.count, mv_data: UnsafeMutableRawPointer(mutating: key.baseAddress))
    var dataVal = MDB_val(mv_size: value.count, mv_data: UnsafeMutableRawPointer(mutating: value.baseAddress))
    let rc = mdb_put(txn, db.dbi, &keyVal, &dataVal, flags.rawValue)
    try check(rc, "writing \(value.count) bytes to '\(db.name)'")
  }

  /// Deletes `key`; returns whether it was there.
  @discardableResult
  public func delete(_ db: Database, key: [UInt8]) throws -> Bool {
    try key.withUnsafeBytes { k in try delete(db, key: k) }
  }

  /// ``delete(_:key:)`` with the key's bytes held elsewhere.
  @discardableResult
  public func delete(_ db: Database, key: UnsafeRawBufferPointer) throws -> Bool {
    try ensureOpen()
    try validateKey(key.count, in: db)
    var keyVal = MDB_val(mv_size: key.count, mv_data: UnsafeMutableRawPointer(mutating: key.baseAddress))
    let rc = mdb_del(txn, db.dbi, &keyVal, nil)
    if rc == MDB_NOTFOUND { return false }
    try check(rc, "deleting from '\(db.name)'")
    return true
  }

  /// Removes every key of the database, keeping the database itself (`mdb_drop(dbi, 0)`).
  public func empty(_ db: Database) throws {
    try ensureOpen()
    try check(mdb_drop(txn, db.dbi, 0), "emptying '\(db.name)'")
  }

  /// Statistics of the database as this transaction sees it.
  public func statistics(_ db: Database) throws -> DatabaseStatistics {
    try ensureOpen()
    var stat = MDB_stat()
    try check(mdb_stat(txn, db.dbi, &stat), "mdb_stat of '\(db.name)'")
    return DatabaseStatistics(
      entries: stat.ms_entries, depth: Int(stat.ms_depth),
      pages: stat.ms_branch_pages + stat.ms_leaf_pages + stat.ms_overflow_pages)
  }

  /// Runs `body` with a cursor over `db`, valid only during the call (the transaction keeps it for
  /// reuse afterwards, and closes it when it finishes).
  @discardableResult
  public func withCursor<R>(_ db: Database, _ body: (Cursor) throws -> R) throws -> R {
    try ensureOpen()
    // Reuse this database's idle cursor; a nested use of the same database gets one of its own.
    let cursor: Cursor
    let slot = Int(db.dbi)
    if slot < idleCursors.count, let idle = idleCursors[slot] {
      idleCursors[slot] = nil
      cursor = idle
    } else {
      var cursorPointer: OpaquePointer?
      try check(mdb_cursor_open(txn, db.dbi, &cursorPointer), "opening a cursor on '\(db.name)'")
      guard let pointer = cursorPointer else {
        throw LMDBError(code: MDB_BAD_TXN, message: "mdb_cursor_open returned no cursor")
      }
      cursor = Cursor(cursor: pointer, transaction: self, database: db)
    }
    defer {
      if isFinished || (slot < idleCursors.count && idleCursors[slot] != nil) {
        cursor.isClosed = true
        mdb_cursor_close(cursor.cursor)
      } else {
        if slot >= idleCursors.count {
          idleCursors.append(contentsOf: repeatElement(nil, count: slot + 1 - idleCursors.count))
        }
        idleCursors[slot] = cursor
      }
    }
    return try body(cursor)
  }
}

/// A position in one database, valid only inside ``Transaction/withCursor(_:_:)``.
public final class Cursor {
  let cursor: OpaquePointer
  unowned let transaction: Transaction
  /// The database the cursor walks.
  public let database: Database
  @exclusivity(unchecked) var isClosed = false
  /// The transaction's ``Environment/maxKeySize``, kept here: reaching the unowned transaction
  /// retains and releases it, on every step of a scan and every put.
  let maxKeySize: Int

  init(cursor: OpaquePointer, transaction: Transaction, database: Database) {
    self.cursor = cursor
    self.transaction = transaction
    self.database = database
    self.maxKeySize = transaction.maxKeySize
  }

  /// One key/value pair, copied out of the map.
  public typealias Entry = (key: [UInt8], value: [UInt8])

  private func move(_ op: MDB_cursor_op, key: [UInt8]? = nil) throws -> Entry? {
    try withMove(op, key: key) { k, v in (Array(k), Array(v)) }
  }

  /// Moves the cursor and calls `body` with the key and value it lands on (nil when there is none).
  /// The buffers point into the map and are valid only during the call.
  func withMove<R>(
    _ op: MDB_cursor_op, key: [UInt8]?, _ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> R
  ) throws -> R? {
    if isClosed { throw LMDBError(code: MDB_BAD_TXN, message: "the cursor is closed") }
    var keyVal = MDB_val()
    var dataVal = MDB_val()
    let rc: Int32
    if let key {
      if key.count == 0 || key.count > maxKeySize { try transaction.validateKey(key.count, in: database) }
      rc = key.withUnsafeBytes { k -> Int32 in
        keyVal = MDB_val(mv_size: k.count, mv_data: UnsafeMutableRawPointer(mutating: k.baseAddress))
        return mdb_cursor_get(cursor, &keyVal, &dataVal, op)
      }
    } else {
      rc = mdb_cursor_get(cursor, &keyVal, &dataVal, op)
    }
    if rc == MDB_NOTFOUND { return nil }
    if rc != MDB_SUCCESS { try transaction.check(rc, "moving a cursor on '\(database.name)'") }
    return try body(
      UnsafeRawBufferPointer(start: keyVal.mv_data, count: keyVal.mv_size),
      UnsafeRawBufferPointer(start: dataVal.mv_data, count: dataVal.mv_size))
  }

  /// The first entry, or nil when the database is empty.
  public func first() throws -> Entry? { try move(MDB_FIRST) }
  /// The last entry, or nil when the database is empty.
  public func last() throws -> Entry? { try move(MDB_LAST) }
  /// Calls `body` with the last entry's key and value, in place (valid only during the call);
  /// nil when the database is empty. ``last()`` without the copies.
  public func withLast<R>(_ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> R) throws -> R? {
    try withMove(MDB_LAST, key: nil, body)
  }
  /// The entry after the current one (the first when unpositioned), or nil at the end.
  public func next() throws -> Entry? { try move(MDB_NEXT) }
  /// The entry before the current one (the last when unpositioned), or nil at the start.
  public func previous() throws -> Entry? { try move(MDB_PREV) }
  /// The first entry whose key is greater than or equal to `key`, or nil.
  public func seek(atOrAfter key: [UInt8]) throws -> Entry? { try move(MDB_SET_RANGE, key: key) }

  /// The key the cursor is at, copied, or nil when unpositioned.
  public func currentKey() throws -> [UInt8]? {
    try withMove(MDB_GET_CURRENT, key: nil) { k, _ in Array(k) }
  }

  /// Walks forward from the first key at or after `start` (from the first key when nil), calling
  /// `body` with each key and value without copying them, until `body` returns false or the
  /// database ends. Returns how many entries `body` saw.
  @discardableResult
  public func scan(
    from start: [UInt8]?, _ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> Bool
  ) throws -> Int {
    var seen = 0
    var more =
      try withMove(start == nil ? MDB_FIRST : MDB_SET_RANGE, key: start) { k, v in
        seen += 1
        return try body(k, v)
      } ?? false
    while more {
      more =
        try withMove(MDB_NEXT, key: nil) { k, v in
          seen += 1
          return try body(k, v)
        } ?? false
    }
    return seen
  }

  /// Stores `value` under `key` through this cursor (`mdb_cursor_put`), leaving the cursor at the
  /// entry written. A run of ``PutFlags/append`` puts through one cursor costs less than one
  /// `mdb_put` each: `mdb_put` sets up a fresh cursor for every row and looks the root page up
  /// among the transaction's dirty pages again, where a kept cursor still holds it (LMDB still
  /// walks down to the last leaf on each append). The same rule as
  /// ``Transaction/put(_:key:value:flags:)`` on the bytes: never ones this environment handed out.
  package func put(key: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, flags: PutFlags = []) throws {
    if isClosed { throw LMDBError(code: MDB_BAD_TXN, message: "the cursor is closed") }
    // The transaction (unowned: each use retains it) only when something is wrong.
    if key.count == 0 || key.count > maxKeySize { try transaction.validateKey(key.count, in: database) }
    var keyVal = MDB_val(mv_size: key.count, mv_data: UnsafeMutableRawPointer(mutating: key.baseAddress))
    var dataVal = MDB_val(mv_size: value.count, mv_data: UnsafeMutableRawPointer(mutating: value.baseAddress))
    let rc = mdb_cursor_put(cursor, &keyVal, &dataVal, flags.rawValue)
    if rc != MDB_SUCCESS { try transaction.check(rc, "writing \(value.count) bytes to '\(database.name)'") }
  }

  /// Deletes the entry the cursor is at.
  public func deleteCurrent() throws {
    if isClosed { throw LMDBError(code: MDB_BAD_TXN, message: "the cursor is closed") }
    try transaction.check(mdb_cursor_del(cursor, 0), "deleting at a cursor on '\(database.name)'")
  }
}
