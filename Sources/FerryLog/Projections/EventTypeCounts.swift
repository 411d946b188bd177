/// Counts the events of each type: a ready-made projection (and the smallest complete example of one).
///
/// Table `counts`: key = the type's UTF-8 bytes, value = u64 big-endian count.
///
/// ```swift
/// let log = try EventLog.open(at: path, configuration: .init(projections: [EventTypeCounts()]))
/// let counts = try log.read { try EventTypeCounts.counts(in: $0.tables(of: "eventTypeCounts")) }
/// ```
public struct EventTypeCounts: Projection {
  /// The projection's name (`eventTypeCounts` unless given).
  public let name: String
  /// Its version.
  public let version: UInt32
  /// Its one table, `counts`.
  public let tables = ["counts"]

  /// A type-count projection under `name`.
  public init(name: String = "eventTypeCounts", version: UInt32 = 1) {
    self.name = name
    self.version = version
  }

  /// Adds one to the count of the event's type.
  public func apply(_ event: LoggedEvent, to tables: ProjectionTables) throws {
    try count(event.type, in: tables)
  }

  private func count(_ type: String, in tables: ProjectionTables) throws {
    let key = Array(type.utf8)
    let count = try tables.get("counts", key: key).flatMap { UInt64(bigEndianBytes: $0) } ?? 0
    let (next, overflow) = count.addingReportingOverflow(1)
    try tables.put("counts", key: key, value: (overflow ? count : next).bigEndianBytes)  // saturates
  }

  /// Reads the counts back from the projection's tables.
  public static func counts(in tables: some ProjectionTableReading) throws -> [String: UInt64] {
    var result: [String: UInt64] = [:]
    try tables.scan("counts", from: nil) { key, value in
      result[String(decoding: key, as: UTF8.self)] = UInt64(bigEndianBytes: value)
      return true
    }
    return result
  }
}

extension EventTypeCounts: InPlaceFolding {
  package func apply(
    _ header: RecordHeader, payload: UnsafeRawBufferPointer, to tables: ProjectionTables
  ) throws {
    try count(header.type, in: tables)
  }
}
