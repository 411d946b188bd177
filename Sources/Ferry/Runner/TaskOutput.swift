import FerryLog
import Foundation

/// A small value a task's success leaves for later tasks — the id a server gave a record created
/// offline, an ETag: JSON, kept in the success's event (at most ``maxSize`` bytes).
public struct TaskOutput: Sendable, Equatable {
  /// The largest output, in bytes of JSON: outputs are kept in the queue, not in a blob store.
  public static let maxSize = 64 * 1024
  /// The output's JSON bytes.
  public let bytes: [UInt8]

  /// Encodes `value` as JSON; ``FerryError/invalidArgument(_:)`` when it does not encode or is
  /// larger than ``maxSize``.
  public init(_ value: some Encodable) throws(FerryError) {
    let data: Data
    do {
      data = try JSONEncoder().encode(value)
    } catch {
      throw FerryError.invalidArgument("the task output does not encode as JSON: \(error)")
    }
    try self.init(bytes: Array(data))
  }

  /// Wraps JSON bytes already encoded; ``FerryError/invalidArgument(_:)`` past ``maxSize``.
  public init(bytes: [UInt8]) throws(FerryError) {
    guard bytes.count <= Self.maxSize else {
      throw FerryError.invalidArgument(
        "a task output has \(bytes.count) bytes; at most \(Self.maxSize) are kept")
    }
    self.bytes = bytes
  }

  init(stored bytes: [UInt8]) { self.bytes = bytes }

  /// Decodes the output as `type`; ``FerryError/invalidArgument(_:)`` when it does not decode.
  public func decode<Value: Decodable>(as type: Value.Type) throws(FerryError) -> Value {
    do {
      return try JSONDecoder().decode(type, from: Data(bytes))
    } catch {
      throw FerryError.invalidArgument("the task output does not decode as \(type): \(error)")
    }
  }
}
