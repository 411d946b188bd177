import FerryLog
import Foundation
import Synchronization

extension TaskRunner {
  /// Runs one task now, or waits for the run another runner has under way, and reports its outcome.
  func runSingle(_ id: TaskID) async throws -> PassReport {
    try await queue.interruptRunsOfDeadOwners()
    let owner = try queue.runOwner().id
    let runner = number
    let clock = queue.clock
    var checked = false
    while true {
      if !isOnline {
        var report = PassReport()
        report.entries = [PassReport.Entry(taskId: id, outcome: skip(id, .offline))]
        report.offline = true
        return queue.observer.passEnded(report)
      }
      let handlers = handlerInfo
      let isChecked = checked
      queue.reserveRuns(1)
      let decision: SingleClaim
      do {
        decision = try await queue.log.execute { context in
          let decision = try ClaimSearch.claim(
            id, context, owner: owner, runner: runner, now: clock(), handlers: handlers, checked: isChecked)
          if case .claimed = decision { context.mayDeferFlush() }
          return decision
        }
      } catch {
        queue.endRuns(1)
        throw error
      }
      if case .claimed = decision {} else { queue.endRuns(1) }
      let outcome: RunOutcome
      switch decision {
      case .gone:
        outcome = skip(id, .noLongerQueued)
      case .expired:
        queue.publish(.expired(id))
        outcome = .expired
      case .skip(let reason):
        outcome = skip(id, reason)
      case .check(let task):
        guard let registration = state.withLock({ $0.handlers[task.tag] }) else {
          outcome = skip(id, .noHandler)
          break
        }
        if !(await isReady(task, registration)) {
          outcome = skip(id, .notReady)
          break
        }
        checked = true
        continue
      case .claimed(let run):
        let finished = await runClaimed(run)
        let logged = try await logOutcomes([finished])
        outcome = logged.first == .logged ? finished.outcome : .interrupted
      case .runningElsewhere(let head, let claim):
        outcome = try await awaitOutcome(of: id, claim: claim, after: head)
      }
      var report = PassReport()
      report.entries = [PassReport.Entry(taskId: id, outcome: outcome)]
      return queue.observer.passEnded(report)
    }
  }

  /// Waits for the end of a run that another runner (maybe in another process) owns, reading the
  /// log; a run whose owner dies meanwhile is interrupted, and that is its outcome. While nothing
  /// comes it looks at the task itself: a task that left the queue (cancelled, cleared — its run's
  /// outcome may never be logged, or compaction may have removed it) or whose claim changed without
  /// an outcome in the log ends the wait with what the queue says.
  private func awaitOutcome(
    of id: TaskID, claim: TaskRow.Claim, after head: UInt64
  ) async throws -> RunOutcome {
    var last = head
    var idle = 0
    while true {
      try Task.checkCancellation()
      let events = try queue.log.events(after: last, limit: 1000)
      for event in events {
        last = event.sequence
        guard TaskEvent.typeSet.contains(event.type), let decoded = try? TaskEvent(event) else { continue }
        switch decoded {
        case .runSucceeded(id, _): return .succeeded
        case .runFailed(id, let message, _, let next):
          return .failed(message, retryAt: next.map(Date.init(unixMilliseconds:)))
        case .runInterrupted(id): return .interrupted
        // Deferred (a batch gave it no outcome, or it was offline): its attempt given back, not cut short.
        case .runDeferred(id, let reason): return .deferred(reason)
        case .errorRecorded(id, let message, true): return .errorRecorded(message)
        // Cancelled (or cleared) while the other runner's run goes on: the task has left the queue
        // (its row waits for that run only to hold its group), which ends the wait as it always did.
        case .cancelled(id), .cleared: return skip(id, .noLongerQueued)
        default: continue
        }
      }
      guard events.isEmpty else { continue }
      idle += 1
      if idle % 20 == 0 { try await queue.interruptRunsOfDeadOwners() }
      if idle % 4 == 0 {
        // Read after the events above: an outcome logged before this read was seen already.
        let row = try queue.log.read { view in
          try QueueTables(view.tables(of: TaskQueueProjection.projectionName)).row(id)
        }
        if row?.claim != claim || row?.isQueued == false {
          // The outcome may have come in between the two reads: read it first.
          if try !queue.log.events(after: last, limit: 1).isEmpty { continue }
          return row?.isQueued != true ? skip(id, .noLongerQueued) : .interrupted
        }
      }
      try await Task.sleep(for: .milliseconds(50))
    }
  }
}
