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
}

extension ProjectionTableReading {
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

  init(projection: String, transaction: Transaction, databases: [String: Database]) {
    self.projection = projection
    self.transaction = transaction
    self.databases = databases.map { ($0.key, $0.value) }
  }

  func database(_ table: String) throws(FerryLogError) -> Database {
    for entry in databases where entry.name == table { return entry.database }
    throw .unknownTable(projection: projection, table: table)
  }

  /// The longest key a table can hold, in bytes.
  public var maxKeySize: Int { transaction.environment.maxKeySize }

  /// The value under `key` in `table`, or nil.
  public func get(_ table: String, key: [UInt8]) throws -> [UInt8]? {
    try transaction.get(database(table), key: key)
  }

  /// Visits the entries of `table` in key order from the first key at or after `start`.
  @discardableResult
  public func scan(
    _ table: String, from start: [UInt8]?,
    _ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> Bool
  ) throws -> Int {
    try transaction.withCursor(database(table)) { cursor in try cursor.scan(from: start, body) }
  }

  /// The number of entries in `table`.
  public func count(_ table: String) throws -> Int {
    try transaction.statistics(database(table)).entries
  }

  /// Stores `value` under `key` in `table` (replacing any value). Only during `apply`.
  public func put(_ table: String, key: [UInt8], value: [UInt8]) throws {
    try transaction.put(database(table), key: key, value: value)
  }

  /// Stores `value` under `key` in `table` where `key` is expected to sort after every key there
  /// (a new largest id): LMDB then appends without searching. A key that does not sort last is
  /// stored the ordinary way. Only during `apply`.
  public func putLast(_ table: String, key: [UInt8], value: [UInt8]) throws {
    let db = try database(table)
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
    do {
      try transaction.put(database(table), key: key, value: value, flags: .noOverwrite)
      return true
    } catch let error as LMDBError where error == .keyExists {
      return false
    }
  }

  /// Deletes `key` from `table`; returns whether it was there. Only during `apply`.
  @discardableResult
  public func delete(_ table: String, key: [UInt8]) throws -> Bool {
    try transaction.delete(database(table), key: key)
  }

  /// Removes every entry of `table`. Only during `apply`.
  public func removeAll(_ table: String) throws {
    try transaction.empty(database(table))
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
}
