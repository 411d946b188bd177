import FerryLog
import Foundation

/// What `add` does when a task with the same tag and data id (a *twin*) is already queued.
public enum UniquePolicy: UInt8, Sendable, CaseIterable {
  /// Add another task regardless (the default).
  case append = 0
  /// Keep the existing task and add nothing; `add` returns the existing task's id. Only a twin
  /// that will still run keeps the new task out: one ready, waiting for a retry, running, or
  /// blocked by an error (it runs once the error is resolved). A dead twin never does — it would
  /// never send the newer change: the new task is added after it, and the dead one stays, dead and
  /// visible, until it is revived or cancelled.
  case keep = 1
  /// Cancel every twin, then add the new one. A twin whose run is under way is cancelled too: its
  /// handler runs on and its outcome is logged, but it leaves the queue at once and never runs
  /// again, and its group's next task waits until that handler has ended.
  case replace = 2
}
