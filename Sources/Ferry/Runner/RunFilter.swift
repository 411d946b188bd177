import FerryLog
import Foundation

/// Which tasks a pass considers.
public enum RunFilter: Sendable, Equatable {
  /// Every task that is not manual.
  case all
  /// The tasks of one group.
  case group(String)
  /// The tasks whose tags are in a collection given at setup.
  case collection(String)
  /// One task (the only way a manual task runs).
  case task(TaskID)
}
