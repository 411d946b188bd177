import FerryLog

/// A runner's pass decisions, made inside the writer's transaction like the queue's other
/// commands: log what ended, expire what is past its deadline, claim what may start.
extension QueueCommand {
  /// What one command of a pass did: the outcomes it logged, the runs it claimed, what it skipped
  /// and where its search stopped.
  struct PassStep: Sendable {
    var logged: [QueueCommand.FinishOutcome] = []
    /// The tasks that repeat the repeating tasks whose success this command logged.
    var repetitions: [(id: TaskID, of: PendingTask)] = []
    var claims: [ClaimedRun] = []
    /// The batches led by claims of batched tags, by their first task: every run of each, the
    /// first included (claimed in this command too).
    var batches: [TaskID: [ClaimedRun]] = [:]
    var skips: [PassSkip] = []
    /// Tasks this command expired (their deadline passed): swept, or met by the search.
    var expired: [ExpiredTask] = []
    var check: PendingTask?
    var cursors: PassCursors
    var head: UInt64 = 0
    /// The search found nothing more to claim (rather than stopping at the width, a check or its limit).
    var exhausted = false
    /// The pass's deadline had come (or, for automatic running, the queue was paused): the
    /// command claimed nothing.
    var pastDeadline = false
    /// The queue was paused and the pass is automatic running's.
    var paused = false
    /// The connectivity input said offline: the command claimed nothing.
    var offline = false
  }

  /// One command of a pass: logs the outcomes of the runs that ended (each only if the run is
  /// still the runner's) and claims up to `free` runs, from where the pass's `cursors` stopped.
  static func passStep(
    finishing runs: [TaskRunner.Finished], _ context: CommandContext, pass: PassState, control: PassControl,
    cursors: PassCursors, handlers info: TaskRunner.HandlerInfo, owner: String, runner: UInt32, free: Int,
    isOnline: () -> Bool, clock: () -> Int64
  ) throws -> PassStep {
    var step = PassStep(cursors: cursors)
    // A claim of a batched tag leads a batch, filled in this command. (`step` passed, not
    // captured: a captured struct is checked as a whole, and two of its fields are inout below.)
    func take(_ run: ClaimedRun, _ step: inout PassStep) throws {
      step.claims.append(run)
      if !info.batchSizes.isEmpty, let size = info.batchSizes[run.task.tag] {
        step.batches[run.task.id] = try ClaimSearch.fillBatch(
          run, size: size, context, pass: pass, cursors: step.cursors, handlers: info, owner: owner,
          runner: runner, now: clock())
      }
    }
    // Tasks whose deadline passed leave the queue first, whatever their state: the sweep
    // reads the `deadlines` index from its start, so it costs what it expires.
    step.expired = try ClaimSearch.sweep(context, now: clock(), limit: ClaimSearch.scanLimit)
    let finished = try finishRuns(runs, context, clock: clock)
    step.logged = finished.logged
    step.repetitions = finished.repetitions
    var successors: [String] = []
    for (run, logged) in zip(runs, step.logged) {
      if run.outcome == .succeeded, logged == .logged, let group = run.run.task.groupId {
        successors.append(group)
      }
    }
    // A window's deadline: nothing more is claimed, decided here with the claims (read here,
    // not before the command waited for the writer: a window may have joined meanwhile).
    if let deadline = control.deadline, clock() >= deadline {
      step.pastDeadline = true
      return step
    }
    // Offline: nothing starts, so no attempt is spent (decided here, with the claims).
    if !isOnline() {
      step.offline = true
      return step
    }
    // Automatic running paused while its pass was under way: nothing more is claimed.
    if control.stopsWhenPaused,
      try tables(context).tables.get("state", key: QueueKey.paused) == [1]
    {
      step.pastDeadline = true
      step.paused = true
      return step
    }
    // Successors first: every group this command moved on, however the scan ends.
    for group in successors where step.claims.count < free && step.check == nil {
      switch try ClaimSearch.successor(
        of: group, context, pass: pass, cursors: step.cursors, handlers: info, owner: owner,
        runner: runner, now: clock(), skips: &step.skips, expired: &step.expired)
      {
      case .some(.claimed(let run)): try take(run, &step)
      case .some(.check(let task)): step.check = task
      default: break  // nothing to take from this group now
      }
    }
    // A sweep that reached its limit leaves more to expire: the next command goes on.
    let sweptAll = step.expired.count < ClaimSearch.scanLimit
    while step.claims.count < free && step.check == nil {
      let found = try ClaimSearch.next(
        context, pass: pass, cursors: step.cursors, handlers: info,
        owner: owner, runner: runner, now: clock(), expired: &step.expired)
      step.cursors = found.cursors
      step.skips += found.skips
      switch found.found {
      case .claimed(let run):
        try take(run, &step)
        continue
      case .check(let task): step.check = task
      case .more: break
      case .none(let head):
        step.head = head
        step.exhausted = sweptAll
      }
      break
    }
    // Claims alone need no flush of their own: the runs' outcomes are logged by a flushed commit.
    // (Expirations are decisions of their own, flushed.)
    if runs.isEmpty && !step.claims.isEmpty && step.expired.isEmpty { context.mayDeferFlush() }
    return step
  }

  /// Logs runs' outcomes, each only if the run is still the runner's; returns what each decided
  /// and the tasks that repeat the repeating tasks that succeeded.
  static func finishRuns(
    _ runs: [TaskRunner.Finished], _ context: CommandContext, clock: () -> Int64
  ) throws -> (logged: [FinishOutcome], repetitions: [(id: TaskID, of: PendingTask)]) {
    var repetitions: [(id: TaskID, of: PendingTask)] = []
    let logged = try runs.map { run in
      var repetition: TaskID?
      defer { if let repetition { repetitions.append((repetition, run.run.task)) } }
      return try finish(
        run.run.task.id, claim: run.run.claim, outcome: run.events, now: clock(), context,
        repetition: &repetition)
    }
    return (logged, repetitions)
  }

  /// Claims a task whose `isReadyToRun` said yes, if it still may start (with the rest of its
  /// batch when its tag is batched: the check answered for the batch). Nil when the pass's
  /// deadline came while the check was asked: nothing is claimed.
  static func claimChecked(
    _ task: PendingTask, _ context: CommandContext, pass: PassState, control: PassControl,
    handlers: TaskRunner.HandlerInfo, owner: String, runner: UInt32, clock: () -> Int64
  ) throws -> (decision: SingleClaim, batch: [ClaimedRun]?)? {
    let now = clock()
    // A window's deadline came while the check was asked — the window may have joined then.
    if let deadline = control.deadline, now >= deadline { return nil }
    let decision = try ClaimSearch.claim(
      task.id, context, owner: owner, runner: runner, now: now, handlers: handlers, checked: true)
    if case .claimed = decision { context.mayDeferFlush() }
    guard case .claimed(let run) = decision, let size = handlers.batchSizes[run.task.tag] else {
      return (decision, nil)
    }
    let batch = try ClaimSearch.fillBatch(
      run, size: size, context, pass: pass, cursors: pass.cursors(), handlers: handlers, owner: owner,
      runner: runner, now: now)
    return (decision, batch)
  }
}
