import FerryLog
import Foundation
import Synchronization

extension TaskRunner {
  /// Calls the handler of a claimed run and turns its result into the events that end the run.
  func runClaimed(_ run: ClaimedRun, control: PassControl? = nil) async -> Finished {
    let task = run.task
    let attempt = run.claim.attempt
    // The run was reserved before its claim committed (``TaskQueue/reserveRuns(_:)``); it ends here.
    defer { queue.endRuns(1) }
    queue.publish(.running(task.id, attempt: attempt))
    // How often the network had gone away when the run began: a drop during the run, even one
    // already over when the handler returns, makes its retryable failure a deferral.
    let dropsBefore = configuration.connectivity?.timesWentOffline ?? 0
    let offlineAtStart = !isOnline  // read after the count: a drop between the two is seen by one
    let started = queue.observer.runStarted(run)
    defer { queue.observer.runEnded(run, startedAt: started) }
    guard let registration = state.withLock({ $0.handlers[task.tag] }), !queue.log.isClosed else {
      // Unregistered between the claim and now, or the queue was closed (its outcome could not
      // be logged): the handler is not called, and the run ends at once, ready again.
      return Finished(run, [.runInterrupted(task.id)], .interrupted)
    }
    let handlerCall = HandlerCall()
    let scope = HandlerScope(
      store: queue.log.path, taskId: task.id, pass: control.map(ObjectIdentifier.init), call: handlerCall)
    let called: Result<TaskResult, CancellationError> = await Self.$handlerScope.withValue(scope) {
      do throws(CancellationError) { return .success(try await call(registration, run, handlerCall)) } catch {
        return .failure(error)
      }
    }
    // Returned, or left behind: nothing the handler does from now on holds this run.
    handlerCall.end()
    guard case .success(let result) = called else {
      return Finished(run, [.runInterrupted(task.id)], .interrupted)
    }
    return finished(run, result, registration, offlineAtStart: offlineAtStart, dropsBefore: dropsBefore)
  }

  /// The events and outcome of what a handler said of a run.
  func finished(
    _ run: ClaimedRun, _ result: TaskResult, _ registration: Registration, offlineAtStart: Bool,
    dropsBefore: UInt64
  ) -> Finished {
    let task = run.task
    let attempt = run.claim.attempt
    switch result {
    case .succeeded:
      return Finished(run, [.runSucceeded(task.id)], .succeeded)
    case .succeededWith(let output, let keys):
      // Only names that can be cache keys, each once: the fold ignores the others anyway, and
      // logged they could make the success's event too large for the log — its commit would
      // fail, the run would stay claimed, and the task would run again at every launch.
      var seen = Set<String>()
      // At most `maxStaleKeys`: the success's event must fit the log's payload limit whatever the
      // handler names (an unloggable success would run again after every restart).
      var staleKeys: [String] = []
      for key in keys where staleKeys.count < Self.maxStaleKeys {
        if CacheAgesProjection.isValidKey(key) && seen.insert(key).inserted { staleKeys.append(key) }
      }
      let details = SuccessDetails(output: output?.bytes, invalidates: staleKeys)
      return Finished(run, [.runSucceeded(task.id, details: details)], .succeeded)
    case .deferred(let fullMessage):
      return deferral(run, TaskQueue.loggable(fullMessage))
    case .failed(let fullMessage, true)
    where offlineAtStart || !isOnline || (configuration.connectivity?.timesWentOffline ?? 0) != dropsBefore:
      // The network went away under the run: not the server's answer.
      return deferral(run, TaskQueue.loggable("offline: " + fullMessage))
    case .failed(let fullMessage, let retryable):
      let message = TaskQueue.loggable(fullMessage)
      let policy = registration.retry ?? configuration.defaultRetry
      var retryAt: Int64?
      // Runs that gave their attempt back do not count toward the limit.
      if retryable && attempt &- task.attemptsGivenBack < policy.maxAttempts {
        // Saturating: a clock near the end of time must not wrap the retry around to the past.
        let (at, overflow) = queue.clock().addingReportingOverflow(
          policy.delayMilliseconds(afterAttempt: attempt, random: configuration.random()))
        retryAt = overflow ? Int64.max : at
      }
      return Finished(
        run, [.runFailed(task.id, message: message, retryable: retryable, nextEligibleAt: retryAt)],
        .failed(message, retryAt: retryAt.map(Date.init(unixMilliseconds:)))
      )
    case .recordError(let fullMessage):
      let message = TaskQueue.loggable(fullMessage)
      return Finished(
        run, [.errorRecorded(task.id, message: message, endsRun: true)], .errorRecorded(message))
    }
  }

