import FerryLog
import Foundation

/// A task's id: the sequence number of the event that added it. Ids are never reused, and their
/// order is the order tasks were added (FIFO by log order, never by wall clock).
///
/// It prints, parses and encodes as its bare number (`42`), the same as the log and `ferry`
/// show it, so an id can travel through a URL, a notification or JSON and come back.
public struct TaskID: RawRepresentable, Hashable, Comparable, Sendable, Codable, LosslessStringConvertible,
  CustomStringConvertible
{
  /// The sequence number of the task's `task.added` event.
  public let rawValue: UInt64

  /// The id whose add event has this sequence number.
  public init(rawValue: UInt64) { self.rawValue = rawValue }

  /// Parses an id from its bare number; nil for anything else.
  public init?(_ description: String) {
    guard let value = UInt64(description) else { return nil }
    self.init(rawValue: value)
  }

  /// The bare number.
  public var description: String { String(rawValue) }

  /// Whether `lhs` was added before `rhs`.
  public static func < (lhs: TaskID, rhs: TaskID) -> Bool { lhs.rawValue < rhs.rawValue }

  // A bare number, not `{"rawValue": 42}`: JSON written before ids had a type reads the same.

  /// Reads an id encoded as its bare number.
  public init(from decoder: any Decoder) throws {
    self.init(rawValue: try decoder.singleValueContainer().decode(UInt64.self))
  }

  /// Encodes the id as its bare number.
  public func encode(to encoder: any Encoder) throws {
    var container = encoder.singleValueContainer()
    try container.encode(rawValue)
  }
}

// The storage boundary: keys and event fields hold the bare sequence number.
extension TaskID {
  /// Reads an id from the 8 big-endian bytes of a key; nil when the size differs.
  init?<C: Collection>(bigEndianBytes bytes: C) where C.Element == UInt8 {
    guard let value = UInt64(bigEndianBytes: bytes) else { return nil }
    self.init(rawValue: value)
  }

  /// The id's 8 bytes, most significant first: keys built from these sort in id order.
  var bigEndianBytes: [UInt8] { rawValue.bigEndianBytes }

  /// Below every id: a cursor before the first task (sequences start at 1).
  static let zero = TaskID(rawValue: 0)
  /// The largest id: no id follows it.
  static let max = TaskID(rawValue: .max)

  /// The id after this one; ids are sequence numbers, so a scan from it skips this id alone.
  var next: TaskID { TaskID(rawValue: rawValue &+ 1) }
}
