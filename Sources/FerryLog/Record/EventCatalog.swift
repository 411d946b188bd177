#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// The event types a log accepts, with the current schema version of each and the upcasters that
/// bring older payloads up to it.
///
/// Stored bytes are never rewritten: an event stored at schema version 1 of a type now at version 3
/// is read through the upcasters 1→2 and 2→3 every time it is read, and projections only ever see
/// current payloads.
///
/// ```swift
/// let catalog = EventCatalog([
///   .init("item.added", version: 2, upcasters: [1: { v1 in v1 + [0] }]),  // v2 added a flag byte
///   .init("item.removed"),
/// ])
/// ```
public struct EventCatalog: Sendable {
  /// One event type.
  public struct EventType: Sendable {
    /// The type's name.
    public let name: String
    /// The schema version this code writes.
    public let version: UInt16
    /// Upcasters keyed by the version they read: `upcasters[v]` turns a version `v` payload into `v + 1`.
    public let upcasters: [UInt16: @Sendable ([UInt8]) throws -> [UInt8]]

    /// Declares an event type.
    public init(
      _ name: String, version: UInt16 = 1, upcasters: [UInt16: @Sendable ([UInt8]) throws -> [UInt8]] = [:]
    ) {
      self.name = name
      self.version = version
      self.upcasters = upcasters
    }
  }

  /// The types, by name.
  public let types: [String: EventType]

  /// The types with their names' UTF-8 bytes, for reading records: a record's type bytes are
  /// matched here (count, then bytes) before any string is made or hashed.
  let known: [(bytes: [UInt8], type: EventType, isValidName: Bool)]

  /// A catalog of the given types, plus ``EventLog/lostEventType`` (which every log accepts).
  public init(_ types: [EventType]) {
    var byName = Dictionary(types.map { ($0.name, $0) }, uniquingKeysWith: { _, last in last })
    byName[EventLog.lostEventType] = EventType(EventLog.lostEventType)
    self.types = byName
    known = byName.values.sorted { $0.name < $1.name }.map {
      (Array($0.name.utf8), $0, EventRecord.isValidType($0.name))
    }
  }

  /// The type whose name is `bytes`, or nil.
  func type(named bytes: UnsafeRawBufferPointer) -> (type: EventType, isValidName: Bool)? {
    index(named: bytes).map { (known[$0].type, known[$0].isValidName) }
  }

  /// The index in `known` of the type whose name is `bytes`, or nil: a replay reads the fields it
  /// needs from there, where a copy of the entry retained its type's name and upcasters.
  func index(named bytes: UnsafeRawBufferPointer) -> Int? {
    // By index, each name's bytes compared in place: `for entry in known` copied every entry it
    // passed over (retaining its bytes and its type's fields), for every record read.
    for index in known.indices where known[index].bytes.count == bytes.count {
      let equal = known[index].bytes.withUnsafeBytes { name in
        guard let a = name.baseAddress, let b = bytes.baseAddress else { return name.count == bytes.count }
        return memcmp(a, b, bytes.count) == 0
      }
      if equal { return index }
    }
    return nil
  }

  /// Checks an event about to be appended and returns its type (one lookup for the check and
  /// the upcast that may follow).
  func validatedType(of event: NewEvent) throws(FerryLogError) -> EventType {
    guard let type = types[event.type] else { throw .unknownEventType(type: event.type, sequence: nil) }
    guard event.schemaVersion >= 1, event.schemaVersion <= type.version else {
      throw .unsupportedSchemaVersion(
        type: event.type, version: event.schemaVersion, supported: type.version, sequence: nil)
    }
    return type
  }

  /// Brings an event to its type's current schema version (`type`: its entry, when the caller
  /// has found it already).
  func upcast(_ event: LoggedEvent, type found: EventType? = nil) throws(FerryLogError) -> LoggedEvent {
    guard let type = found ?? types[event.type] else {
      throw .unknownEventType(type: event.type, sequence: event.sequence)
    }
    if event.schemaVersion == type.version { return event }
    guard event.schemaVersion < type.version else {
      throw .unsupportedSchemaVersion(
        type: event.type, version: event.schemaVersion, supported: type.version, sequence: event.sequence)
    }
    var payload = event.payload
    var version = event.schemaVersion
    while version < type.version {
      guard let upcaster = type.upcasters[version] else {
        throw .unsupportedSchemaVersion(
          type: event.type, version: event.schemaVersion, supported: type.version, sequence: event.sequence)
      }
      do {
        payload = try upcaster(payload)
      } catch {
        throw .corruptRecord(
          sequence: event.sequence,
          reason: "upcasting '\(event.type)' from version \(version) failed: \(error)")
      }
      version += 1
    }
    return event.upcast(to: version, payload: payload)
  }
}