  /// A run that gives its attempt back: logged as `task.runDeferred`, and passed over by this
  /// runner until connectivity returns, ``conditionsChanged()`` or the deferral delay.
  private func deferral(_ run: ClaimedRun, _ reason: String) -> Finished {
    let delay = max(Self.minimumDeferralDelay, configuration.deferralDelay).milliseconds
    deferred.insert(run.task.id, until: queue.clock().addingSaturating(delay))
    return Finished(run, [.runDeferred(run.task.id, reason: reason)], .deferred(reason))
  }

  /// Calls the handler in a task of its own — under its time limit, when it has one. A throw
  /// becomes a failure; a stopped pass's run (``stop()``, a window's deadline or its caller
  /// cancelled) that then throws anything, or does not end within the interruption grace, is
  /// rethrown as `CancellationError`: interrupted. A result returned in time is the outcome.
  private func call(
    _ registration: Registration, _ run: ClaimedRun, _ handlerCall: HandlerCall
  ) async throws(CancellationError) -> TaskResult {
    let task = run.task
    let running = RunningTask(
      id: task.id, tag: task.tag, dataId: task.dataId, groupId: task.groupId, attempt: run.claim.attempt,
      payloadBytes: run.payload, payloadEventId: run.payloadEventId)
    let limitMs = (registration.timeLimit ?? configuration.defaultTimeLimit).map { max(1, $0.milliseconds) }
    let graceMs = max(0, configuration.timeLimitGrace.milliseconds)
    // Made only when a run timed out (every run made it before).
    func timedOut() -> String { "timed out after \(Self.readable(milliseconds: limitMs ?? 0))" }
    let handler = registration.run
    switch await HandlerRun.run(
      { task in
        handlerCall.enter()  // in the handler's own task: what tells it apart from tasks it starts
        return try await handler(task)
      }, running, limitMs: limitMs, graceMs: graceMs,
      stopGraceMs: max(0, configuration.interruptionGrace.milliseconds), clock: queue.clock,
      sleep: queue.sleep)
    {
    case .ended(.success(let result), _, _):
      return result
    case .ended(.failure, _, stopped: true), .abandoned(_, stopped: true):
      throw CancellationError()  // the pass was stopped: interrupted
    case .ended(.failure(let error), timedOut: false, stopped: false):
      return failure(error, of: task.id)
    case .ended(.failure, timedOut: true, stopped: false):
      queue.observer.timedOut(run, limitMs: limitMs ?? 0, abandoned: false)
      return .failed(timedOut(), retryable: true)
    case .abandoned(timedOut: _, stopped: false):
      queue.observer.timedOut(run, limitMs: limitMs ?? 0, abandoned: true)
      return .failed(
        "\(timedOut()); the handler did not stop within \(Self.readable(milliseconds: graceMs)) of being "
          + "cancelled and was left running (what it returns is not logged)", retryable: true)
    }
  }

  /// `12 s`, or `1500 ms` when not whole seconds.
  static func readable(milliseconds: Int64) -> String {
    milliseconds % 1000 == 0 ? "\(milliseconds / 1000) s" : "\(milliseconds) ms"
  }

  /// What a handler's throw means, when its pass was not stopped: a failure.
  func failure(_ error: any Error, of id: TaskID) -> TaskResult {
    switch error {
    case is CancellationError:
      // Only a stopped pass interrupts a run; a handler's own cancellation is a failure like any
      // other (treated as an interruption it would run again at once, forever).
      return .failed("the handler threw CancellationError", retryable: true)
    case let error as FerryError:
      // A payload of this task that no longer decodes: retrying cannot help.
      if case .payload(id, _) = error { return .failed("\(error)", retryable: false) }
      return .failed("\(error)", retryable: true)
    default:
      return .failed("the handler threw: \(error)", retryable: true)
    }
  }

  func skip(_ id: TaskID, _ reason: SkipReason) -> RunOutcome {
    queue.publish(.skipped(id, reason))
    return .skipped(reason)
  }
}
