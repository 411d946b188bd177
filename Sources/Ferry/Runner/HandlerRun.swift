import Synchronization

/// A handler called in a task of its own (`Specs/task-events.md` §4.4), so that it can be
/// cancelled — when its time limit passes, or when its pass is stopped (``TaskRunner/stop()``, a
/// window's deadline, the window's caller cancelled) — and, if it ignores that, left behind.
enum HandlerRun {
  /// How a handler call ended.
  enum End: Sendable {
    /// The handler returned or threw. `timedOut`: after its limit had passed and it was
    /// cancelled; `stopped`: after its pass was stopped and it was cancelled.
    case ended(Result<TaskResult, any Error>, timedOut: Bool, stopped: Bool)
    /// It was cancelled (limit or stop) and had not ended when the grace after that passed: it was
    /// left running, and nothing it does later is reported.
    case abandoned(timedOut: Bool, stopped: Bool)
  }

  fileprivate enum Signal: Sendable {
    case ended(Result<TaskResult, any Error>)
    case limit
    case graceOver
    case stopped
    case stopGraceOver
  }

  /// Calls `handler` in a new task; cancels that task when `limitMs` (if any) pass on the store's
  /// clock, or when the calling task is cancelled (its pass was stopped); returns when it ends, or
  /// `graceMs` after the limit, or `stopGraceMs` after the stop, whichever comes first.
  static func run(
    _ handler: @escaping @Sendable (RunningTask) async throws -> TaskResult, _ task: RunningTask,
    limitMs: Int64?, graceMs: Int64, stopGraceMs: Int64, clock: @escaping @Sendable () -> Int64,
    sleep: @escaping @Sendable (Int64) async -> Void
  ) async -> End {
    let signals = Signals()
    let work = Task {
      do {
        signals.put(.ended(.success(try await handler(task))))
      } catch {
        signals.put(.ended(.failure(error)))
      }
    }
    let timer = limitMs.map { limitMs in
      Task {
        await sleep(clock().addingSaturating(limitMs))
        if Task.isCancelled { return }
        signals.put(.limit)
        work.cancel()
        await sleep(clock().addingSaturating(graceMs))
        if Task.isCancelled { return }
        signals.put(.graceOver)
      }
    }
    // The grace timer a stop starts; `done` once this call has returned (a late stop starts none).
    let stopTimer = Mutex<(timer: Task<Void, Never>?, done: Bool)>((nil, false))
    defer {
      timer?.cancel()
      stopTimer.withLock { s -> Task<Void, Never>? in
        s.done = true
        return s.timer
      }?.cancel()
    }
    return await withTaskCancellationHandler {
      var timedOut = false
      var stopped = false
      while true {
        // Signals arrive in the order they were given: an end before the limit (or the stop) is
        // an end in time.
        for signal in await signals.takeAll() {
          switch signal {
          case .ended(let result): return .ended(result, timedOut: timedOut, stopped: stopped)
          case .limit: timedOut = true
          case .graceOver: return .abandoned(timedOut: true, stopped: stopped)
          case .stopped: stopped = true
          case .stopGraceOver: return .abandoned(timedOut: timedOut, stopped: true)
          }
        }
      }
    } onCancel: {
      // The stop is told before the handler is cancelled: whatever the cancel makes it do comes after.
      signals.put(.stopped)
      work.cancel()
      stopTimer.withLock { s in
        guard !s.done, s.timer == nil else { return }
        s.timer = Task {
          await sleep(clock().addingSaturating(stopGraceMs))
          if !Task.isCancelled { signals.put(.stopGraceOver) }
        }
      }
    }
  }
}

/// The signals of one handler call, a ``MailboxCore`` in a class that is not generic: a generic
/// class's deinit is never specialized and asks the runtime for its state's type metadata each
/// time (`bash Tools/cost.sh` shows the difference).
private final class Signals: Sendable {
  let core = MailboxCore<HandlerRun.Signal>()
  func put(_ signal: HandlerRun.Signal) { core.put(signal) }
  func takeAll() async -> [HandlerRun.Signal] { await core.takeAll() }
}

extension Int64 {
  /// `self + other`, clamped to the limits of `Int64`.
  func addingSaturating(_ other: Int64) -> Int64 {
    let (sum, overflow) = addingReportingOverflow(other)
    if overflow { return other < 0 ? .min : .max }
    return sum
  }
}
