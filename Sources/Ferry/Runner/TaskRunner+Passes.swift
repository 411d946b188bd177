import FerryLog
import Foundation
import Synchronization

extension TaskRunner {
  func executePass(_ filter: RunFilter, control: PassControl) async throws -> PassReport {
    try await queue.interruptRunsOfDeadOwners()
    let owner = try queue.runOwner().id
    var tags: Set<String>?
    if case .collection(let name) = filter { tags = Set(configuration.collections[name] ?? []) }
    let pass = PassState(filter: filter, collectionTags: tags)
    // Capped: a pass reserves room for `width` runs before each claim, and those reservations of
    // every runner of the queue add up (`Int.max` beside a run under way overflowed).
    let width = min(max(1, configuration.maxConcurrentTasks), Self.widestPass)
    try await work(pass, control: control, owner: owner, width: width)
    try reportFailedGroups(pass)
    var report = pass.report()
    report.offline = control.wasOffline
    return queue.observer.passEnded(report)
  }

  /// The most tasks behind one failed head a report names (``SkipReason/partOfFailedGroup``).
  static let failedGroupReportLimit = 1000

  /// Puts in the report the tasks the pass passed over because an earlier task of their group
  /// failed, recorded an error or was skipped in it (not only interrupted): each such group's queued
  /// tasks that the pass would otherwise have gone on to (not manual, no run under way, ready or
  /// waiting, selected by the filter), up to ``failedGroupReportLimit`` a group. Read from the
  /// `groups` table for those groups only: a pass whose groups all went well reads nothing more.
  private func reportFailedGroups(_ pass: PassState) throws {
    let groups = pass.failedGroups
    if groups.isEmpty { return }
    let limit = Self.failedGroupReportLimit
    let found = try queue.log.read { view -> [(TaskID, TaskPriority)] in
      let queue = QueueTables(try view.tables(of: TaskQueueProjection.projectionName))
      var found: [(TaskID, TaskPriority)] = []
      for group in groups.sorted() {
        let prefix = QueueKey.groupPrefix(group)
        var ids: [TaskID] = []
        try queue.tables.scan("groups", from: prefix) { key, _ in
          guard key.count == prefix.count + 8 && key.starts(with: prefix), let id = QueueKey.trailingID(key)
          else {
            return false
          }
          ids.append(id)
          return ids.count <= limit  // the failed head itself, then up to `limit` behind it
        }
        var named = 0
        for id in ids where named < limit && !pass.isTouched(id) {
          guard let row = try queue.row(id), row.isQueued, row.claim == nil, !row.manual,
            row.status == .ready || row.status == .waiting, pass.matches(row)
          else { continue }
          found.append((id, TaskPriority(rawValue: row.priority)))
          named += 1
        }
      }
      return found
    }
    for (id, priority) in found where pass.touch(id) {
      pass.add(id, skip(id, .partOfFailedGroup), priority: priority)
    }
  }

  /// What a runner's claim command needs to know of its handlers.
  struct HandlerInfo: Sendable {
    let tags: [String: Bool]  // tag → has an isReadyToRun check
    /// Tags with a batched handler → its batch size.
    let batchSizes: [String: Int]
    /// Tasks found to have no handler here, until a handler is registered: a pass passes over
    /// them reading only their index key, and reports each once.
    let unhandled: UnhandledTasks
    /// The generation of `unhandled` these tags belong to.
    let generation: Int
    /// Tasks deferred by their last run here: passed over until their time.
    let deferred: DeferredTasks

    /// The batch a claim of `id` leads: itself when its tag's handler is batched, else none.
    func batchHead(_ id: TaskID, _ row: TaskRow) -> TaskID? {
      batchSizes.isEmpty || batchSizes[row.tag] == nil ? nil : id
    }
  }

  var handlerInfo: HandlerInfo {
    // The generation is read with the handlers, under the same lock `register` takes.
    state.withLock { s in
      HandlerInfo(
        tags: s.handlers.mapValues { $0.isReadyToRun != nil || configuration.isReadyToRun != nil },
        batchSizes: s.batchSizes, unhandled: unhandled,
        generation: unhandled.generation, deferred: deferred)
    }
  }

  /// A run that ended: what to log and report. A struct, not a tuple: a tuple is copied through
  /// the runtime's generic witnesses, several times a run.
  struct Finished: Sendable {
    let run: ClaimedRun
    let events: [TaskEvent]
    let outcome: RunOutcome
    /// The last (or only) run of a handler call: the call's lane is free again.
    var endsLane = true
    init(_ run: ClaimedRun, _ events: [TaskEvent], _ outcome: RunOutcome) {
      self.run = run
      self.events = events
      self.outcome = outcome
    }
  }

