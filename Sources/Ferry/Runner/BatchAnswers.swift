import Synchronization

/// What a batched handler returned, set in its call's task before that call ends.
final class BatchAnswers: Sendable {
  private let state = Mutex<[TaskID: TaskResult]?>(nil)
  func set(_ answers: [TaskID: TaskResult]) { state.withLock { $0 = answers } }
  var value: [TaskID: TaskResult]? { state.withLock { $0 } }
}
