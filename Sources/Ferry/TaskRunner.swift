import FerryLog
import Synchronization

/// Runs the queue's tasks with the handlers registered per tag.
///
/// ```swift
/// let runner = TaskRunner(queue: queue)
/// runner.register(tag: "upload-photo") { task in
///   let photo = try task.payload(as: Photo.self)
///   return try await api.upload(photo) ? .succeeded : .failed("server said no")
/// }
/// let report = try await runner.run()          // one pass over every runnable task, in id order
/// runner.startAutomaticRunning()               // or: run whenever there is something to run
/// ```
///
/// Before a handler is called its `runStarted` event is durable, and its result is logged when it
/// returns: a crash in between leaves a run the next open reports as interrupted (at-least-once).
public final class TaskRunner: Sendable {
  /// How the runner runs.
  public struct Configuration: Sendable {
    /// Tasks of different groups may run at once, up to this many; one group never runs two.
    public var maxConcurrentTasks = 1
    /// The retry policy of tags registered without one.
    public var defaultRetry = RetryPolicy()
    /// Named sets of tags, for ``RunFilter/collection(_:)``.
    public var collections: [String: [String]] = [:]
    /// A random number in 0..<1 for backoff jitter (tests make it fixed).
    public var random: @Sendable () -> Double = { Double.random(in: 0..<1) }

    /// The defaults: one task at a time, 5 attempts with 1 s doubling backoff.
    public init() {}
  }

  /// A handler with its policies.
  struct Registration: Sendable {
    let retry: RetryPolicy?
    let isReadyToRun: (@Sendable (PendingTask) async -> Bool)?
    let run: @Sendable (RunningTask) async throws -> TaskResult
  }

  struct State {
    var handlers: [String: Registration] = [:]
    var pass: (task: Task<RunReport, any Error>, filter: RunFilter)?
    /// The automatic-running loop and the signal that wakes it (one per loop, so a loop stopped
    /// and a new one started never share a waiter).
    var automatic: (task: Task<Void, Never>, wakeup: WakeSignal)?
  }

  /// The queue it runs.
  public let queue: TaskQueue
  /// Its configuration.
  public let configuration: Configuration
  let state = Mutex(State())

  /// A runner for `queue`.
  public init(queue: TaskQueue, configuration: Configuration = Configuration()) {
    self.queue = queue
    self.configuration = configuration
  }

  /// Registers the handler of a tag (replacing any earlier one), with an optional retry policy and
  /// an optional check that the task may run now (a `false` skips it with ``SkipReason/notReady``).
  public func register(
    tag: String, retry: RetryPolicy? = nil, isReadyToRun: (@Sendable (PendingTask) async -> Bool)? = nil,
    handler: @escaping @Sendable (RunningTask) async throws -> TaskResult
  ) {
    let loop = state.withLock { s in
      s.handlers[tag] = Registration(retry: retry, isReadyToRun: isReadyToRun, run: handler)
      return s.automatic
    }
    loop?.wakeup.signal()
  }

  // MARK: Passes

  /// Runs one pass over the tasks `filter` selects, in task-id order, and reports what happened
  /// to each. A task that fails, is not ready, or is blocked marks its group failed: the rest of
  /// that group is skipped in this pass. A pass asked for while one runs waits for it and returns
  /// its report.
  ///
  /// Throws ``FerryError/unknownCollection(_:)`` and ``FerryError/noSuchTask(_:)`` for a filter
  /// naming nothing.
  public func run(_ filter: RunFilter = .all) async throws -> RunReport {
    if case .collection(let name) = filter, configuration.collections[name] == nil {
      throw FerryError.unknownCollection(name)
    }
    if case .task(let id) = filter, try queue.task(id) == nil { throw FerryError.noSuchTask(id) }
    return try await pass(filter, joinRunning: true)
  }

  /// Starts a pass, or joins the one under way when `joinRunning` and it covers `filter` (the
  /// same filter, or `.all` for a group or collection) and was not stopped.
  func pass(_ filter: RunFilter, joinRunning: Bool) async throws -> RunReport {
    while true {
      let (pass, joinable) = state.withLock { s -> (Task<RunReport, any Error>, Bool?) in
        if let running = s.pass { return (running.task, Self.covers(running.filter, filter)) }
        let pass = Task { [self] in
          defer { state.withLock { $0.pass = nil } }
          return try await executePass(filter)
        }
        s.pass = (pass, filter)
        return (pass, nil)
      }
      guard let joinable else { return try await pass.value }  // ours
      if joinRunning && joinable && !pass.isCancelled { return try await pass.value }
      _ = try? await pass.value  // wait for it to end, then start one of our own
    }
  }

