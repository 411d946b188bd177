import Ferry
import FerryLog
import Foundation

/// A JSON value, for showing a task's payload decoded (`payloadJSON` in `ferry export` and
/// `ferry log --json`). Whole numbers that fit 64 bits stay whole.
package indirect enum JSONValue: Codable, Sendable, Equatable {
  /// `null`.
  case null
  /// `true` or `false`.
  case bool(Bool)
  /// A whole number that fits 64 bits.
  case integer(Int64)
  /// Any other number.
  case number(Double)
  /// A string.
  case string(String)
  /// An array.
  case array([JSONValue])
  /// An object.
  case object([String: JSONValue])

  /// Reads `bytes` as UTF-8 JSON (any value at the top); nil when they are not.
  package init?(jsonBytes bytes: [UInt8]) {
    guard let value = try? JSONDecoder().decode(JSONValue.self, from: Data(bytes)) else { return nil }
    self = value
  }

  /// Reads one JSON value.
  package init(from decoder: any Decoder) throws {
    let container = try decoder.singleValueContainer()
    if container.decodeNil() {
      self = .null
    } else if let bool = try? container.decode(Bool.self) {
      self = .bool(bool)
    } else if let integer = try? container.decode(Int64.self) {
      self = .integer(integer)
    } else if let number = try? container.decode(Double.self) {
      self = .number(number)
    } else if let string = try? container.decode(String.self) {
      self = .string(string)
    } else if let array = try? container.decode([JSONValue].self) {
      self = .array(array)
    } else {
      self = .object(try container.decode([String: JSONValue].self))
    }
  }

  /// Writes it as JSON.
  package func encode(to encoder: any Encoder) throws {
    var container = encoder.singleValueContainer()
    switch self {
    case .null: try container.encodeNil()
    case .bool(let value): try container.encode(value)
    case .integer(let value): try container.encode(value)
    case .number(let value): try container.encode(value)
    case .string(let value): try container.encode(value)
    case .array(let value): try container.encode(value)
    case .object(let value): try container.encode(value)
    }
  }
}

/// The app's payload a queue event carries (`task.added`, `task.payloadUpdated`): the JSON bytes a
/// run is handed. Nil for other events and for events that do not decode.
func appPayload(_ event: LoggedEvent) -> [UInt8]? {
  guard event.type == "task.added" || event.type == "task.payloadUpdated", let decoded = try? TaskEvent(event)
  else { return nil }
  switch decoded {
  case .added(_, let payload, _, _, _, _, _, _, _): return payload
  case .payloadUpdated(_, let payload): return payload
  default: return nil
  }
}

/// The app's payload of `event` decoded as JSON, when it carries one that is UTF-8 JSON.
func payloadJSON(_ event: LoggedEvent) -> JSONValue? {
  appPayload(event).flatMap { JSONValue(jsonBytes: $0) }
}
