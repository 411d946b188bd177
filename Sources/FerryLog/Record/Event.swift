/// An event to append: what happened, in the domain's own encoding.
public struct NewEvent: Sendable, Equatable {
  /// The payload already decoded by the code that encoded it (inside this package only): the
  /// projections are handed it on the live path instead of decoding the payload again. It must be
  /// what decoding `payload` gives; it is never stored, and a rebuild decodes the payload.
  package var decoded: (any Sendable)? = nil

  /// Equal when everything stored is equal (`decoded` is not stored).
  public static func == (a: NewEvent, b: NewEvent) -> Bool {
    a.type == b.type && a.schemaVersion == b.schemaVersion && a.payload == b.payload && a.id == b.id
      && a.timestamp == b.timestamp
  }

  /// The event type: 1 to 64 characters from `A-Z a-z 0-9 . _ : -`.
  public var type: String
  /// The version of the payload's schema for this type (see ``EventCatalog``).
  public var schemaVersion: UInt16
  /// The payload bytes; the log does not interpret them.
  public var payload: [UInt8]
  /// The event's identity. Give one to make the append idempotent (the same id is stored once);
  /// leave nil and the log makes a new time-ordered id.
  public var id: EventID?
  /// Wall-clock milliseconds to record; nil records the log's clock at append time.
  public var timestamp: Int64?

  /// Describes an event to append.
  public init(
    type: String, schemaVersion: UInt16 = 1, payload: [UInt8], id: EventID? = nil, timestamp: Int64? = nil
  ) {
    self.type = type
    self.schemaVersion = schemaVersion
    self.payload = payload
    self.id = id
    self.timestamp = timestamp
  }
}

/// An event read from (or just written to) the log, with the sequence number the log gave it.
public struct LoggedEvent: Sendable, Equatable {
  /// The decoded payload its appender handed along (``NewEvent/decoded``), on the live path only.
  package let decoded: (any Sendable)?

  /// Equal when everything stored is equal (`decoded` is not stored).
  public static func == (a: LoggedEvent, b: LoggedEvent) -> Bool {
    a.sequence == b.sequence && a.type == b.type && a.schemaVersion == b.schemaVersion
      && a.storedSchemaVersion == b.storedSchemaVersion && a.timestamp == b.timestamp && a.id == b.id
      && a.payload == b.payload
  }

  /// The event's position in the log: 1, 2, 3, ... with no gaps.
  public let sequence: UInt64
  /// The event type.
  public let type: String
  /// The schema version of `payload` (after any upcasting on read).
  public let schemaVersion: UInt16
  /// The schema version the record was stored with; differs from `schemaVersion` when upcast.
  public let storedSchemaVersion: UInt16
  /// Wall-clock milliseconds since the Unix epoch when the event was appended.
  public let timestamp: Int64
  /// The event's identity.
  public let id: EventID
  /// The payload bytes.
  public let payload: [UInt8]

  /// Creates a logged event (normally only the log does).
  public init(
    sequence: UInt64, type: String, schemaVersion: UInt16, storedSchemaVersion: UInt16? = nil,
    timestamp: Int64, id: EventID, payload: [UInt8]
  ) {
    self.init(
      sequence: sequence, type: type, schemaVersion: schemaVersion, storedSchemaVersion: storedSchemaVersion,
      timestamp: timestamp, id: id, payload: payload, decoded: nil)
  }

  package init(
    sequence: UInt64, type: String, schemaVersion: UInt16, storedSchemaVersion: UInt16?,
    timestamp: Int64, id: EventID, payload: [UInt8], decoded: (any Sendable)?
  ) {
    self.decoded = decoded
    self.sequence = sequence
    self.type = type
    self.schemaVersion = schemaVersion
    self.storedSchemaVersion = storedSchemaVersion ?? schemaVersion
    self.timestamp = timestamp
    self.id = id
    self.payload = payload
  }

  func upcast(to version: UInt16, payload: [UInt8]) -> LoggedEvent {
    LoggedEvent(
      sequence: sequence, type: type, schemaVersion: version, storedSchemaVersion: storedSchemaVersion,
      timestamp: timestamp, id: id, payload: payload)
  }
}

/// What a stored record says besides its payload: an event's fields before its payload is copied
/// out of the map (see ``InPlaceFolding``).
package struct RecordHeader: Sendable {
  package let sequence: UInt64
  package let type: String
  package let schemaVersion: UInt16
  package let timestamp: Int64
  package let id: EventID

  package init(sequence: UInt64, type: String, schemaVersion: UInt16, timestamp: Int64, id: EventID) {
    self.sequence = sequence
    self.type = type
    self.schemaVersion = schemaVersion
    self.timestamp = timestamp
    self.id = id
  }
}

extension LoggedEvent {
  /// The event a record's fields and payload make.
  package init(_ header: RecordHeader, payload: [UInt8]) {
    self.init(
      sequence: header.sequence, type: header.type, schemaVersion: header.schemaVersion,
      timestamp: header.timestamp,
      id: header.id, payload: payload)
  }
}

/// A projection of this package that can fold a record's payload where it lies in the map, so a
/// replay (a rebuild, a verify, a catch-up) copies no payload out per event. A replay uses it only
/// when every projection it folds into has it and the record needs no upcasting; it must fold
/// exactly as ``Projection/apply(_:to:)`` folds the same event.
package protocol InPlaceFolding: Projection {
  /// Folds the event whose fields are `header` and whose payload is `payload` (valid only during
  /// the call).
  func apply(_ header: RecordHeader, payload: UnsafeRawBufferPointer, to tables: ProjectionTables) throws
}
