import Synchronization

/// The tasks a runner's runs deferred (``TaskResult/deferred(_:)``), each until a time on the
/// store's clock: its passes pass over them (their group waits with them) until then, or until
/// connectivity returns or ``TaskRunner/conditionsChanged()`` forgets them all. Kept in memory
/// only: another runner, process or launch tries them at once, which costs no attempt.
final class DeferredTasks: Sendable {
  private let state = Mutex<[TaskID: Int64]>([:])

  func insert(_ id: TaskID, until: Int64) { state.withLock { $0[id] = until } }
  func contains(_ id: TaskID, now: Int64) -> Bool {
    state.withLock { s in
      guard let until = s[id] else { return false }
      if until > now { return true }
      s[id] = nil
      return false
    }
  }
  /// The earliest time at or after `start` a deferred task may be tried again. Deferrals that
  /// ended before `start` are forgotten, not returned: a pass that began at `start` would have
  /// tried their tasks, and one that did not reach them — the task cancelled or run by another
  /// process, the pass offline or the queue paused — would not reach them on the next wake-up
  /// either, so a time in the past would wake its loop again at once, for ever.
  func earliest(atOrAfter start: Int64) -> Int64? {
    state.withLock { s in
      if s.isEmpty { return nil }
      s = s.filter { $0.value >= start }
      return s.values.min()
    }
  }
  var isEmpty: Bool { state.withLock { $0.isEmpty } }
  func removeAll() { state.withLock { $0.removeAll() } }
}
