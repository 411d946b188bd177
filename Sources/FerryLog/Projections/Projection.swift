import LMDB

/// A named, versioned fold of the log into tables of its own, kept in the same transaction as
/// every append, and rebuildable from the log at any time.
///
/// The same `apply` serves the live path (inside the append's write transaction) and rebuilds
/// (replaying the log into fresh tables), so a rebuild always equals what was materialized.
/// `apply` must be deterministic: it may read its own tables but nothing else (no clock, no
/// randomness, no other state), and it must not have effects outside `tables`: a transaction may
/// be aborted and the same events applied again.
///
/// Bump `version` whenever `apply` or the table layout changes: at open, a projection whose
/// stored version differs is emptied and rebuilt from the log.
///
/// ```swift
/// struct CountByType: Projection {
///   let name = "countByType"
///   let version: UInt32 = 1
///   let tables = ["counts"]
///   func apply(_ event: LoggedEvent, to tables: ProjectionTables) throws {
///     let key = Array(event.type.utf8)
///     let count = try tables.get("counts", key: key).flatMap(UInt64.init(bigEndianBytes:)) ?? 0
///     try tables.put("counts", key: key, value: (count + 1).bigEndianBytes)
///   }
/// }
/// ```
public protocol Projection: Sendable {
  /// A stable name: 1 to 48 characters from `A-Z a-z 0-9 . _ -`.
  var name: String { get }
  /// The projection's version; a change rebuilds it from the log at open.
  var version: UInt32 { get }
  /// The names of the tables it owns (same character set as `name`).
  var tables: [String] { get }
  /// Folds one event (already upcast to its current schema) into the tables.
  func apply(_ event: LoggedEvent, to tables: ProjectionTables) throws
}

/// Read access to the tables of one projection.
public protocol ProjectionTableReading {
  /// The projection's name.
  var projection: String { get }
  /// The value under `key` in `table`, or nil.
  func get(_ table: String, key: [UInt8]) throws -> [UInt8]?
  /// Visits the entries of `table` in key order from the first key at or after `start`, until
  /// `body` returns false. The buffers are valid only during each call. Returns entries visited.
  @discardableResult
  func scan(
    _ table: String, from start: [UInt8]?,
    _ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> Bool
  )
    throws -> Int
  /// The number of entries in `table`.
  func count(_ table: String) throws -> Int
  /// The value under `key` in `table` as `decode` makes it, or nil. Reading the tables a
  /// transaction writes, the last value decoded is kept until that table changes: a command that
  /// reads a row and the fold of the event it logs, which reads it again, decode it once. So
  /// `decode` must depend on the bytes alone: a later read of the same table, key and type `T` in
  /// the transaction may get the value an earlier `decode` made.
  func value<T>(_ table: String, key: [UInt8], as decode: ([UInt8]) throws -> T) throws -> T?
  /// Whether `table` certainly has no entries (false when unsure): lets a fold skip the search
  /// for a key in a table that is usually empty.
  func isCertainlyEmpty(_ table: String) throws -> Bool
}

extension ProjectionTableReading {
  /// Whether `table` certainly has no entries (false when unsure).
  public func isCertainlyEmpty(_ table: String) throws -> Bool { try count(table) == 0 }

  /// The value under `key` in `table`, decoded by `decode`, or nil.
  public func value<T>(_ table: String, key: [UInt8], as decode: ([UInt8]) throws -> T) throws -> T? {
    try get(table, key: key).map(decode)
  }

  /// The entries of `table` from `start` (inclusive), at most `limit` of them, copied.
  public func entries(
    _ table: String, from start: [UInt8]? = nil, limit: Int = .max
  ) throws -> [(key: [UInt8], value: [UInt8])] {
    var result: [(key: [UInt8], value: [UInt8])] = []
    if limit <= 0 { return result }
    try scan(table, from: start) { key, value in
      result.append((Array(key), Array(value)))
      return result.count < limit
    }
    return result
  }
}

/// Names the LMDB database that holds one table of one projection.
enum TableNaming {
  static func databaseName(projection: String, table: String) -> String { "p:\(projection):\(table)" }
  static func snapshotName(projection: String, table: String) -> String { "s:\(projection):\(table)" }

  static func isValidName(_ name: String, maxLength: Int = 48) -> Bool {
    let utf8 = name.utf8
    guard (1...maxLength).contains(utf8.count) else { return false }
    return utf8.allSatisfy { byte in
      (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
        || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "-")
    }
  }
}

/// The tables of one projection inside an open transaction: what `apply` writes to, and what
/// ``EventLog/read(_:)`` reads from. Valid only during the call it is handed to.
public final class ProjectionTables: ProjectionTableReading {
  /// The projection's name.
  public let projection: String
  let transaction: Transaction
  /// A projection has a handful of tables: a linear search of short names beats hashing them.
  let databases: [(name: String, database: Database)]

