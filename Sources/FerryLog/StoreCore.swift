import LMDB

/// A projection with the LMDB databases of its tables in one environment.
struct BoundProjection: Sendable {
  let projection: any Projection
  let databases: [String: Database]

  var name: String { projection.name }

  func tables(in txn: Transaction) -> ProjectionTables {
    ProjectionTables(projection: projection.name, transaction: txn, databases: databases)
  }

  static func databaseNames(of projection: any Projection) -> [String] {
    projection.tables.map { TableNaming.databaseName(projection: projection.name, table: $0) }
  }

  static func bind(_ projection: any Projection, in environment: Environment) throws -> BoundProjection {
    var databases: [String: Database] = [:]
    for table in projection.tables {
      databases[table] = try environment.database(
        TableNaming.databaseName(projection: projection.name, table: table))
    }
    return BoundProjection(projection: projection, databases: databases)
  }
}

/// The stored state of a projection: its version and the last sequence folded into it.
struct ProjectionState: Equatable, Sendable {
  var version: UInt32
  var position: UInt64

  var bytes: [UInt8] { version.bigEndianBytes + position.bigEndianBytes }

  init(version: UInt32, position: UInt64) {
    self.version = version
    self.position = position
  }

  init?(bytes: [UInt8]) {
    guard bytes.count == 12, let version = UInt32(bigEndianBytes: bytes[0..<4]),
      let position = UInt64(bigEndianBytes: bytes[4..<12])
    else { return nil }
    self.version = version
    self.position = position
  }
}

/// Keys of the `meta` database.
enum MetaKey {
  static let format: [UInt8] = Array("format".utf8)
  static let createdAt: [UInt8] = Array("createdAt".utf8)
  static let storeId: [UInt8] = Array("storeId".utf8)
  static func projection(_ name: String) -> [UInt8] { Array("projection:\(name)".utf8) }
}

/// The transaction-level operations of a store: appending records, folding them into projections,
/// reading them back. Shared by the group-commit writer, open-time catch-up, rebuild and verify.
struct StoreCore: Sendable {
  let events: Database
  let meta: Database
  let projections: [BoundProjection]
  /// The database of the built-in event-id index, when idempotent appends are on.
  let eventIndex: Database?
  let catalog: EventCatalog?

  /// The last sequence number in the log (0 when empty).
  static func head(_ txn: Transaction, events: Database) throws -> UInt64 {
    try txn.withCursor(events) { cursor in
      guard let key = try cursor.currentKeyOfLast() else { return 0 }
      guard let sequence = UInt64(bigEndianBytes: key) else {
        throw FerryLogError.corruptRecord(
          sequence: 0, reason: "the last key of the log has \(key.count) bytes, not 8")
      }
      return sequence
    }
  }

  func head(_ txn: Transaction) throws -> UInt64 { try Self.head(txn, events: events) }

  func state(of name: String, _ txn: Transaction) throws -> ProjectionState? {
    try txn.get(meta, key: MetaKey.projection(name)).flatMap(ProjectionState.init(bytes:))
  }

  func setState(_ state: ProjectionState, of name: String, _ txn: Transaction) throws {
    try txn.put(meta, key: MetaKey.projection(name), value: state.bytes)
  }

  /// Why a projection's stored state does not match the log at `head`, or nil when it does.
  func staleness(of target: BoundProjection, head: UInt64, _ txn: Transaction) throws -> String? {
    guard let state = try state(of: target.name, txn) else { return "it was never built in this store" }
    if state.version != target.projection.version {
      return "stored version \(state.version), this code has version \(target.projection.version)"
    }
    if state.position != head { return "it covers the log up to \(state.position) of \(head)" }
    return nil
  }

  /// Decodes the record at `sequence` and upcasts it through the catalog.
  func decode(_ bytes: UnsafeRawBufferPointer, sequence: UInt64) throws -> LoggedEvent {
    let event = try EventRecord.decode(bytes, sequence: sequence)
    guard let catalog else { return event }
    return try catalog.upcast(event)
  }

  /// Folds one event into the given projections.
  func apply(_ event: LoggedEvent, to targets: [BoundProjection], _ txn: Transaction) throws {
    try apply(event, to: targets, tables: targets.map { $0.tables(in: txn) })
  }

  /// Folds one event into the given projections through their tables in the open transaction
  /// (made once per transaction, not once per event).
  func apply(_ event: LoggedEvent, to targets: [BoundProjection], tables: [ProjectionTables]) throws {
    for (target, tables) in zip(targets, tables) {
      do {
        try target.projection.apply(event, to: tables)
      } catch let error as LMDBError where error == .mapFull || error == .transactionFull {
        throw error  // the map grows and the transaction is retried; not the projection's fault
      } catch {
        throw FerryLogError.projectionFailed(
          projection: target.name, sequence: event.sequence, underlying: error)
      }
    }
  }

  /// Replays the records after `position` up to at most `limit` records into `targets`, reading the
  /// log through `logTxn` and writing through `targetTxn` (the same transaction for a live store, a
  /// scratch environment's for verify). Returns the last sequence applied (`position` if none).
  func replay(
    after position: UInt64, limit: Int, through last: UInt64, into targets: [BoundProjection],
    targetTxn: Transaction,
    logTxn: Transaction
  ) throws -> UInt64 {
    var expected = position + 1
    var applied = position
    guard expected <= last, limit > 0 else { return position }
    var failure: (any Error)?
    let tables = targets.map { $0.tables(in: targetTxn) }
    try logTxn.withCursor(events) { cursor in
      try cursor.scan(from: expected.bigEndianBytes) { key, value in
        guard let sequence = UInt64(bigEndianBytes: key) else {
          throw FerryLogError.corruptRecord(
            sequence: expected, reason: "its key has \(key.count) bytes, not 8")
        }
        guard sequence <= last else { return false }
        guard sequence == expected else {
          failure = FerryLogError.sequenceGap(expected: expected, found: sequence)
          return false
        }
        let event = try decode(value, sequence: sequence)
        try apply(event, to: targets, tables: tables)
        applied = sequence
        guard sequence < last else { return false }
        expected = sequence + 1
        return applied - position < UInt64(limit)
      }
    }
    if let failure { throw failure }
    let (end, overflow) = position.addingReportingOverflow(UInt64(limit))
    if applied < min(last, overflow ? .max : end) {
      throw FerryLogError.sequenceGap(expected: expected, found: nil)
    }
    return applied
  }
}

extension Cursor {
  /// The key of the last entry, or nil when the database is empty.
  func currentKeyOfLast() throws -> [UInt8]? { try last()?.key }
}
