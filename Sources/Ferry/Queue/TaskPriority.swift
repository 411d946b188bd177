import FerryLog
import Foundation

/// How urgent a task is: among the tasks that may start now, a pass claims higher priorities
/// first (`Specs/task-events.md` §4.3). Within one priority the order is unchanged: due retries
/// by retry time, then ready tasks by id. Priority never reorders a group: a group's tasks run in
/// id order, and its head competes with the head's own priority.
///
/// ``low``, ``normal`` and ``high`` are the usual levels; any `Int8` is a level of its own
/// (larger is more urgent), for apps that need more than three.
public struct TaskPriority: RawRepresentable, Hashable, Comparable, Sendable, CustomStringConvertible {
  /// The level as stored in the log: larger runs first; 0 is ``normal``.
  public let rawValue: Int8

  /// A level: larger runs first.
  public init(rawValue: Int8) { self.rawValue = rawValue }

  /// Runs after the normal and high tasks that may start.
  public static let low = TaskPriority(rawValue: -1)
  /// The default.
  public static let normal = TaskPriority(rawValue: 0)
  /// Runs before the normal and low tasks that may start.
  public static let high = TaskPriority(rawValue: 1)

  /// Whether `lhs` is less urgent than `rhs`.
  public static func < (lhs: TaskPriority, rhs: TaskPriority) -> Bool { lhs.rawValue < rhs.rawValue }

  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    switch self {
    case .low: return "low"
    case .normal: return "normal"
    case .high: return "high"
    default: return "priority \(rawValue)"
    }
  }

  /// The first byte of an index key: higher priorities sort first (127 → 0, −128 → 255).
  var indexLevel: UInt8 { UInt8(127 - Int(rawValue)) }
}
