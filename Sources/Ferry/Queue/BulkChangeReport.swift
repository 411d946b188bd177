import FerryLog
import Foundation

/// What a change of many tasks at once did (``TaskQueue/resolveErrors(tag:)``, …).
public struct BulkChangeReport: Sendable, Equatable {
  /// The tasks changed, in id order.
  public internal(set) var changed: [TaskID] = []
  /// The tasks left alone because a run of them is under way, in id order.
  public internal(set) var running: [TaskID] = []
}