  /// Whether a running pass over `running` answers a request for `requested`.
  static func covers(_ running: RunFilter, _ requested: RunFilter) -> Bool {
    if running == requested { return true }
    switch (running, requested) {
    case (.all, .group), (.all, .collection): return true
    default: return false  // a single task (maybe manual) is run by a pass of its own
    }
  }

  /// Cancels the pass under way (its handler sees cancellation; its task is logged as
  /// interrupted and is ready again) and stops automatic running.
  public func stop() {
    let (pass, automatic) = state.withLock { s in
      defer { s.automatic = nil }
      return (s.pass, s.automatic)
    }
    automatic?.task.cancel()
    automatic?.wakeup.signal()
    pass?.task.cancel()
  }

  func executePass(_ filter: RunFilter) async throws -> RunReport {
    let candidates = try queue.pendingTasks().filter { task in
      switch filter {
      case .all: return !task.manual
      case .group(let group): return !task.manual && task.groupId == group
      case .collection(let name):
        return !task.manual && (configuration.collections[name] ?? []).contains(task.tag)
      case .task(let id): return task.id == id
      }
    }
    var report = RunReport()
    if configuration.maxConcurrentTasks <= 1 {
      var failedGroups = Set<String>()
      for task in candidates {
        if Task.isCancelled { break }
        report.entries.append(
          .init(taskId: task.id, outcome: try await process(task, failedGroups: &failedGroups)))
      }
      return report
    }
    // Parallel: one lane per group (and per ungrouped task), lanes started in order of their
    // first task; each lane runs its tasks one after another.
    var lanes: [[PendingTask]] = []
    var laneOfGroup: [String: Int] = [:]
    for task in candidates {
      if let group = task.groupId, let lane = laneOfGroup[group] {
        lanes[lane].append(task)
      } else {
        if let group = task.groupId { laneOfGroup[group] = lanes.count }
        lanes.append([task])
      }
    }
    let width = configuration.maxConcurrentTasks
    try await withThrowingTaskGroup(of: [RunReport.Entry].self) { group in
      var next = 0
      func startLane() {
        let lane = lanes[next]
        next += 1
        group.addTask { [self] in
          var failedGroups = Set<String>()
          var entries: [RunReport.Entry] = []
          for task in lane {
            if Task.isCancelled { break }
            entries.append(
              .init(taskId: task.id, outcome: try await process(task, failedGroups: &failedGroups)))
          }
          return entries
        }
      }
      while next < lanes.count && next < width { startLane() }
      for try await entries in group {
        report.entries += entries
        if next < lanes.count { startLane() }
      }
    }
    report.entries.sort { $0.taskId < $1.taskId }
    return report
  }

  /// Runs (or skips) one task of a pass.
  private func process(_ listed: PendingTask, failedGroups: inout Set<String>) async throws -> TaskOutcome {
    if let group = listed.groupId, failedGroups.contains(group) { return skip(listed.id, .partOfFailedGroup) }
    let outcome: TaskOutcome
    if let task = try queue.task(listed.id) {
      outcome = try await attempt(task)
    } else {
      outcome = skip(listed.id, .noLongerQueued)
    }
    if outcome != .succeeded && outcome != .skipped(.noLongerQueued), let group = listed.groupId {
      failedGroups.insert(group)
    }
    return outcome
  }

  private func skip(_ id: TaskID, _ reason: SkipReason) -> TaskOutcome {
    queue.publish(.skipped(id, reason))
    return .skipped(reason)
  }

