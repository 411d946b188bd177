import Synchronization

/// One handler call: the task that runs it (known once it starts) and whether it is still under
/// way. A request made from that very task while it runs would wait for itself; one made from a
/// task it started is another task, and one made after it ended waits for nothing of it.
final class HandlerCall: Sendable {
  private let state = Mutex<(task: Int?, ended: Bool)>((nil, false))

  /// Called first thing in the handler's own task.
  func enter() {
    let task = withUnsafeCurrentTask { $0?.hashValue }
    state.withLock { $0.task = task }
  }

  /// The runner is done with the call (it returned, threw, or was left behind).
  func end() { state.withLock { $0.ended = true } }

  /// Whether the current task is the handler's own and its call is still under way. (A task's
  /// identity is unique among live tasks; once the call ended, a new task that took its place in
  /// memory is not mistaken for it.)
  var isCurrentTask: Bool {
    guard let current = withUnsafeCurrentTask(body: { $0?.hashValue }) else { return false }
    return state.withLock { !$0.ended && $0.task == current }
  }
}