  /// In a batch fold (a rebuild), each table's changes not yet written, in `databases`' order;
  /// nil on the live path, where every change goes straight to the B-tree.
  let overlays: [TableOverlay]?

  /// The last value ``value(_:key:as:)`` decoded, kept until its table changes: the table's
  /// index (-1: none) and its key. The value itself is in raw memory of this object's
  /// (`memoCapacity` bytes, 16-aligned) that holds one initialized value of `memoType`; a nil
  /// `memoType` under a kept key means the key had no value. Not a generic box: a `Box<T>` made in
  /// this unspecialized code asked the runtime for its type metadata on every decode, and
  /// allocated.
  @exclusivity(unchecked) private var memoTable = -1
  @exclusivity(unchecked) private var memoKey: [UInt8] = []
  @exclusivity(unchecked) private var memoStorage: UnsafeMutableRawPointer?
  @exclusivity(unchecked) private var memoCapacity = 0
  @exclusivity(unchecked) private var memoType: Any.Type?
  /// Writes through these tables so far (a decode that writes keeps no memo).
  @exclusivity(unchecked) private var changes = 0

  deinit {
    forgetMemoValue()
    memoStorage?.deallocate()
  }

  /// Deinitializes the kept value, if any.
  private func forgetMemoValue() {
    guard let type = memoType, let storage = memoStorage else { return }
    memoType = nil
    func destroy<V>(_: V.Type) { storage.assumingMemoryBound(to: V.self).deinitialize(count: 1) }
    destroy(type)
  }

  /// Forgets the kept value when the table at `index` changes.
  private func changing(_ index: Int) {
    changes &+= 1
    if memoTable == index {
      memoTable = -1
      forgetMemoValue()
    }
    if index < 64 { emptiness.known &= ~(1 << UInt64(index)) }
  }

  /// What ``isCertainlyEmpty(_:)`` found, by table index (bit set in `known`: asked since the
  /// table last changed; in `empty`: it was empty), so a command asks LMDB once a table.
  @exclusivity(unchecked) private var emptiness: (known: UInt64, empty: UInt64) = (0, 0)

  convenience init(
    projection: String, transaction: Transaction, databases: [String: Database], batched: Bool = false
  ) {
    self.init(
      projection: projection, transaction: transaction, tableList: databases.map { ($0.key, $0.value) },
      batched: batched)
  }

  /// `expectedRows`: in a batch fold, how many rows a table may change (the chunk's events), so
  /// that a busy table's overlay makes room for them at once.
  init(
    projection: String, transaction: Transaction, tableList: [(name: String, database: Database)],
    batched: Bool, expectedRows: Int = 0
  ) {
    self.projection = projection
    self.transaction = transaction
    self.databases = tableList
    self.overlays = batched ? tableList.map { _ in TableOverlay(expectedRows: expectedRows) } : nil
  }

  func database(_ table: String) throws(FerryLogError) -> Database {
    for entry in databases where entry.name == table { return entry.database }
    throw .unknownTable(projection: projection, table: table)
  }

  /// The table's database and, in a batch fold, its overlay.
  func table(_ table: String) throws(FerryLogError) -> (Database, TableOverlay?) {
    let (_, database, overlay) = try entry(table)
    return (database, overlay)
  }

  /// The table's index among the projection's tables (nothing copied out: a ``Database`` copied
  /// retains its name, an overlay itself).
  @inline(__always)
  func index(of table: String) throws(FerryLogError) -> Int {
    let count = table.utf8.count
    for index in databases.indices
    where databases[index].name.utf8.count == count && databases[index].name == table {
      return index
    }
    throw .unknownTable(projection: projection, table: table)
  }

  /// ``table(_:)`` with the table's index among the projection's tables.
  func entry(
    _ table: String
  ) throws(FerryLogError) -> (index: Int, database: Database, overlay: TableOverlay?) {
    // The byte count first: a name of another length is passed over without comparing strings;
    // the names are compared in place (copying an entry out retained its database's name).
    let count = table.utf8.count
    for index in databases.indices
    where databases[index].name.utf8.count == count && databases[index].name == table {
      return (index, databases[index].database, overlays?[index])
    }
    throw .unknownTable(projection: projection, table: table)
  }

  /// Writes a batch fold's surviving rows into the tables (nothing on the live path).
  func flush() throws {
    guard let overlays else { return }
    for (entry, overlay) in zip(databases, overlays) where !overlay.isEmpty {
      try overlay.flush(into: entry.database, transaction)
    }
  }