  /// The pass's loop: one command logs every run that ended since the last one and claims up to
  /// `width` minus the runs still under way, so one commit serves every lane; the handlers run
  /// meanwhile. Serially (width 1) that is one commit per task: the outcome of one run and the
  /// claim of the next.
  private func work(_ pass: PassState, control: PassControl, owner: String, width: Int) async throws {
    let ended = Mailbox<Finished>()
    var running = 0
    var finished: [Finished] = []
    var draining = false
    var offline = false
    try await withThrowingTaskGroup(of: Void.self) { handlers in
      while true {
        if Task.isCancelled || draining {
          // Stopped, or past the pass's deadline: the handlers see cancellation (the window that
          // set the deadline cancels the pass at it); log every outcome, then end. Offline, the
          // runs under way end as they will, and the pass has run out of what it may start.
          if offline && !Task.isCancelled { control.markOffline() } else { control.markCutShort() }
          while running > 0 {
            let batch = await ended.takeAll()
            running -= Self.lanes(batch)
            finished += batch
          }
          if !finished.isEmpty { try await finishAlone(finished, pass) }
          return
        }
        let info = handlerInfo
        let runner = number
        let clock = queue.clock
        let toFinish = finished
        let free = width - running
        let cursors = pass.cursors()
        finished = []
        // The runs this command may claim count as live from before it commits: a close meanwhile
        // keeps the token locked until they end.
        queue.reserveRuns(free)
        let step: QueueCommand.PassStep
        do {
          step = try await queue.log.execute { context in
            try QueueCommand.passStep(
              finishing: toFinish, context, pass: pass, control: control, cursors: cursors, handlers: info,
              owner: owner, runner: runner, free: free, isOnline: { self.isOnline }, clock: clock)
          }
        } catch {
          queue.endRuns(free)
          throw error
        }
        queue.endRuns(free - step.claims.count)
        for (run, logged) in zip(toFinish, step.logged) {
          if logged == .logged { publish(run) }
          report(run, logged: logged, pass: pass)
        }
        publishRepetitions(step.repetitions)
        for task in step.expired {
          queue.publish(.expired(task.id))
          if pass.matches(task.row) && pass.touch(task.id) {
            pass.add(task.id, .expired, priority: TaskPriority(rawValue: task.row.priority))
          }
        }
        if step.pastDeadline || step.offline {
          if step.paused { control.markStoppedByPause() }
          offline = step.offline
          draining = true
          continue
        }
        pass.advance(cursors: step.cursors, claimed: step.claims)
        if !step.batches.isEmpty {
          for members in step.batches.values { pass.advance(cursors: step.cursors, claimed: members) }
        }
        for found in step.skips where pass.touch(found.id) {
          if found.reason == .noHandler && !info.unhandled.insert(found.id, generation: info.generation) {
            continue
          }
          pass.add(found.id, skip(found.id, found.reason), priority: found.priority)
          pass.failGroup(found.groupId)
        }
        var claimed = step.claims
        var batches = step.batches
        if let task = step.check,
          let members = try await checkAndClaim(
            task, pass: pass, owner: owner, handlers: info, control: control),
          let run = members.first
        {
          claimed.append(run)
          if info.batchSizes[run.task.tag] != nil { batches[run.task.id] = members }
        }
        for run in claimed {
          if !batches.isEmpty, let members = batches[run.task.id] {
            // A batch is one lane: one handler call, its outcomes logged together.
            pass.addBatch(tag: run.task.tag, members.map(\.task.id))
            if width == 1 {
              finished += await runBatch(members, control: control)
              continue
            }
            running += 1
            handlers.addTask { [self] in ended.put(contentsOf: await runBatch(members, control: control)) }
            continue
          }
          if width == 1 {
            // One lane: the handler runs right here, and its outcome goes with the next claim.
            finished.append(await runClaimed(run, control: control))
            continue
          }
          running += 1
          handlers.addTask { [self] in ended.put(await runClaimed(run, control: control)) }
        }
        if running == 0 {
          if !finished.isEmpty || !step.expired.isEmpty { continue }
          if step.exhausted && step.check == nil && control.finish(at: step.head) { return }
          continue
        }
        // Room for more and more to look at: claim again at once; otherwise wait for a run to end.
        if running < width && !step.exhausted { continue }
        var batch = await ended.takeAll()
        var lanes = Self.lanes(batch)
        // Runs that end in the same instant share the next commit: gather while they keep coming.
        while lanes < running {
          await Task.yield()
          let more = ended.takeAvailable()
          if more.isEmpty { break }
          batch += more
          lanes += Self.lanes(more)
        }
        running -= lanes
        finished = batch
      }
    }
  }

  /// The handler calls whose runs `finished` ends (a batch's runs end one call).
  static func lanes(_ finished: [Finished]) -> Int {
    var count = 0
    for run in finished where run.endsLane { count += 1 }
    return count
  }