  private func attempt(_ task: PendingTask) async throws -> TaskOutcome {
    if let group = task.groupId, try queue.head(of: group) != task.id {
      return skip(task.id, .notHeadOfGroup)
    }
    switch task.status {
    case .running: return skip(task.id, .running)
    case .blockedByError: return skip(task.id, .blockedByError)
    case .dead: return skip(task.id, .dead)
    case .waiting(let until) where until > queue.clock(): return skip(task.id, .waitingForRetry(until: until))
    case .ready, .waiting: break
    }
    guard let registration = state.withLock({ $0.handlers[task.tag] }) else {
      return skip(task.id, .noHandler)
    }
    if let isReady = registration.isReadyToRun, !(await isReady(task)) { return skip(task.id, .notReady) }

    let attempt = task.attempts &+ 1
    _ = try await queue.record([.runStarted(task.id, attempt: attempt)])
    // A cancel, clear or recorded error may have got in while this pass looked at the task: the
    // run started only if the task is now running at this attempt.
    guard let started = try queue.task(task.id) else { return skip(task.id, .noLongerQueued) }
    guard started.status == .running && started.attempts == attempt else {
      switch started.status {
      case .blockedByError: return skip(task.id, .blockedByError)
      case .dead: return skip(task.id, .dead)
      default: return skip(task.id, .running)
      }
    }
    let result: TaskResult
    do {
      result = try await call(registration, task, attempt: attempt)
    } catch {
      _ = try await queue.record([.runInterrupted(task.id)])
      return .interrupted
    }

    switch result {
    case .succeeded:
      _ = try await queue.record([.runSucceeded(task.id)])
      return .succeeded
    case .failed(let fullMessage, let retryable):
      let message = TaskQueue.loggable(fullMessage)
      let policy = registration.retry ?? configuration.defaultRetry
      var retryAt: Int64?
      if retryable && attempt < policy.maxAttempts {
        retryAt = queue.clock() &+ policy.delay(afterAttempt: attempt, random: configuration.random())
      }
      _ = try await queue.record([
        .runFailed(task.id, message: message, retryable: retryable, nextEligibleAt: retryAt)
      ])
      return .failed(message, retryAt: retryAt)
    case .recordError(let fullMessage):
      let message = TaskQueue.loggable(fullMessage)
      _ = try await queue.record([.errorRecorded(task.id, message: message)])
      return .errorRecorded(message)
    }
  }

  /// Calls the handler; a throw becomes a failure, except cancellation, which is rethrown.
  private func call(
    _ registration: Registration, _ task: PendingTask, attempt: UInt32
  ) async throws(CancellationError)
    -> TaskResult
  {
    do {
      let running = RunningTask(
        id: task.id, tag: task.tag, dataId: task.dataId, groupId: task.groupId, attempt: attempt,
        payloadBytes: try queue.payloadBytes(of: task.id))
      return try await registration.run(running)
    } catch let cancellation as CancellationError {
      // Only a stopped pass interrupts a run; a handler's own cancellation is a failure like any
      // other (treated as an interruption it would run again at once, forever).
      if Task.isCancelled { throw cancellation }
      return .failed("the handler threw CancellationError", retryable: true)
    } catch let error as FerryError {
      // A payload of this task that no longer decodes: retrying cannot help.
      if case .payload(task.id, _) = error { return .failed("\(error)", retryable: false) }
      return .failed("\(error)", retryable: true)
    } catch {
      return .failed("the handler threw: \(error)", retryable: true)
    }
  }

  // MARK: Automatic running

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
          for await update in updates {
            switch update {
            case .added, .errorResolved, .revived, .interrupted, .resumed: wakeup.signal()
            default: break
            }
          }
        }
        defer { listener.cancel() }
        while !Task.isCancelled {
          let passStart = queue.clock()
          // Never join a pass started by someone else: it may not have listed what woke us.
          if (try? queue.isPaused()) == false { _ = try? await pass(.all, joinRunning: false) }
          if Task.isCancelled { break }
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

  /// Whether passes run by themselves.
  public var isRunningAutomatically: Bool { state.withLock { $0.automatic != nil } }

  /// The earliest retry time at or after `passStart`. A time before it was considered by that
  /// pass; one that pass skipped for another reason (not ready, no handler) waits for another
  /// wake-up, so the loop never spins — and a time that came due during the pass is not missed.
  private func nextRetryTime(from passStart: Int64) -> Int64? {
    try? queue.log.read { view in
      var at: Int64?
      try view.tables(of: TaskQueueProjection.projectionName).scan(
        "waiting", from: QueueKey.waiting(passStart, 0)
      ) {
        key, _ in
        at = QueueKey.waitingTime(key)?.at
        return false
      }
      return at
    }
  }
}

/// Wakes the automatic-running loop: a signal given while nobody waits is kept for the next wait.
final class WakeSignal: Sendable {
  private struct State {
    var pending = false
    var waiter: CheckedContinuation<Void, Never>?
  }
  private let state = Mutex(State())

  func signal() {
    let waiter = state.withLock { s -> CheckedContinuation<Void, Never>? in
      if let waiter = s.waiter {
        s.waiter = nil
        return waiter
      }
      s.pending = true
      return nil
    }
    waiter?.resume()
  }

  func wait() async {
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
      let now = state.withLock { s -> Bool in
        if s.pending {
          s.pending = false
          return true
        }
        s.waiter = continuation
        return false
      }
      if now { continuation.resume() }
    }
  }
}