  /// Rows a batch fold holds unwritten (0 on the live path).
  var pendingRows: Int { overlays?.reduce(0) { $0 + $1.changedRows } ?? 0 }

  /// The longest key a table can hold, in bytes.
  public var maxKeySize: Int { transaction.environment.maxKeySize }

  /// The value under `key` in `table`, decoded by `decode`, or nil.
  public func value<T>(_ table: String, key: [UInt8], as decode: ([UInt8]) throws -> T) throws -> T? {
    let (index, db, overlay) = try entry(table)
    if memoTable == index && memoKey == key {
      guard let type = memoType else { return nil }
      if ObjectIdentifier(type) == ObjectIdentifier(T.self), let storage = memoStorage {
        return storage.assumingMemoryBound(to: T.self).pointee
      }
    }
    let bytes: [UInt8]?
    if let overlay, let known = overlay.lookup(key) {
      bytes = known
    } else {
      bytes = try transaction.get(db, key: key)
    }
    forgetMemoValue()
    memoTable = -1  // until a value (or its absence) is kept
    guard let bytes else {
      keepMemo(index, key)
      return nil
    }
    let changesBefore = changes
    let decoded = try decode(bytes)
    // A decode that read these tables itself left its own memo: drop it. One that wrote to them
    // may have changed this very row: keep nothing.
    forgetMemoValue()
    memoTable = -1
    guard changes == changesBefore, MemoryLayout<T>.alignment <= 16 else { return decoded }
    if memoCapacity < MemoryLayout<T>.size || memoStorage == nil {
      memoStorage?.deallocate()
      memoCapacity = max(MemoryLayout<T>.size, 256)
      memoStorage = UnsafeMutableRawPointer.allocate(byteCount: memoCapacity, alignment: 16)
    }
    guard let storage = memoStorage else { return decoded }
    storage.initializeMemory(as: T.self, to: decoded)
    memoType = T.self
    keepMemo(index, key)
    return decoded
  }

  /// Names the kept value (or, with `memoType` nil, the key's absence).
  private func keepMemo(_ index: Int, _ key: [UInt8]) {
    memoTable = index
    memoKey = key
  }

  /// The value under `key` in `table`, or nil.
  public func get(_ table: String, key: [UInt8]) throws -> [UInt8]? {
    let (db, overlay) = try self.table(table)
    if let overlay, let known = overlay.lookup(key) { return known }
    return try transaction.get(db, key: key)
  }

  /// Visits the entries of `table` in key order from the first key at or after `start`.
  @discardableResult
  public func scan(
    _ table: String, from start: [UInt8]?,
    _ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> Bool
  ) throws -> Int {
    let (db, overlay) = try self.table(table)
    if let overlay { return try overlay.scan(base: db, transaction, from: start, body) }
    return try transaction.withCursor(db) { cursor in try cursor.scan(from: start, body) }
  }

  /// Whether `table` certainly has no entries (false when unsure).
  public func isCertainlyEmpty(_ table: String) throws -> Bool {
    let (index, db, overlay) = try entry(table)
    if let overlay, !overlay.isEmpty { return false }
    guard index < 64 else { return try transaction.statistics(db).entries == 0 }
    let bit: UInt64 = 1 << UInt64(index)
    if emptiness.known & bit != 0 { return emptiness.empty & bit != 0 }
    let empty = try transaction.statistics(db).entries == 0
    emptiness.known |= bit
    if empty { emptiness.empty |= bit } else { emptiness.empty &= ~bit }
    return empty
  }

  /// The number of entries in `table`.
  public func count(_ table: String) throws -> Int {
    let (db, overlay) = try self.table(table)
    guard let overlay else { return try transaction.statistics(db).entries }
    var count = overlay.emptied ? 0 : try transaction.statistics(db).entries
    for entry in overlay.entries {
      let inBase = overlay.emptied ? false : try transaction.withValue(db, key: entry.key) { $0 != nil }
      count += (entry.value != nil ? 1 : 0) - (inBase ? 1 : 0)
    }
    return count
  }

  /// Stores `value` under `key` in `table` (replacing any value). Only during `apply`.
  public func put(_ table: String, key: [UInt8], value: [UInt8]) throws {
    try key.withUnsafeBytes { k in try value.withUnsafeBytes { v in try put(table, key: k, value: v) } }
  }

  /// ``put(_:key:value:)`` from bytes held elsewhere (they are copied): a fold can build a key or
  /// a row in temporary memory instead of an array. Only during `apply`. Never with bytes read
  /// from these tables (a `scan`'s buffers): LMDB reads them after it has begun changing the page
  /// they may lie on — hence package-only; the array form is safe for everyone.
  package func put(_ table: String, key: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) throws {
    let index = try index(of: table)
    changing(index)
    if let overlays {
      try validateKey(key, index)
      overlays[index].set(key, value)
      return
    }
    try transaction.put(databases[index].database, key: key, value: value)
  }