  /// A task whose tag has an `isReadyToRun` check: asked first, then claimed if it still may run
  /// (with the rest of its batch when its tag is batched: the check answers for the batch).
  private func checkAndClaim(
    _ task: PendingTask, pass: PassState, owner: String, handlers: HandlerInfo, control: PassControl
  ) async throws -> [ClaimedRun]? {
    guard pass.touch(task.id) else { return nil }
    let priority = task.priority
    guard let registration = state.withLock({ $0.handlers[task.tag] }) else {
      pass.add(task.id, skip(task.id, .noHandler), priority: priority)
      pass.failGroup(task.groupId)
      return nil
    }
    if !(await isReady(task, registration)) {
      pass.add(task.id, skip(task.id, .notReady), priority: priority)
      pass.failGroup(task.groupId)
      return nil
    }
    let runner = number
    let clock = queue.clock
    queue.reserveRuns(1)
    let decided: SingleClaim?
    var members: [ClaimedRun]?
    do {
      let result = try await queue.log.execute { context in
        try QueueCommand.claimChecked(
          task, context, pass: pass, control: control, handlers: handlers, owner: owner, runner: runner,
          clock: clock)
      }
      (decided, members) = (result?.decision, result?.batch)
    } catch {
      queue.endRuns(1)
      throw error
    }
    guard let decision = decided else {
      queue.endRuns(1)
      return nil
    }
    if case .claimed = decision {} else { queue.endRuns(1) }
    switch decision {
    case .claimed(let run):
      if let members {
        pass.advance(cursors: PassCursors(), claimed: members)
        return members
      }
      return [run]
    case .gone:
      // cancelled or cleared while it was asked
      pass.add(task.id, skip(task.id, .noLongerQueued), priority: priority)
    case .expired:
      queue.publish(.expired(task.id))
      pass.add(task.id, .expired, priority: priority)
    case .skip(let reason):
      pass.add(task.id, skip(task.id, reason), priority: priority)
      pass.failGroup(task.groupId)
    case .runningElsewhere:
      pass.add(task.id, skip(task.id, .running), priority: priority)
      pass.failGroup(task.groupId)
    case .check:
      break  // not asked with checked: true
    }
    return nil
  }

  /// Whether a task may run now: the runner's check (``Configuration/isReadyToRun``), then its tag's.
  func isReady(_ task: PendingTask, _ registration: Registration) async -> Bool {
    if let check = configuration.isReadyToRun, !(await check(task)) { return false }
    if let check = registration.isReadyToRun, !(await check(task)) { return false }
    return true
  }

  /// Logs runs' outcomes in one command (each only if the run is still the runner's) and tells
  /// observers of those logged.
  func logOutcomes(_ runs: [Finished]) async throws -> [QueueCommand.FinishOutcome] {
    let clock = queue.clock
    let (logged, repetitions) = try await queue.log.execute { context in
      try QueueCommand.finishRuns(runs, context, clock: clock)
    }
    for (run, result) in zip(runs, logged) where result == .logged { publish(run) }
    publishRepetitions(repetitions)
    return logged
  }

  /// Tells observers of the tasks added to repeat repeating tasks that succeeded.
  private func publishRepetitions(_ repetitions: [(id: TaskID, of: PendingTask)]) {
    for (id, repeated) in repetitions {
      queue.observer.added(id, tag: repeated.tag, groupId: repeated.groupId)
      queue.publish(.added(id))
    }
  }

  /// Logs the outcomes of a stopped pass's runs and puts them in its report.
  private func finishAlone(_ runs: [Finished], _ pass: PassState) async throws {
    for (run, logged) in zip(runs, try await logOutcomes(runs)) { report(run, logged: logged, pass: pass) }
  }

  /// Tells observers of a run's logged outcome.
  private func publish(_ finished: Finished) {
    queue.observer.runFinished(finished.run, events: finished.events)
    for event in finished.events {
      for update in event.updates(sequence: 0) { queue.publish(update) }
      if case .runSucceeded(_, let details) = event, !details.invalidates.isEmpty {
        queue.cacheInvalidated.withLock { $0 }?(details.invalidates)
      }
    }
  }

  /// Puts a run whose outcome a command logged (or refused) in the pass's report.
  private func report(_ finished: Finished, logged: QueueCommand.FinishOutcome, pass: PassState) {
    let id = finished.run.task.id
    pass.add(id, logged == .logged ? finished.outcome : .interrupted, priority: finished.run.task.priority)
    if finished.outcome != .succeeded {
      pass.failGroup(
        finished.run.task.groupId, reported: logged == .logged && finished.outcome != .interrupted)
    }
  }
}
