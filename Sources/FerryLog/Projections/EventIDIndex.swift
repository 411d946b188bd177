/// The built-in index of event ids (id → sequence) behind idempotent appends.
///
/// It is an ordinary projection, so it is rebuilt from the log like any other — for instance when
/// idempotent appends are turned on for a store that was written without them.
struct EventIDIndex: InPlaceFolding {
  static let projectionName = "ferry.eventIds"
  static let table = "byId"

  let name = EventIDIndex.projectionName
  let version: UInt32 = 1
  let tables = [EventIDIndex.table]

  func apply(_ event: LoggedEvent, to tables: ProjectionTables) throws {
    // The first event with an id wins, as in the live path, which never stores a duplicate.
    try tables.putIfAbsent(Self.table, key: event.id.bytes, value: event.sequence.bigEndianBytes)
  }

  func apply(_ header: RecordHeader, payload: UnsafeRawBufferPointer, to tables: ProjectionTables) throws {
    try tables.putIfAbsent(Self.table, key: header.id.bytes, value: header.sequence.bigEndianBytes)
  }
}
