import FerryLog
import Foundation
import Synchronization

extension TaskRunner {
  /// How a batched handler's call ended, when its pass was not stopped.
  private enum BatchEnd {
    /// It returned outcomes by task id.
    case results([TaskID: TaskResult])
    /// It threw: every task fails as a throw of a one-task handler would.
    case threw(any Error)
    /// It timed out: every task has this outcome.
    case all(TaskResult)
  }

  /// Calls a batched handler with its claimed runs (in claim order: group tasks consecutive, in
  /// group order) and turns its answer into each run's events. The group rule: once a task of a
  /// group does not succeed, the later tasks of that group in the batch are given back
  /// (`task.runInterrupted`: no attempt spent) whatever the handler said of them.
  func runBatch(_ runs: [ClaimedRun], control: PassControl? = nil) async -> [Finished] {
    // The batch's one lane was reserved before its claims committed; it ends here.
    defer { queue.endRuns(1) }
    var ended = await batchOutcomes(runs, control: control)
    if !ended.isEmpty {
      for index in ended.indices { ended[index].endsLane = false }
      ended[ended.count - 1].endsLane = true
    }
    return ended
  }

  private func batchOutcomes(_ runs: [ClaimedRun], control: PassControl?) async -> [Finished] {
    guard let first = runs.first else { return [] }
    for run in runs { queue.publish(.running(run.task.id, attempt: run.claim.attempt)) }
    let dropsBefore = configuration.connectivity?.timesWentOffline ?? 0
    let offlineAtStart = !isOnline
    let started = runs.map { queue.observer.runStarted($0) }
    queue.observer.batchStarted(runs)
    defer { for (run, at) in zip(runs, started) { queue.observer.runEnded(run, startedAt: at) } }
    guard let registration = state.withLock({ $0.handlers[first.task.tag] }), let batch = registration.batch,
      !queue.log.isClosed
    else {
      // Unregistered (or registered one task a call) since the claim, or the queue closed: no call.
      return runs.map { Finished($0, [.runInterrupted($0.task.id)], .interrupted) }
    }
    let handlerCall = HandlerCall()
    let scope = HandlerScope(
      store: queue.log.path, taskId: first.task.id, batchIds: runs.dropFirst().map(\.task.id),
      pass: control.map(ObjectIdentifier.init), call: handlerCall)
    let called: Result<BatchEnd, CancellationError> = await Self.$handlerScope.withValue(scope) {
      do throws(CancellationError) {
        return .success(try await callBatch(registration, batch.handler, runs, handlerCall))
      } catch {
        return .failure(error)
      }
    }
    handlerCall.end()
    guard case .success(let end) = called else {
      return runs.map { Finished($0, [.runInterrupted($0.task.id)], .interrupted) }
    }
    var stoppedGroups: Set<String> = []
    var ended: [Finished] = []
    ended.reserveCapacity(runs.count)
    for run in runs {
      let id = run.task.id
      if let group = run.task.groupId, stoppedGroups.contains(group) {
        // An earlier task of its group did not succeed: this one must not be taken as applied.
        ended.append(Finished(run, [.runInterrupted(id)], .skipped(.partOfFailedGroup)))
        continue
      }
      let result: TaskResult
      switch end {
      case .results(let results): result = results[id] ?? .deferred(Self.noOutcome)
      case .threw(let error): result = failure(error, of: id)
      case .all(let outcome): result = outcome
      }
      let done = finished(run, result, registration, offlineAtStart: offlineAtStart, dropsBefore: dropsBefore)
      if done.outcome != .succeeded, let group = run.task.groupId { stoppedGroups.insert(group) }
      ended.append(done)
    }
    return ended
  }

  /// ``call(_:_:_:)`` for a batched handler: the time limit applies to the call as a whole.
  private func callBatch(
    _ registration: Registration,
    _ handler: @escaping @Sendable ([RunningTask]) async throws -> [TaskID: TaskResult],
    _ runs: [ClaimedRun], _ handlerCall: HandlerCall
  ) async throws(CancellationError) -> BatchEnd {
    let tasks = runs.map { run in
      RunningTask(
        id: run.task.id, tag: run.task.tag, dataId: run.task.dataId, groupId: run.task.groupId,
        attempt: run.claim.attempt, payloadBytes: run.payload, payloadEventId: run.payloadEventId)
    }
    guard let first = runs.first, let firstTask = tasks.first else { return .results([:]) }
    let limitMs = (registration.timeLimit ?? configuration.defaultTimeLimit).map { max(1, $0.milliseconds) }
    let graceMs = max(0, configuration.timeLimitGrace.milliseconds)
    func timedOut() -> String { "timed out after \(Self.readable(milliseconds: limitMs ?? 0))" }
    // HandlerRun carries one result; the batch's answers go beside it.
    let answers = BatchAnswers()
    switch await HandlerRun.run(
      { _ in
        handlerCall.enter()
        answers.set(try await handler(tasks))
        return .succeeded
      }, firstTask, limitMs: limitMs, graceMs: graceMs,
      stopGraceMs: max(0, configuration.interruptionGrace.milliseconds), clock: queue.clock,
      sleep: queue.sleep)
    {
    case .ended(.success, _, _):
      return .results(answers.value ?? [:])
    case .ended(.failure, _, stopped: true), .abandoned(_, stopped: true):
      throw CancellationError()
    case .ended(.failure(let error), timedOut: false, stopped: false):
      return .threw(error)
    case .ended(.failure, timedOut: true, stopped: false):
      queue.observer.timedOut(first, limitMs: limitMs ?? 0, abandoned: false)
      return .all(.failed(timedOut(), retryable: true))
    case .abandoned(timedOut: _, stopped: false):
      queue.observer.timedOut(first, limitMs: limitMs ?? 0, abandoned: true)
      return .all(
        .failed(
          "\(timedOut()); the batch handler did not stop within \(Self.readable(milliseconds: graceMs)) of being "
            + "cancelled and was left running (what it returns is not logged)", retryable: true))
    }
  }
}
