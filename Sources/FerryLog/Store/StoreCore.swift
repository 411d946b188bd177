import LMDB

/// A projection with the LMDB databases of its tables in one environment.
/// A class: every commit walks the store's projections several times, and copying this value
/// retained each of its fields.
final class BoundProjection: Sendable {
  let projection: any Projection
  let databases: [String: Database]
  /// The tables of its newest snapshot (`s:<projection>:<table>`), when this environment has them.
  let snapshotDatabases: [String: Database]
  /// Its state's key in the `meta` database (made once: every commit reads and writes it).
  let stateKey: [UInt8]
  /// `databases` as the list ``ProjectionTables`` searches (made once, not per transaction).
  let tableList: [(name: String, database: Database)]

  init(projection: any Projection, databases: [String: Database], snapshotDatabases: [String: Database] = [:])
  {
    self.projection = projection
    self.databases = databases
    self.snapshotDatabases = snapshotDatabases
    self.stateKey = MetaKey.projection(projection.name)
    // In the projection's own order (its busiest tables usually first): ``ProjectionTables``
    // searches this list by name on every read and write.
    var list = projection.tables.compactMap { name in databases[name].map { (name: name, database: $0) } }
    for (name, database) in databases where !projection.tables.contains(name) {
      list.append((name, database))
    }
    self.tableList = list
  }

  var name: String { projection.name }

  func tables(in txn: Transaction, batched: Bool = false, expectedRows: Int = 0) -> ProjectionTables {
    ProjectionTables(
      projection: projection.name, transaction: txn, tableList: tableList, batched: batched,
      expectedRows: expectedRows)
  }

  static func databaseNames(of projection: any Projection) -> [String] {
    projection.tables.map { TableNaming.databaseName(projection: projection.name, table: $0) }
  }

  static func snapshotDatabaseNames(of projection: any Projection) -> [String] {
    projection.tables.map { TableNaming.snapshotName(projection: projection.name, table: $0) }
  }

  static func bind(_ projection: any Projection, in environment: Environment) throws -> BoundProjection {
    var databases: [String: Database] = [:]
    var snapshots: [String: Database] = [:]
    for table in projection.tables {
      databases[table] = try environment.database(
        TableNaming.databaseName(projection: projection.name, table: table))
      snapshots[table] = try? environment.database(
        TableNaming.snapshotName(projection: projection.name, table: table))
    }
    return BoundProjection(projection: projection, databases: databases, snapshotDatabases: snapshots)
  }
}

/// The stored state of a projection: its version and the last sequence folded into it.
struct ProjectionState: Equatable, Sendable {
  var version: UInt32
  var position: UInt64

  /// The 12 stored bytes, made in one allocation (every commit writes one per projection).
  var bytes: [UInt8] {
    let words = (
      version.bigEndian, UInt32(truncatingIfNeeded: position >> 32).bigEndian,
      UInt32(truncatingIfNeeded: position).bigEndian
    )
    return withUnsafeBytes(of: words) { Array($0) }
  }
}

// In an extension, so that the memberwise initializer stays.
extension ProjectionState {
  init?(bytes: [UInt8]) {
    guard let state = bytes.withUnsafeBytes({ ProjectionState(buffer: $0) }) else { return nil }
    self = state
  }

  init?(buffer: UnsafeRawBufferPointer) {
    guard buffer.count == 12, let version = UInt32(bigEndianBytes: buffer[0..<4]),
      let position = UInt64(bigEndianBytes: buffer[4..<12])
    else { return nil }
    self.init(version: version, position: position)
  }
}

/// Keys of the `meta` database.
enum MetaKey {
  static let format: [UInt8] = Array("format".utf8)
  static let createdAt: [UInt8] = Array("createdAt".utf8)
  static let storeId: [UInt8] = Array("storeId".utf8)
  static func projection(_ name: String) -> [UInt8] { Array("projection:\(name)".utf8) }
  static func snapshot(_ name: String) -> [UInt8] { Array("snapshot:\(name)".utf8) }
  /// The newest compaction: the sequence it covered and how many events it has removed in all.
  static let compaction: [UInt8] = Array("compaction".utf8)
}

