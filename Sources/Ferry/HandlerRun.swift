/// A handler called under a time limit (`Specs/task-events.md` §4.4): in a task of its own, so
/// that it can be cancelled when the limit passes and, if it ignores that, left behind.
enum HandlerRun {
  /// How a limited handler call ended.
  enum End: Sendable {
    /// The handler returned or threw; `timedOut`: after the limit had passed and it was cancelled.
    case ended(Result<TaskResult, any Error>, timedOut: Bool)
    /// The limit and the grace after it passed and the handler had not ended: it was left running,
    /// and nothing it does later is reported.
    case abandoned
  }

  private enum Signal: Sendable {
    case ended(Result<TaskResult, any Error>)
    case limit
    case graceOver
  }

  /// Calls `handler` in a new task; cancels that task when `limitMs` pass on the store's clock, or
  /// when the calling task is cancelled; returns when it ends, or `graceMs` after the limit
  /// cancelled it, whichever comes first.
  static func run(
    _ handler: @escaping @Sendable (RunningTask) async throws -> TaskResult, _ task: RunningTask,
    limitMs: Int64, graceMs: Int64, clock: @escaping @Sendable () -> Int64,
    sleep: @escaping @Sendable (Int64) async -> Void
  ) async -> End {
    let signals = Mailbox<Signal>()
    let work = Task {
      do {
        signals.put(.ended(.success(try await handler(task))))
      } catch {
        signals.put(.ended(.failure(error)))
      }
    }
    let timer = Task {
      await sleep(clock().addingSaturating(limitMs))
      if Task.isCancelled { return }
      signals.put(.limit)
      work.cancel()
      await sleep(clock().addingSaturating(graceMs))
      if Task.isCancelled { return }
      signals.put(.graceOver)
    }
    defer { timer.cancel() }
    return await withTaskCancellationHandler {
      var timedOut = false
      while true {
        // Signals arrive in the order they were given: an end before the limit is an end in time.
        for signal in await signals.takeAll() {
          switch signal {
          case .ended(let result): return .ended(result, timedOut: timedOut)
          case .limit: timedOut = true
          case .graceOver: return .abandoned
          }
        }
      }
    } onCancel: {
      work.cancel()  // a stopped pass: the handler sees cancellation, and is waited for as before
    }
  }
}

extension Int64 {
  /// `self + other`, clamped to the limits of `Int64`.
  func addingSaturating(_ other: Int64) -> Int64 {
    let (sum, overflow) = addingReportingOverflow(other)
    if overflow { return other < 0 ? .min : .max }
    return sum
  }
}
