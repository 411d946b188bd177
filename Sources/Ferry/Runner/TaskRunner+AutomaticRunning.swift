import FerryLog
import Foundation
import Synchronization

extension TaskRunner {
  /// Runs passes by itself: now, whenever a task is added, an error resolved, a dead task revived,
  /// a handler registered or the queue resumed, and when a retry time comes — unless the queue is
  /// paused (``TaskQueue/pause()``, which lasts across reopen).
  public func startAutomaticRunning() {
    state.withLock { s in
      guard s.automatic == nil else { return }
      let wakeup = WakeSignal()
      let updates = queue.updates()
      let loop = Task { [self] in
        let listener = Task {
          for await update in updates where Self.wakesAutomaticRunning(update) { wakeup.signal() }
        }
        // Runs of another process that dies are taken over: look for dead owners now and then.
        let interval = configuration.deadOwnerCheckInterval.checkPeriod
        let watcher = Task { [queue] in
          while !Task.isCancelled {
            try? await Task.sleep(for: interval)
            if Task.isCancelled { return }
            if let interrupted = try? await queue.interruptRunsOfDeadOwners(), !interrupted.isEmpty {
              wakeup.signal()
            }
          }
        }
        defer {
          listener.cancel()
          watcher.cancel()
        }
        while !Task.isCancelled {
          let passStart = queue.clock()
          // Never join a pass started by someone else: it may not have listed what woke us.
          var cutShort = false
          if (try? queue.isPaused()) == false {
            cutShort = (try? await pass(.all, joinRunning: false, automatic: true))?.cutShort ?? false
          }
          if Task.isCancelled { break }
          // A window's deadline (or its stop) cut the pass short: what it left is still to run.
          if cutShort { continue }
          let timer = nextRetryTime(from: passStart).map { at in
            Task {
              await queue.sleep(at)
              if !Task.isCancelled { wakeup.signal() }
            }
          }
          await wakeup.wait()
          timer?.cancel()
        }
      }
      s.automatic = (loop, wakeup)
    }
  }

  /// Whether a change may give automatic running work its last pass did not have: a task added,
  /// resolved, revived, interrupted or the queue resumed; and a run or task that ended — a
  /// success, cancel or expiry may make the next task of a group its head, a retryable failure
  /// sets a retry time the loop's timer was not set for, and any outcome (a final failure or an
  /// error recorded too) of a run whose task was cancelled while it ran removes that task, which
  /// held its group until then. Those of another runner or process matter most (a manual head
  /// run by `run(.task)`, a blocked head cancelled, an extension's one-off run that failed); the
  /// loop's own runs cost one more pass, which finds what its pass left.
  static func wakesAutomaticRunning(_ update: TaskUpdate) -> Bool {
    switch update {
    case .added, .errorResolved, .revived, .interrupted, .resumed, .succeeded, .cancelled, .expired, .failed,
      .errorRecorded:
      return true
    default: return false
    }
  }

  /// Whether passes run by themselves.
  public var isRunningAutomatically: Bool { state.withLock { $0.automatic != nil } }

  /// The earliest retry time or deadline at or after `passStart`. A time before it was considered by that
  /// pass; one that pass skipped for another reason (not ready, no handler) waits for another
  /// wake-up, so the loop never spins — and a time that came due during the pass is not missed.
  func nextRetryTime(from passStart: Int64) -> Int64? {
    try? queue.log.read { view in
      var tables = QueueTables(try view.tables(of: TaskQueueProjection.projectionName))
      // A deadline wakes the loop too: that pass's sweep expires the task.
      let times = [
        try tables.earliestRetry(atOrAfter: passStart), try tables.earliestDeadline(atOrAfter: passStart),
        deferred.earliest(atOrAfter: passStart),
      ]
      return times.compactMap { $0 }.min()
    }
  }
}
