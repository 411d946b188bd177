import Synchronization

/// Hands every ``TaskUpdate`` of this process to the streams observing it.
final class TaskUpdates: Sendable {
  private struct State {
    var next = 0
    var subscribers: [Int: (filter: TaskID?, continuation: AsyncStream<TaskUpdate>.Continuation)] = [:]
  }
  private let state = Mutex(State())

  func publish(_ update: TaskUpdate) {
    let targets = state.withLock { s in
      s.subscribers.values.filter { $0.filter == nil || $0.filter == update.taskId || update.taskId == nil }
        .map(\.continuation)
    }
    for continuation in targets { continuation.yield(update) }
  }

  /// A stream of updates (for one task when `filter` is given), starting with what `first` says.
  /// `first` runs while publishing waits, so no update falls between it and the subscription (one
  /// may be seen twice: in `first`'s state and as an update).
  func stream(filter: TaskID?, first: () throws -> TaskUpdate?) rethrows -> AsyncStream<TaskUpdate> {
    let (stream, continuation) = AsyncStream<TaskUpdate>.makeStream(bufferingPolicy: .bufferingNewest(10_000))
    let token = try state.withLock { s in
      if let update = try first() { continuation.yield(update) }
      s.next += 1
      s.subscribers[s.next] = (filter, continuation)
      return s.next
    }
    continuation.onTermination = { [weak self] _ in
      _ = self?.state.withLock { $0.subscribers.removeValue(forKey: token) }
    }
    return stream
  }

  /// Ends every stream.
  func finish() {
    let all = state.withLock { s in
      defer { s.subscribers = [:] }
      return s.subscribers.values.map(\.continuation)
    }
    for continuation in all { continuation.finish() }
  }
}