/// A projection's newest snapshot: its rows as of `sequence`, at `version`, with a CRC32C over them.
struct SnapshotState: Equatable, Sendable {
  var version: UInt32
  var sequence: UInt64
  var crc: UInt32
  var rows: UInt64

  var bytes: [UInt8] {
    version.bigEndianBytes + sequence.bigEndianBytes + crc.bigEndianBytes + rows.bigEndianBytes
  }
}

extension SnapshotState {
  init?(bytes: [UInt8]) {
    guard bytes.count == 24, let version = UInt32(bigEndianBytes: bytes[0..<4]),
      let sequence = UInt64(bigEndianBytes: bytes[4..<12]), let crc = UInt32(bigEndianBytes: bytes[12..<16]),
      let rows = UInt64(bigEndianBytes: bytes[16..<24])
    else { return nil }
    self.init(version: version, sequence: sequence, crc: crc, rows: rows)
  }
}

/// Where compaction has reached: events at or below `through` may be missing (removed on purpose).
struct CompactionState: Equatable, Sendable {
  var through: UInt64
  var removed: UInt64

  var bytes: [UInt8] { through.bigEndianBytes + removed.bigEndianBytes }
}

extension CompactionState {
  init?(bytes: [UInt8]) {
    guard bytes.count == 16, let through = UInt64(bigEndianBytes: bytes[0..<8]),
      let removed = UInt64(bigEndianBytes: bytes[8..<16])
    else { return nil }
    self.init(through: through, removed: removed)
  }
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
      // The last key read in place (every commit asks: a copy of the key and the record cost more).
      let last = try cursor.withLast { key, _ -> Result<UInt64, FerryLogError> in
        guard let sequence = UInt64(bigEndianBytes: key) else {
          return .failure(
            .corruptRecord(sequence: 0, reason: "the last key of the log has \(key.count) bytes, not 8"))
        }
        return .success(sequence)
      }
      return try last?.get() ?? 0
    }
  }

  /// The log's head: the last sequence number given out. Compaction may remove the newest events
  /// too, so it is never below the compaction point — a sequence number is never given out twice.
  func head(_ txn: Transaction) throws -> UInt64 {
    max(try Self.head(txn, events: events), try compactedThrough(txn))
  }

  /// The newest compaction point (0 when the log was never compacted).
  func compactedThrough(_ txn: Transaction) throws -> UInt64 {
    try txn.get(meta, key: MetaKey.compaction).flatMap(CompactionState.init(bytes:))?.through ?? 0
  }

  /// Why the number of records in the log disagrees with its head and what compaction removed,
  /// or nil when it agrees: Ferry deletes records only by compaction, which counts them, so the
  /// log holds exactly `head − removed` records. A damaged branch page that hides or repeats
  /// records, or a lost deletion, breaks this.
  func countProblem(_ txn: Transaction) throws -> String? {
    let entries = UInt64(try txn.statistics(events).entries)
    let head = try head(txn)
    let removed = try compaction(txn)?.removed ?? 0
    let (expected, overflow) = head.subtractingReportingOverflow(removed)
    if overflow || entries != expected {
      return
        "the log holds \(entries) records, but its head \(head) less the \(removed) compaction removed makes \(overflow ? 0 : expected)"
    }
    return nil
  }

  /// Why `sequence` cannot be the next key of a scan that expects `expected`, or nil when it can:
  /// keys only ever rise, and a gap is allowed only where compaction removed events on purpose
  /// (at or below `compacted`). The one rule every scan of the log applies.
  static func orderProblem(_ sequence: UInt64, expected: UInt64, compacted: UInt64) -> FerryLogError? {
    if sequence == expected || (sequence > expected && sequence - 1 <= compacted) { return nil }
    if sequence < expected {
      return .corruptRecord(
        sequence: sequence, reason: "it is read after sequence \(expected - 1): the log's order is damaged")
    }
    return .sequenceGap(expected: expected, found: sequence)
  }

  /// Walks every key of the log: how many records it holds, and the first place its keys break
  /// their order (stopping there).
  func walkKeys(_ txn: Transaction) throws -> (records: UInt64, problem: FerryLogError?) {
    let compacted = try compactedThrough(txn)
    var expected: UInt64 = 1
    var found: FerryLogError?
    var records: UInt64 = 0
    try txn.withCursor(events) { cursor in
      try cursor.scan(from: nil) { key, _ in
        records += 1
        guard let sequence = UInt64(bigEndianBytes: key) else {
          found = .corruptRecord(sequence: expected, reason: "its key has \(key.count) bytes, not 8")
          return false
        }
        if let problem = Self.orderProblem(sequence, expected: expected, compacted: compacted) {
          found = problem
          return false
        }
        expected = sequence &+ 1
        return true
      }
    }
    return (records, found)
  }

  func compaction(_ txn: Transaction) throws -> CompactionState? {
    try txn.get(meta, key: MetaKey.compaction).flatMap(CompactionState.init(bytes:))
  }

  func snapshot(of name: String, _ txn: Transaction) throws -> SnapshotState? {
    try txn.get(meta, key: MetaKey.snapshot(name)).flatMap(SnapshotState.init(bytes:))
  }

  /// The CRC32C of every row of a set of tables, in table then key order.
  static func checksum(
    _ databases: [(String, Database)], _ txn: Transaction
  ) throws -> (crc: UInt32, rows: UInt64) {
    var crc: UInt32 = 0
    var rows: UInt64 = 0
    for (_, database) in databases.sorted(by: { $0.0 < $1.0 }) {
      try txn.withCursor(database) { cursor in
        try cursor.scan(from: nil) { key, value in
          var lengths = UInt32(key.count).bigEndian
          withUnsafeBytes(of: &lengths) { crc = CRC32C.update(crc, $0) }
          crc = CRC32C.update(crc, key)
          lengths = UInt32(value.count).bigEndian
          withUnsafeBytes(of: &lengths) { crc = CRC32C.update(crc, $0) }
          crc = CRC32C.update(crc, value)
          rows += 1
          return true
        }
      }
    }
    return (crc, rows)
  }

  /// Copies every row of `from` into `to` (emptied first) within one transaction.
  static func copyRows(from: [String: Database], to: [String: Database], _ txn: Transaction) throws {
    for (table, target) in to {
      try txn.empty(target)
      guard let source = from[table] else { continue }
      var rows: [([UInt8], [UInt8])] = []
      try txn.withCursor(source) { cursor in
        try cursor.scan(from: nil) { key, value in
          rows.append((Array(key), Array(value)))
          return true
        }
      }
      for (key, value) in rows { try txn.put(target, key: key, value: value, flags: .append) }
    }
  }

  /// Makes the projections' current rows their snapshot, as of the log's head (a projection that
  /// is not current is left out). Returns the rows written.
  @discardableResult
  func writeSnapshots(of targets: [BoundProjection], _ txn: Transaction) throws -> UInt64 {
    let head = try head(txn)
    var rows: UInt64 = 0
    for target in targets where !target.snapshotDatabases.isEmpty {
      // Only a projection of this code's version at the head: the rows of one stored at another
      // version (by another process) must not go under this version's label.
      guard let state = try state(of: target.name, txn), state.version == target.projection.version,
        state.position == head
      else { continue }
      try Self.copyRows(from: target.databases, to: target.snapshotDatabases, txn)
      let check = try Self.checksum(target.snapshotDatabases.map { ($0.key, $0.value) }, txn)
      try txn.put(
        meta, key: MetaKey.snapshot(target.name),
        value: SnapshotState(
          version: target.projection.version, sequence: head, crc: check.crc, rows: check.rows
        )
        .bytes)
      rows += check.rows
    }
    return rows
  }

  /// Removes the snapshots older than `head` (those of projections ``writeSnapshots(of:_:)`` did
  /// not snapshot at it: stored at another version, or without a state): a compaction at `head`
  /// may remove events past them that they would still need, so a rebuild starting from one could
  /// bring back what those events ended. Without a snapshot, a rebuild replays what the log holds.
  func dropSnapshots(olderThan head: UInt64, _ txn: Transaction) throws {
    for target in projections where !target.snapshotDatabases.isEmpty {
      guard let snapshot = try snapshot(of: target.name, txn), snapshot.sequence < head else { continue }
      _ = try txn.delete(meta, key: MetaKey.snapshot(target.name))
      for database in target.snapshotDatabases.values { try txn.empty(database) }
    }
    // A projection this code does not configure (another version of the app added it) loses its
    // snapshot record too — without it, its own code rebuilds from what the log holds; its tables
    // are not known here and stay (unused).
    let configured = Set(projections.map(\.name))
    let stale = try metaEntries(named: MetaKey.snapshot(""), txn).filter { name, value in
      guard !configured.contains(name), let snapshot = SnapshotState(bytes: value) else { return false }
      return snapshot.sequence < head
    }
    for (name, _) in stale { _ = try txn.delete(meta, key: MetaKey.snapshot(name)) }
  }

  /// The projections stored in the store — at another version than this code's, or not
  /// configured here at all — that are behind `head`: their own code folds on from their
  /// positions, so events past them must not be removed. Each as "name (version V, at P)", with
  /// "not configured here" for one this code does not know.
  func projectionsOfOtherCodeBehind(_ head: UInt64, _ txn: Transaction) throws -> [String] {
    let configured = Dictionary(
      projections.map { ($0.name, $0.projection.version) }, uniquingKeysWith: { first, _ in first })
    return try metaEntries(named: MetaKey.projection(""), txn).compactMap { name, value in
      guard let state = ProjectionState(bytes: value), state.position < head,
        configured[name] != state.version
      else { return nil }
      let whose = configured[name].map { "this code has version \($0)" } ?? "not configured here"
      return "\(name) (version \(state.version), at \(state.position); \(whose))"
    }
  }

  /// The `meta` rows whose keys start with `prefix`, as (the rest of the key, the value).
  private func metaEntries(named prefix: [UInt8], _ txn: Transaction) throws -> [(String, [UInt8])] {
    var entries: [(String, [UInt8])] = []
    try txn.withCursor(meta) { cursor in
      try cursor.scan(from: prefix) { key, value in
        guard key.starts(with: prefix) else { return false }
        entries.append((String(decoding: key.dropFirst(prefix.count), as: UTF8.self), Array(value)))
        return true
      }
    }
    return entries
  }

  /// Restores a projection from its snapshot when the snapshot is of its version and its rows
  /// match their CRC; returns the sequence the snapshot covers, or nil when there is none to use.
  func restoreFromSnapshot(_ target: BoundProjection, _ txn: Transaction) throws -> UInt64? {
    guard !target.snapshotDatabases.isEmpty, let snapshot = try snapshot(of: target.name, txn),
      snapshot.version == target.projection.version
    else { return nil }
    let check = try Self.checksum(target.snapshotDatabases.map { ($0.key, $0.value) }, txn)
    guard check.crc == snapshot.crc, check.rows == snapshot.rows else { return nil }
    try Self.copyRows(from: target.snapshotDatabases, to: target.databases, txn)
    return snapshot.sequence
  }

  func state(of name: String, _ txn: Transaction) throws -> ProjectionState? {
    try txn.get(meta, key: MetaKey.projection(name)).flatMap(ProjectionState.init(bytes:))
  }

  func setState(_ state: ProjectionState, of name: String, _ txn: Transaction) throws {
    try txn.put(meta, key: MetaKey.projection(name), value: state.bytes)
  }

  /// ``state(of:_:)`` by the key the bound projection keeps.
  func state(of target: BoundProjection, _ txn: Transaction) throws -> ProjectionState? {
    try txn.withValue(meta, key: target.stateKey) { buffer in
      buffer.flatMap { ProjectionState(buffer: $0) }
    }
  }

  /// ``setState(_:of:_:)`` by the key the bound projection keeps.
  func setState(_ state: ProjectionState, of target: BoundProjection, _ txn: Transaction) throws {
    try txn.put(meta, key: target.stateKey, value: state.bytes)
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
    switch try decodeForReplay(bytes, sequence: sequence) {
    case .inPlace(let header, let payload): return LoggedEvent(header, payload: Array(payload))
    case .event(let event): return event
    }
  }

  /// A record as a replay folds it: in place when it needs no upcasting, else as an event.
  enum ReplayRecord {
    case inPlace(RecordHeader, UnsafeRawBufferPointer)
    case event(LoggedEvent)
  }

  /// Decodes the record at `sequence` for a replay into projections that all fold in place
  /// (``InPlaceFolding``): the payload stays where it lies unless the catalog upcasts it. The
  /// record's type is looked up by its bytes: its name is the catalog's own string (nothing made,
  /// nothing hashed), and the upcast starts from the entry found.
  func decodeForReplay(_ bytes: UnsafeRawBufferPointer, sequence: UInt64) throws -> ReplayRecord {
    guard let catalog else {
      let (header, payload) = try EventRecord.decodeInPlace(bytes, sequence: sequence) { _ in nil }
      return .inPlace(header, payload)
    }
    // The entry found, by its index (a copy of its type retained the type's name and upcasters).
    var found: Int?
    let (header, payload) = try EventRecord.decodeInPlace(bytes, sequence: sequence) { typeBytes in
      guard let index = catalog.index(named: typeBytes) else { return nil }
      found = index
      return (catalog.known[index].type.name, catalog.known[index].isValidName)
    }
    if let found, header.schemaVersion == catalog.known[found].type.version {
      return .inPlace(header, payload)
    }
    // Unknown types, newer versions (both throw) and older ones (upcast) the ordinary way.
    let type = found.map { catalog.known[$0].type }
    return .event(try catalog.upcast(LoggedEvent(header, payload: Array(payload)), type: type))
  }

  /// Folds one record in place into projections that all fold in place.
  func apply(
    _ header: RecordHeader, payload: UnsafeRawBufferPointer, to folders: [any InPlaceFolding],
    tables: [ProjectionTables]
  ) throws {
    for index in 0..<min(folders.count, tables.count) {
      do { try folders[index].apply(header, payload: payload, to: tables[index]) } catch {
        throw Self.foldFailure(error, in: tables[index], at: header.sequence)
      }
    }
  }

  /// Folds one event into the given projections through their tables in the open transaction
  /// (made once per transaction, not once per event).
  func apply(_ event: LoggedEvent, to targets: [BoundProjection], tables: [ProjectionTables]) throws {
    // By index: a `for (target, tables) in zip(...)` copied each bound projection once per event.
    for index in 0..<min(targets.count, tables.count) {
      do { try targets[index].projection.apply(event, to: tables[index]) } catch {
        throw Self.foldFailure(error, in: tables[index], at: event.sequence)
      }
    }
  }

  /// ``apply(_:to:tables:)`` over the projections themselves, for a replay's chunk (taken out of
  /// their bound projections once per chunk: reaching each through its class retained it once per
  /// event).
  func apply(_ event: LoggedEvent, to folders: [any Projection], tables: [ProjectionTables]) throws {
    for index in 0..<min(folders.count, tables.count) {
      do { try folders[index].apply(event, to: tables[index]) } catch {
        throw Self.foldFailure(error, in: tables[index], at: event.sequence)
      }
    }
  }

  /// What a projection's failed fold throws: its error named with the projection, except the LMDB
  /// errors the transaction is retried for (the map grows), which are not the projection's fault.
  private static func foldFailure(
    _ error: any Error, in tables: ProjectionTables, at sequence: UInt64
  ) -> any Error {
    if let lmdb = error as? LMDBError, lmdb == .mapFull || lmdb == .transactionFull { return lmdb }
    return FerryLogError.projectionFailed(
      projection: tables.projection, sequence: sequence, underlying: error)
  }

  /// In `txn`: folds the log into the projections of this code's version that are furthest behind
  /// its head (those sharing the lowest position), at most `limit` events, and stores their new
  /// position. A projection stored at another version is left alone. Returns how many events it
  /// replayed: 0 when none is behind.
  func foldFurthestBehind(limit: Int, _ txn: Transaction) throws -> Int {
    let head = try head(txn)
    var positions: [(BoundProjection, UInt64)] = []
    for target in projections {
      guard let state = try state(of: target.name, txn), state.version == target.projection.version else {
        continue
      }
      if state.position < head { positions.append((target, state.position)) }
    }
    guard let lowest = positions.map(\.1).min() else { return 0 }
    let targets = positions.filter { $0.1 == lowest }.map(\.0)
    let last = try replay(
      after: lowest, limit: max(1, limit), through: head, into: targets, targetTxn: txn, logTxn: txn,
      batched: true)
    for target in targets {
      try setState(ProjectionState(version: target.projection.version, position: last), of: target.name, txn)
    }
    return Int(last - lowest)
  }

  /// Replays the records after `position` up to at most `limit` records into `targets`, reading the
  /// log through `logTxn` and writing through `targetTxn` (the same transaction for a live store, a
  /// scratch environment's for verify). Returns the last sequence applied (`position` if none).
  ///
  /// `batched` folds the chunk into in-memory overlays of the tables and writes only the rows that
  /// survive it, in key order, at the end (see ``TableOverlay``); the projections' `apply` is the
  /// same code either way.
  func replay(
    after position: UInt64, limit: Int, through last: UInt64, into targets: [BoundProjection],
    targetTxn: Transaction,
    logTxn: Transaction, batched: Bool = false
  ) throws -> UInt64 {
    var expected = position + 1
    var applied = position
    guard expected <= last, limit > 0 else { return position }
    // Compaction removes events at or below its point on purpose: gaps there are not damage.
    let compacted = try compactedThrough(logTxn)
    var failure: (any Error)?
    let tables = targets.map { $0.tables(in: targetTxn, batched: batched, expectedRows: limit) }
    let folders = targets.map(\.projection)
    // Records are folded in place when every projection can (Ferry's own: no payload copied per
    // event), else decoded into events.
    let inPlace = folders.compactMap { $0 as? any InPlaceFolding }
    let allInPlace = inPlace.count == folders.count

    try logTxn.withCursor(events) { cursor in
      try cursor.scan(from: expected.bigEndianBytes) { key, value in
        guard let sequence = UInt64(bigEndianBytes: key) else {
          throw FerryLogError.corruptRecord(
            sequence: expected, reason: "its key has \(key.count) bytes, not 8")
        }
        guard sequence <= last else { return false }
        if let problem = Self.orderProblem(sequence, expected: expected, compacted: compacted) {
          failure = problem
          return false
        }
        if allInPlace {
          switch try decodeForReplay(value, sequence: sequence) {
          case .inPlace(let header, let payload):
            try apply(header, payload: payload, to: inPlace, tables: tables)
          case .event(let event): try apply(event, to: folders, tables: tables)
          }
        } else {
          try apply(decode(value, sequence: sequence), to: folders, tables: tables)
        }
        applied = sequence
        guard sequence < last else { return false }
        expected = sequence + 1
        return applied - position < UInt64(limit)
      }
    }
    if let failure { throw failure }
    for table in tables { try table.flush() }
    let (end, overflow) = position.addingReportingOverflow(UInt64(limit))
    let reach = min(last, overflow ? .max : end)
    if applied < reach {
      guard reach <= compacted else { throw FerryLogError.sequenceGap(expected: expected, found: nil) }
      // The log holds nothing more up to `reach`, and compaction removed it on purpose: covered.
      // (A compaction may remove the newest events too; the head stays at its point.)
      return reach
    }
    return applied
  }
}