  /// ``Transaction/validateKey(_:in:)`` for the table at `index`, its database reached only for
  /// the error.
  @inline(__always)
  private func validateKey(_ key: UnsafeRawBufferPointer, _ index: Int) throws {
    if key.count == 0 || key.count > transaction.maxKeySize {
      try transaction.validateKey(key.count, in: databases[index].database)
    }
  }

  /// Stores `value` under `key` in `table` where `key` is expected to sort after every key there
  /// (a new largest id): LMDB then appends without searching. A key that does not sort last is
  /// stored the ordinary way. Only during `apply`.
  public func putLast(_ table: String, key: [UInt8], value: [UInt8]) throws {
    try key.withUnsafeBytes { k in try value.withUnsafeBytes { v in try putLast(table, key: k, value: v) } }
  }

  /// ``putLast(_:key:value:)`` from bytes held elsewhere (they are copied). Only during `apply`,
  /// never with bytes read from these tables (see the raw `put`).
  package func putLast(_ table: String, key: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) throws {
    let index = try index(of: table)
    changing(index)
    if let overlays {
      try validateKey(key, index)
      overlays[index].set(key, value)
      return
    }
    let db = databases[index].database
    do {
      try transaction.put(db, key: key, value: value, flags: .append)
    } catch let error as LMDBError where error == .keyExists {
      try transaction.put(db, key: key, value: value)
    }
  }

  /// Stores `value` under `key` in `table` unless the key is there already; returns whether it
  /// stored it. Only during `apply`.
  @discardableResult
  public func putIfAbsent(_ table: String, key: [UInt8], value: [UInt8]) throws -> Bool {
    let (index, db, overlay) = try entry(table)
    changing(index)
    if overlay != nil {
      guard try get(table, key: key) == nil else { return false }
      try put(table, key: key, value: value)
      return true
    }
    do {
      try transaction.put(db, key: key, value: value, flags: .noOverwrite)
      return true
    } catch let error as LMDBError where error == .keyExists {
      return false
    }
  }

  /// Deletes `key` from `table`; returns whether it was there. Only during `apply`.
  @discardableResult
  public func delete(_ table: String, key: [UInt8]) throws -> Bool {
    try key.withUnsafeBytes { k in try delete(table, key: k) }
  }

  /// ``delete(_:key:)`` with the key's bytes held elsewhere. Only during `apply`.
  @discardableResult
  package func delete(_ table: String, key: UnsafeRawBufferPointer) throws -> Bool {
    let (index, db, overlay) = try entry(table)
    changing(index)
    if let overlay {
      let present: Bool
      if let known = overlay.lookup(key) {
        present = known != nil
      } else {
        present = try transaction.withValue(db, key: key) { $0 != nil }
      }
      guard present else { return false }
      overlay.set(key, nil)
      return true
    }
    return try transaction.delete(db, key: key)
  }

  /// Removes every entry of `table`. Only during `apply`.
  public func removeAll(_ table: String) throws {
    let (index, db, overlay) = try entry(table)
    changing(index)
    if let overlay {
      overlay.removeAll()
      return
    }
    try transaction.empty(db)
  }
}

/// Read-only access to the tables of one projection, as ``LogView/tables(of:)`` hands it out.
/// Valid only during the ``EventLog/read(_:)`` call it came from.
public struct ProjectionReader: ProjectionTableReading {
  let tables: ProjectionTables

  /// The projection's name.
  public var projection: String { tables.projection }

  /// The value under `key` in `table`, or nil.
  public func get(_ table: String, key: [UInt8]) throws -> [UInt8]? { try tables.get(table, key: key) }

  /// The value under `key` in `table`, decoded by `decode`, or nil.
  public func value<T>(_ table: String, key: [UInt8], as decode: ([UInt8]) throws -> T) throws -> T? {
    try tables.value(table, key: key, as: decode)
  }

  /// Visits the entries of `table` in key order from the first key at or after `start`.
  @discardableResult
  public func scan(
    _ table: String, from start: [UInt8]?,
    _ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> Bool
  ) throws -> Int {
    try tables.scan(table, from: start, body)
  }

  /// The number of entries in `table`.
  public func count(_ table: String) throws -> Int { try tables.count(table) }

  /// Whether `table` certainly has no entries (false when unsure).
  public func isCertainlyEmpty(_ table: String) throws -> Bool { try tables.isCertainlyEmpty(table) }
}
