import FerryLog
import Foundation
import Synchronization

/// The push side's durable queue: every change is an event in the store's log, and the queue is a
/// projection of it kept in the same transaction.
///
/// ```swift
/// let queue = try await FerryStore.open(at: storePath).queue
/// let id = try await queue.add(tag: "upload-photo", payload: Photo(name: "cat.jpg"), groupId: "album-1")
/// let next = try queue.nextRunnable()
/// ```
///
/// Running tasks (handlers, passes, retries, observation) is the runner's job; this type keeps
/// what is queued, durable before each call returns.
public final class TaskQueue: Sendable {
  /// The longest tag, in UTF-8 bytes.
  public static let maxTagLength = 200
  /// The longest data id or group id, in UTF-8 bytes.
  public static let maxIdLength = 250

  /// The event log beneath the queue: the engine, for Ferry's own tools and tests
  /// (`@_spi(Engine) import Ferry`).
  @_spi(Engine) public let log: EventLog
  let clock: @Sendable () -> Int64
  let updateStreams = Broadcaster<TaskUpdate, TaskID>(buffer: 10_000)
  /// Told when the other-process follower finds another process's events compacted away before it read them.
  let compactedUnread = Broadcaster<Void, Int>(buffer: 1)
  /// Runs found at open whose owner was gone (a crash), now logged as interrupted: their tasks are
  /// ready again — except a task cancelled while that run was under way, which the interruption
  /// removes (``FerrySnapshot/cancelledRunning``). After ``FerryStore/resume()``, the runs that
  /// resume interrupted.
  public var interruptedAtOpen: [TaskID] { interruptedOnOpen.withLock { $0 } }
  private let interruptedOnOpen = Mutex<[TaskID]>([])
  /// This process's liveness token in the store, made when a runner first claims a run.
  private let owner = Mutex<RunOwner?>(nil)
  /// Runs of this queue's runners that may be live (``reserveRuns(_:)``), and a token given up by
  /// `close` while they ran: it stays locked until the last of them ends.
  private let liveRuns = Mutex<(running: Int, closedOwner: RunOwner?)>((0, nil))
  private let runnerNumbers = Atomic<UInt32>(0)
  /// The tail that tells this process's observers what other processes append.
  private let otherProcessFollower = OtherProcessFollower()
  /// This queue's runners, held weakly: a suspension of the store stops them and its resume
  /// starts again those that ran automatically.
  private let runners = Mutex<[WeakRunner]>([])

  struct WeakRunner {
    weak var runner: TaskRunner?
  }

  func adopt(_ runner: TaskRunner) {
    runners.withLock { runners in
      runners.removeAll { $0.runner == nil }
      runners.append(WeakRunner(runner: runner))
    }
  }

  /// The runners of this queue that are still in use.
  var liveRunners: [TaskRunner] { runners.withLock { $0.compactMap(\.runner) } }

  /// Opens (or creates) the store at `path` and returns its queue alone, for Ferry's own tests
  /// and tools; an app opens a ``FerryStore`` (``FerryStore/open(at:configuration:)``).
  ///
  /// A task whose run started and never finished — its process died while the handler ran — gets
  /// a `runInterrupted` event and is ready again, its attempt count kept (at-least-once delivery).
  /// A run whose process is alive (another app process, an extension) is left alone.
  package static func open(
    at path: String, configuration: FerryStore.Configuration = FerryStore.Configuration()
  ) async throws(FerryError) -> TaskQueue {
    try await engine {
      try await FerryStore.open(at: path, configuration: configuration).queue
    }
  }

  /// Waits until the clock reads at least a time (on ``FerryStore/Configuration/clock``).
  let sleep: @Sendable (Int64) async -> Void

  init(
    log: EventLog, clock: @escaping @Sendable () -> Int64, sleep: @escaping @Sendable (Int64) async -> Void
  ) {
    self.log = log
    self.clock = clock
    self.sleep = sleep
    self.observer = QueueObserver(log: log, clock: clock)
    followOtherProcessesWhileObserved()
  }

  /// Logging and metrics (Observability.swift).
  let observer: QueueObserver
  /// Told the cache keys a run's success made stale (the store's ledger tells its observers).
  let cacheInvalidated = Mutex<(@Sendable ([String]) -> Void)?>(nil)

  func setInterruptedAtOpen(_ ids: [TaskID]) { interruptedOnOpen.withLock { $0 = ids } }

  /// Closes the store beneath the queue: returns once every write already handed to the writer is
  /// committed (blocking the calling thread meanwhile; a write asked for after that throws
  /// ``FerryError/closed``), ends the update streams and gives up this process's liveness token —
  /// once no handler of this queue still runs. Handlers are not waited for: a run whose outcome
  /// can no longer be logged is interrupted by the next open. Synchronous, like
  /// ``FerryStore/close()``.
  public func close() {
    otherProcessFollower.stop()
    log.close()
    updateStreams.finish()
    compactedUnread.finish()
    // The token is given up (unlocked, the file kept for the next open's sweep), so that runs
    // this queue can no longer finish are taken over — but only once no handler of it still runs.
    let token = owner.withLock { owner -> RunOwner? in
      defer { owner = nil }
      return owner
    }
    let releaseNow = liveRuns.withLock { state -> Bool in
      if state.running == 0 { return true }
      state.closedOwner = token
      return false
    }
    if releaseNow { token?.release() }
  }

  /// Lets go of the store for a suspension (``FerryStore/suspend()``), once the runners stopped:
  /// stops reading other processes' changes (keeping where it was), suspends the log — every
  /// write handed to the writer is committed first — and gives up this process's liveness token,
  /// whatever handler still runs: a run whose outcome could not be logged is then like a killed
  /// process's, interrupted by the resume or by any other process.
  func suspendStore() {
    otherProcessFollower.suspend()
    log.suspend()
    let token = owner.withLock { owner -> RunOwner? in
      defer { owner = nil }
      return owner
    }
    liveRuns.withLock { $0.closedOwner = nil }
    token?.release()
  }

  /// Takes the store up again after ``suspendStore()``: the log reopens (projections catch up with
  /// other processes' appends) and the tail of other processes' changes goes on from where it
  /// stopped. The store then interrupts dead owners' runs (``FerryStore/resume()``).
  func resumeStore() throws {
    try log.resume()
    otherProcessFollower.resume(log)
  }

  /// Runs of this queue that may be live: reserved before a claim command is sent (it may claim
  /// that many), and ended for each slot the command did not use and each run whose handler
  /// returned. While any is reserved the token stays locked, even after `close`.
  func reserveRuns(_ count: Int) {
    guard count > 0 else { return }
    liveRuns.withLock { $0.running += count }
  }

  /// Ends `count` reserved runs; the last one after a close gives the token up.
  func endRuns(_ count: Int) {
    guard count > 0 else { return }
    let token = liveRuns.withLock { state -> RunOwner? in
      state.running -= count
      guard state.running <= 0 else { return nil }
      defer { state.closedOwner = nil }
      return state.closedOwner
    }
    token?.release()
  }

  /// Tells the streams of the update's task, and those observing everything.
  func publish(_ update: TaskUpdate) {
    updateStreams.publish(update, for: update.taskId)
    observer.changed(update)
  }

  /// Every change to the queue as it happens (adds, runs, skips, errors, cancels, clears) — made
  /// in this process, or logged by another process on the same store (an app extension, say),
  /// which are seen within a fraction of a second. Skips by other processes' runners are not
  /// logged, so they are not seen.
  ///
  /// - Returns: A stream of every change, ending when the queue is closed.
  public func updates() -> AsyncStream<TaskUpdate> {
    updateStreams.stream(for: nil) { nil }
  }

  /// The changes to one task, starting with its current status (``TaskUpdate/current(_:_:)``).
  ///
  /// - Parameter id: The task to follow.
  /// - Returns: A stream that yields ``TaskUpdate/current(_:_:)`` with the task's status first (nil when it
  ///   is not queued), then each change to the task; it ends when the queue is closed.
  /// - Throws: Reading the current status: ``FerryError/closed`` or ``FerryError/suspended`` when the store
  ///   is closed or suspended; ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the read fails.
  public func updates(for id: TaskID) throws(FerryError) -> AsyncStream<TaskUpdate> {
    try engine {
      try updateStreams.stream(for: id) { .current(id, try task(id)?.status) }
    }
  }

  /// Whether this queue reads the log for other processes' changes now: while any update stream
  /// is observed (``updates()``, ``updates(for:)``, `waitUntilIdle()`), not after the last ends.
  var followsOtherProcesses: Bool { otherProcessFollower.isRunning }

  /// The tail of other processes' changes runs while anyone observes: an app that stopped
  /// observing is not woken five times a second for nothing.
  private func followOtherProcessesWhileObserved() {
    updateStreams.whileObserved { [weak self] observed in
      guard let self else { return }
      if observed { self.startFollowingOtherProcesses() } else { self.otherProcessFollower.stop() }
    }
  }

  private func startFollowingOtherProcesses() {
    otherProcessFollower.start(log) { [weak self] event in
      guard let self, TaskEvent.typeSet.contains(event.type), let decoded = try? TaskEvent(event) else {
        return
      }
      // Told to observers only: another process's changes are its own to log and count.
      for update in decoded.updates(sequence: event.sequence) {
        self.updateStreams.publish(update, for: update.taskId)
      }
    } missed: { [weak self] in
      // Another process's events were compacted away unread (a task cancelled and compacted,
      // say): each observed task's stream is told its status now.
      guard let self else { return }
      self.compactedUnread.publish((), for: nil)
      for id in self.updateStreams.keys {
        let status: TaskStatus?
        do { status = try self.task(id)?.status } catch { continue }
        self.updateStreams.publish(.current(id, status), for: id)
      }
    }
  }

  /// This process's liveness token, made on first use.
  func runOwner() throws -> RunOwner {
    try owner.withLock { owner in
      if let owner { return owner }
      guard !log.isClosed else { throw FerryLogError.closed }
      let made = try RunOwner(storePath: log.path)
      owner = made
      return made
    }
  }

  /// The id of this process's liveness token, if it has one.
  var ownerId: String? { owner.withLock { $0?.id } }

  /// A number for a new runner of this queue (claims name it, so only it may finish its runs).
  func nextRunnerNumber() -> UInt32 { runnerNumbers.add(1, ordering: .relaxed).newValue }

  /// Interrupts every run whose owner is gone (its process died, or closed the store mid-run):
  /// the task is ready again (one cancelled while that run was under way leaves the queue). A
  /// live owner's runs are never touched.
  ///
  /// - Returns: The tasks whose runs were interrupted.
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)`` when the runs under way cannot be read;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when reading or committing fails.
  @discardableResult
  public func interruptRunsOfDeadOwners() async throws(FerryError) -> [TaskID] {
    try await engine {
      try await recover(sweepingTokens: false)
    }
  }

  /// Interrupts dead owners' runs and, with `sweepingTokens`, removes the tokens of dead owners
  /// that no claim names any more (the files closed or killed processes left): reads the claims once.
  ///
  /// An open (`inWriter` false) reads the claims as any read is, and throws as the read did. With
  /// `inWriter` (a runner's look, at every pass's start and now and then) they are read on a
  /// snapshot, caught up once if behind (EventLog.readCatchingUpOnly, a second at most); when
  /// that is still behind — another process keeps moving the projection, or holds LMDB's writer
  /// lock — they are read in a command instead, where the projection is at the head: it suspends
  /// for the writer however long it takes (a runner needs the writer anyway), where a read's own
  /// turn in the writer's transaction would block a thread of the pool for up to four seconds and
  /// then give up.
  func recover(sweepingTokens: Bool, inWriter: Bool = true) async throws -> [TaskID] {
    owner.withLock { $0 }?.ensureToken()
    let claims: [(TaskID, TaskRow.Claim)]
    do {
      claims =
        try inWriter
        ? log.readCatchingUpOnly { view in
          try QueueCommand.claims(QueueTables(view.tables(of: TaskQueueProjection.projectionName)))
        }
        : queueTables { queue in try QueueCommand.claims(queue) }
    } catch FerryLogError.projectionNotCurrent where inWriter {
      claims = try await log.execute { context in try QueueCommand.claims(QueueCommand.tables(context)) }
    }
    let mine = ownerId
    var verdicts: [String: RunOwner.Liveness] = [:]
    for (_, claim) in claims where claim.owner != mine && verdicts[claim.owner] == nil {
      verdicts[claim.owner] = RunOwner.liveness(of: claim.owner, storePath: log.path)
    }
    let dead = claims.filter { verdicts[$0.1.owner] == .dead }
    let interrupted = try await interrupt(dead)
    // Their runs are interrupted: the dead owners' tokens can go.
    for (owner, liveness) in verdicts where liveness == .dead { RunOwner.forget(owner, storePath: log.path) }
    if sweepingTokens {
      let stillClaimed = Set(claims.filter { verdicts[$0.1.owner] != .dead }.map(\.1.owner))
      RunOwner.sweep(storePath: log.path, claimed: stillClaimed, except: mine)
    }
    return interrupted
  }

  /// Interrupts every run under way, whoever claimed it: for a store that was just built from
  /// another's log (`ferry import`), where no process can own a run.
  package func interruptEveryRun() async throws -> [TaskID] {
    try await interrupt(try queueTables { queue in try QueueCommand.claims(queue) })
  }

  /// Interrupts these runs, each only if its claim is unchanged, in one command (one commit).
  private func interrupt(_ claims: [(TaskID, TaskRow.Claim)]) async throws -> [TaskID] {
    if claims.isEmpty { return [] }
    CrashPoint.reach(CrashPoint.recovery)
    let interrupted = try await log.execute { context in
      try claims.filter { id, claim in try QueueCommand.interrupt(id, claim: claim, context) }.map(\.0)
    }
    observer.interrupted(interrupted)
    for id in interrupted { publish(.interrupted(id)) }
    return interrupted
  }

  // MARK: Changing the queue

  /// Adds a task and returns its id once the add is durable.
  ///
  /// `options` (``TaskOptions``) say how it runs when that is not the default:
  ///
  /// ```swift
  /// try await queue.add(tag: "upload", payload: photo, options: [.manual, .priority(.high)])
  /// ```
  ///
  /// With ``UniquePolicy/keep`` and a queued task of the same tag and `dataId` that is not dead,
  /// nothing is added and that task's id is returned. With ``UniquePolicy/replace`` those tasks
  /// leave the queue first (see ``UniquePolicy`` for twins that are running). Unique policies
  /// need a `dataId`.
  ///
  /// ``TaskOption/priority(_:)``: among the tasks that may start, a pass claims the more urgent
  /// first (within a priority: due retries by retry time, then by id). It never reorders a group:
  /// a group's tasks run in id order, and its head competes with its own priority.
  ///
  /// ``TaskOption/deadline(_:)``: no run of the task starts after it (on the store's clock, to the
  /// millisecond). A task still queued then — ready, waiting, blocked, dead, manual or behind its
  /// group's head — leaves the queue with a logged `task.expired` when a claim meets it or a pass
  /// sweeps it (``RunOutcome/expired``, ``TaskUpdate/expired(_:)``). A run already under way at the
  /// deadline is not interrupted; if it fails, no retry starts after the deadline.
  ///
  /// ``TaskOption/schedule(_:)``: when its first run may start, and whether it repeats
  /// (``TaskSchedule``). A repeating task can be neither manual, in a group, nor have a deadline;
  /// a deadline must come after the start.
  @discardableResult
  public func add<Payload: Encodable & Sendable>(
    tag: String, payload: Payload, dataId: String? = nil, groupId: String? = nil, options: TaskOptions = []
  ) async throws(FerryError) -> TaskID {
    try await engine {
      try Self.validate(tag, name: "tag", max: Self.maxTagLength)
      if let dataId { try Self.validate(dataId, name: "dataId", max: Self.maxIdLength) }
      if let groupId { try Self.validate(groupId, name: "groupId", max: Self.maxIdLength) }
      let unique = options.unique
      if unique != .append && dataId == nil {
        throw FerryError.invalidArgument("the unique policy \(unique) needs a dataId to compare tasks by")
      }
      let deadlineMilliseconds = try options.deadline.map(Self.milliseconds(deadline:))
      let stored = try options.schedule.resolved(now: clock())
      if stored.interval != nil && (options.manual || options.deadline != nil || groupId != nil) {
        // In a group, each repetition would wait at the group's end and hold what is added after it.
        throw FerryError.invalidArgument(
          "a repeating task can be neither manual, in a group, nor have a deadline")
      }
      if let start = stored.startAt, let deadlineMilliseconds, deadlineMilliseconds <= start {
        throw FerryError.invalidArgument("the deadline is not after the start: the task could never run")
      }
      let bytes = try Self.encode(payload)
      let event = TaskEvent.added(
        tag: tag, payload: bytes, dataId: dataId, groupId: groupId, manual: options.manual, unique: unique,
        priority: options.priority.rawValue, deadline: deadlineMilliseconds, schedule: stored)
      if unique == .append {
        let id = TaskID(rawValue: try await log.append(event.newEvent))
        observer.added(id, tag: tag, groupId: groupId)
        publish(.added(id))
        return id
      }
      // Keep and replace depend on what is queued: decided inside the commit.
      switch try await log.execute({ context in try QueueCommand.add(event, context) }) {
      case .kept(let existing):
        return existing
      case .added(let id, let replaced):
        for old in replaced { publish(.cancelled(old)) }
        observer.added(id, tag: tag, groupId: groupId)
        publish(.added(id))
        return id
      }
    }
  }

  /// Removes a queued task. A run of it already under way finishes and is logged; the task does
  /// not come back.
  ///
  /// - Parameter id: The task to remove.
  /// - Throws: ``FerryError/noSuchTask(_:)`` when the task is not queued; ``FerryError/closed`` or
  ///   ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  public func cancel(_ id: TaskID) async throws(FerryError) {
    try await engine {
      try await log.execute { context in try QueueCommand.onTask(id, .cancelled(id), context) }
      publish(.cancelled(id))
    }
  }

  /// Removes every task. Runs under way finish and are logged; their tasks do not come back.
  ///
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  public func clear() async throws(FerryError) {
    try await engine {
      _ = try await log.append(TaskEvent.cleared.newEvent)
      publish(.cleared)
    }
  }

  /// Stops automatic running, durably (it stays paused across reopen).
  ///
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  public func pause() async throws(FerryError) {
    try await engine {
      if try await log.execute({ context in try QueueCommand.setPaused(true, context) }) { publish(.paused) }
    }
  }

  /// Starts automatic running again.
  ///
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  public func resume() async throws(FerryError) {
    try await engine {
      if try await log.execute({ context in try QueueCommand.setPaused(false, context) }) {
        publish(.resumed)
      }
    }
  }

  /// Whether automatic running is paused.
  ///
  /// - Returns: True while ``pause()`` is in effect (it lasts across reopen), until ``resume()``.
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public func isPaused() throws(FerryError) -> Bool {
    try engine {
      try queueTables { queue in try queue.tables.get("state", key: QueueKey.paused) == [1] }
    }
  }

  /// Records a user-fixable error on a task: it, and the rest of its group, wait until the error
  /// is resolved.
  ///
  /// - Parameters:
  ///   - id: The task the error is about.
  ///   - message: What the user must fix, for display; cut to ``maxMessageLength`` UTF-8 bytes (on a
  ///     character boundary).
  /// - Returns: The error's id (``RecordedError/errorId``).
  /// - Throws: ``FerryError/noSuchTask(_:)`` when the task is not queued; ``FerryError/closed`` or
  ///   ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  @discardableResult
  public func recordError(_ id: TaskID, message: String) async throws(FerryError) -> UInt64 {
    try await engine {
      let message = Self.loggable(message)
      let errorId = try await log.execute { context in
        try QueueCommand.onTask(id, .errorRecorded(id, message: message, endsRun: false), context)
        return context.sequences.last ?? 0
      }
      observer.errorRecorded(id, message: message)
      publish(.errorRecorded(id, message: message))
      return errorId
    }
  }

  /// Resolves the task's recorded error: the task may run again.
  ///
  /// - Parameter id: The task whose error is resolved.
  /// - Throws: ``FerryError/noSuchTask(_:)`` when the task is not queued; ``FerryError/invalidArgument(_:)``
  ///   when it has no unresolved error; ``FerryError/closed`` or ``FerryError/suspended`` when the store is
  ///   closed or suspended; ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  public func resolveError(_ id: TaskID) async throws(FerryError) {
    try await engine {
      try await log.execute { context in
        try QueueCommand.onTask(id, .errorResolved(id), context) { row in
          guard row.status == .blocked else {
            throw FerryError.invalidArgument("task \(id) has no unresolved error")
          }
        }
      }
      publish(.errorResolved(id))
    }
  }

  /// Makes a dead task ready again (its attempt count is kept).
  ///
  /// - Parameter id: The dead task.
  /// - Throws: ``FerryError/noSuchTask(_:)`` when the task is not queued; ``FerryError/invalidArgument(_:)``
  ///   when it is not dead; ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or
  ///   suspended; ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  public func revive(_ id: TaskID) async throws(FerryError) {
    try await engine {
      try await log.execute { context in
        try QueueCommand.onTask(id, .revived(id), context) { row in
          guard row.status == .dead else { throw FerryError.invalidArgument("task \(id) is not dead") }
        }
      }
      publish(.revived(id))
    }
  }

  /// Appends queue events on the runner's behalf (run started, succeeded, failed, interrupted)
  /// and tells observers.
  func record(_ events: [TaskEvent]) async throws -> [UInt64] {
    let sequences = try await log.append(events.map(\.newEvent))
    for (event, sequence) in zip(events, sequences) {
      for update in event.updates(sequence: sequence) { publish(update) }
    }
    return sequences
  }

  // MARK: Reading the queue

  /// The queued task with this id.
  ///
  /// - Parameter id: The task's id (``TaskID``).
  /// - Returns: The task as it is queued now, or nil when it is not queued (never added, or ended).
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public func task(_ id: TaskID) throws(FerryError) -> PendingTask? {
    try engine {
      try queueTables { queue in try queue.task(id) }
    }
  }

  /// The queued tasks, optionally only those with a tag, group and data id.
  ///
  /// - Parameters:
  ///   - tag: Only tasks of this tag; nil for any.
  ///   - groupId: Only tasks of this group; nil for any (tasks without a group included).
  ///   - dataId: Only tasks with this data id; nil for any.
  /// - Returns: The queued tasks that match, in id order. Tags and ids are compared by their UTF-8 bytes.
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public func pendingTasks(
    tag: String? = nil, groupId: String? = nil, dataId: String? = nil
  ) throws(FerryError) -> [PendingTask] {
    try engine {
      try queueTables { queue in
        try queue.allTasks { row in
          // By bytes, as the queue's indexes tell tags and ids apart (not by `String` equality,
          // which takes two spellings of "café" as one).
          Self.sameBytes(row.tag, tag) && Self.sameBytes(row.groupId, groupId)
            && Self.sameBytes(row.dataId, dataId)
        }
      }
    }
  }

  /// The unresolved error recorded on a task.
  ///
  /// - Parameter id: The task.
  /// - Returns: The error, or nil when the task has no unresolved error (or is not queued).
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public func latestError(_ id: TaskID) throws(FerryError) -> RecordedError? {
    try engine {
      try queueTables { queue in
        try queue.tables.get("errors", key: QueueKey.task(id)).map { try Self.decodeError(id, $0) }
      }
    }
  }

  /// Every unresolved error.
  ///
  /// - Returns: The unresolved errors, in task-id order.
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public func errors() throws(FerryError) -> [RecordedError] {
    try engine {
      try queueTables { queue in
        try queue.tables.entries("errors").map { entry in
          guard let id = TaskID(bigEndianBytes: entry.key) else {
            throw PayloadError("an error key is malformed")
          }
          return try Self.decodeError(id, entry.value)
        }
      }
    }
  }

  /// Decodes a queued task's payload as `type` — the latest given to
  /// ``updatePayload(_:to:)``, else the one it was added with. A payload that no longer decodes (a
  /// changed type, say) throws.
  ///
  /// - Parameters:
  ///   - id: The queued task.
  ///   - type: The type to decode the payload's JSON as.
  /// - Returns: The payload, decoded.
  /// - Throws: ``FerryError/noSuchTask(_:)`` when the task is not queued;
  ///   ``FerryError/payload(taskId:reason:)`` when it does not decode as `type`;
  ///   ``FerryError/malformedEvent(sequence:type:reason:)`` when the event holding it is missing from the
  ///   log; ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public func payload<Payload: Decodable>(of id: TaskID, as type: Payload.Type) throws(FerryError) -> Payload
  {
    try engine {
      let bytes = try payloadBytes(of: id)
      do {
        return try JSONDecoder().decode(type, from: Data(bytes))
      } catch {
        throw FerryError.payload(taskId: id, reason: "it does not decode as \(type): \(error)")
      }
    }
  }

  /// A task's history, read from the log: its add, every run start and outcome, errors recorded
  /// and resolved, payload updates, revival and its end (succeeded, cancelled, expired, cleared,
  /// replaced). A task that ended so while a run of it was under way has that run's outcome after
  /// its end, once logged: the handler ran on, and what it returned is part of the story. Works
  /// for finished tasks too, as long as the log holds their events. Reads the log from the task's
  /// add onward.
  ///
  /// - Parameter id: The task's id, queued or finished.
  /// - Returns: The task's entries in log order.
  /// - Throws: ``FerryError/noSuchTask(_:)`` when the log holds no add of this id (never added, or compacted
  ///   away); ``FerryError/newerFormat(path:message:)`` for an event written by newer software;
  ///   ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public func history(of id: TaskID) throws(FerryError) -> [TaskHistoryEntry] {
    try engine {
      guard let added = try log.event(at: id.rawValue), added.type == "task.added" else {
        throw FerryError.noSuchTask(id)
      }
      guard case .added(let tag, _, let dataId, _, _, _, _, _, _) = try TaskEvent(added) else {
        throw FerryError.noSuchTask(id)
      }
      var entries: [TaskHistoryEntry] = []
      var ended = false
      var inRun = false
      /// This task's `task.cancelled` logged while a run of it was under way, held back until the
      /// next event that is not another task's cancel: when that is an add of its tag and data id
      /// with `replace`, the replace command logged the cancel and the history ends `replaced(by:)`.
      var heldCancel: TaskHistoryEntry?
      func isReplace(_ decoded: TaskEvent) -> Bool {
        guard case .added(let otherTag, _, let otherDataId, _, _, .replace, _, _, _) = decoded, let dataId
        else {
          return false
        }
        // By bytes, as the queue's `unique` index compares: two spellings of "café" are equal
        // `String`s but two data ids.
        return Self.sameBytes(otherTag, tag) && Self.sameBytes(otherDataId, dataId)
      }
      /// The history ended (cancelled, cleared, replaced) while a run of it was under way: that
      /// run's outcome, logged later, is still its history's last entry.
      var awaitingOutcome = false
      func isOutcome(_ decoded: TaskEvent) -> Bool {
        switch decoded {
        case .runSucceeded(id, _), .runFailed(id, _, _, _), .runInterrupted(id), .runDeferred(id, _),
          .errorRecorded(id, _, true):
          return true
        default: return false
        }
      }
      try log.forEachEvent(from: id.rawValue, chunkSize: 2000) { event in
        if ended && !awaitingOutcome || !TaskEvent.typeSet.contains(event.type) { return }
        let decoded = try TaskEvent(event)
        if let cancel = heldCancel, !ended {
          if case .cancelled = decoded { return }  // the same command's cancel of another twin
          ended = true
          awaitingOutcome = true  // a held cancel is one made while the task ran
          entries.append(
            isReplace(decoded)
              ? TaskHistoryEntry(
                sequence: event.sequence, timestampMs: event.timestamp,
                event: .replaced(by: TaskID(rawValue: event.sequence)))
              : cancel)
          // The event that ended the wait may be the run's outcome itself.
        }
        if ended {
          if isOutcome(decoded) {
            entries.append(
              TaskHistoryEntry(
                sequence: event.sequence, timestampMs: event.timestamp, event: decoded.historyKind))
            awaitingOutcome = false
          }
          return
        }
        let about: TaskID?
        var kind = decoded.historyKind
        switch decoded {
        case .added:
          if event.sequence == id.rawValue {
            about = id
          } else if !inRun, isReplace(decoded) {
            // A later add with `replace` took this task's place. (One whose run was under way is
            // cancelled by the replace command first, above; in logs written before that, a task
            // in a run was not replaced.)
            about = id
            kind = .replaced(by: TaskID(rawValue: event.sequence))
          } else {
            about = nil
          }
        case .runStarted(let task, _, _, _, _), .runSucceeded(let task, _), .runFailed(let task, _, _, _),
          .runInterrupted(let task), .runDeferred(let task, _),
          .errorRecorded(let task, _, _), .errorResolved(let task), .cancelled(let task), .revived(let task),
          .payloadUpdated(let task, _), .expired(let task):
          about = task
        case .cleared: about = id
        case .paused, .resumed: about = nil
        }
        guard about == id else { return }
        let entry = TaskHistoryEntry(sequence: event.sequence, timestampMs: event.timestamp, event: kind)
        switch decoded {
        case .cancelled:
          // The replace command cancels only a twin whose run is under way: a cancel without one
          // is the app's own, whatever add comes next.
          if inRun {
            heldCancel = entry
            return
          }
          ended = true
        case .runStarted: inRun = true
        case .runFailed, .runInterrupted, .runDeferred: inRun = false
        case .errorRecorded(_, _, let endsRun): if endsRun { inRun = false }
        case .runSucceeded, .expired: ended = true
        case .cleared:
          ended = true
          awaitingOutcome = inRun
        case .added: if event.sequence != id.rawValue { ended = true }
        default: break
        }
        entries.append(entry)
      }
      if !ended, let cancel = heldCancel { entries.append(cancel) }
      return entries
    }
  }

  /// The output a succeeded task left (``TaskResult/succeeded(output:invalidating:)``), or nil
  /// when it left none, has not succeeded, or its output was compacted away
  /// (`Specs/task-events.md` §3.3 says how long outputs are kept).
  ///
  /// ```swift
  /// // An edit queued behind the create of a note made offline: the server's id came with the create.
  /// guard let created = try queue.output(of: edit.createTask) else { return .recordError("no server id") }
  /// let serverId = try created.decode(as: String.self)
  /// ```
  ///
  /// - Parameter id: The task.
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public func output(of id: TaskID) throws(FerryError) -> TaskOutput? {
    try engine {
      try queueTables { queue in try queue.output(of: id).map { TaskOutput(stored: $0.output) } }
    }
  }

  /// The output of the newest succeeded task with a data id (and tag, when given) that left one.
  ///
  /// - Parameters:
  ///   - dataId: The data id the task was added with.
  ///   - tag: Only tasks of this tag; nil for any.
  /// - Returns: The output, or nil when no succeeded task of this data id (and tag) left one that is still
  ///   kept.
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public func output(dataId: String, tag: String? = nil) throws(FerryError) -> TaskOutput? {
    try engine {
      try queueTables { queue in
        for id in try queue.outputs(dataId: dataId) {
          guard let (taskTag, output) = try queue.output(of: id) else { continue }
          if tag == nil || tag == taskTag { return TaskOutput(stored: output) }
        }
        return nil
      }
    }
  }

  /// The store's identity (``FerryStore/storeId``).
  ///
  /// - Throws: ``FerryError/malformedEvent(sequence:type:reason:)`` when the store has no id;
  ///   ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public var storeId: String {
    get throws(FerryError) {
      guard let id = try engine({ try log.storeId() }) else {
        throw FerryError.malformedEvent(sequence: 0, type: "meta", reason: "the store has no id")
      }
      return id.description
    }
  }

  /// The first queued task of a group — the one that runs next. It is always a task ``task(_:)``
  /// returns. A task cancelled (or cleared, or replaced)
  /// while a run of it is under way is no longer queued and is never returned, although it holds
  /// its group until that run ends: meanwhile the task returned reads
  /// ``TaskStatus/waitingForGroup(behind:)`` naming the cancelled task.
  ///
  /// - Parameter groupId: The group.
  /// - Returns: The id of the group's first queued task, or nil when the group has none queued.
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public func head(of groupId: String) throws(FerryError) -> TaskID? {
    try engine {
      try queueTables { queue in try queue.firstQueued(of: groupId) }
    }
  }

  /// A queued task's current payload (JSON bytes): read where the queue says it is, in the same
  /// snapshot. ``FerryError/noSuchTask(_:)`` when it is not queued.
  func payloadBytes(of id: TaskID) throws -> [UInt8] {
    try log.read { view in
      let queue = QueueTables(try view.tables(of: TaskQueueProjection.projectionName))
      guard try queue.row(id)?.isQueued == true else { throw FerryError.noSuchTask(id) }
      return try Self.payload(of: id, at: queue.payloadSource(id)) { try view.event(at: $0) }.bytes
    }
  }

  /// The payload the event at `sequence` carries for task `id` (its add, or a payload update),
  /// read with `event`, and that event's id — the payload's idempotency key; a missing or other
  /// event is a malformed log.
  static func payload(
    of id: TaskID, at sequence: UInt64, _ event: (UInt64) throws -> LoggedEvent?
  ) throws -> (bytes: [UInt8], key: EventID) {
    guard let logged = try event(sequence), let payload = try TaskEvent(logged).carriedPayload else {
      throw FerryError.malformedEvent(
        sequence: sequence, type: sequence == id.rawValue ? "task.added" : "task.payloadUpdated",
        reason: "the event holding queued task \(id)'s payload is missing from the log")
    }
    return (payload, logged.id)
  }

  /// The task a pass would claim next: the most urgent priority first; within it, a retry whose
  /// time has come (oldest retry time first), else the lowest-id ready task after `after` — not
  /// manual, not running, first in its group. Reads the indexes' first keys (one seek per priority
  /// level present), never the whole queue. A task past its deadline may be named: the claim
  /// expires it instead of running it.
  ///
  /// - Parameters:
  ///   - after: Ready tasks are looked for after this id (nil: from the first).
  ///   - date: The time to decide by: the store's clock now when nil; taken to the millisecond, as the log
  ///     keeps times.
  /// - Returns: The task, or nil when none may start at `date`.
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public func nextRunnable(after: TaskID? = nil, at date: Date? = nil) throws(FerryError) -> PendingTask? {
    try engine {
      try probeNextRunnable(after: after, at: date?.unixMilliseconds).task
    }
  }

  /// ``nextRunnable(after:at:)`` with the count of index entries and rows it read.
  func probeNextRunnable(
    after: TaskID? = nil, at now: Int64? = nil
  ) throws -> (task: PendingTask?, touched: Int) {
    let time = now ?? clock()
    return try queueTables { queue in
      var queue = queue
      guard let id = try queue.nextRunnable(after: after ?? .zero, now: time) else {
        return (nil, queue.touched)
      }
      return (try queue.row(id)?.task(id: id), queue.touched + 1)
    }
  }

  // MARK: Helpers

  /// A deadline as Unix milliseconds (rounded down), or `invalidArgument` when it has none.
  static func milliseconds(deadline: Date) throws -> Int64 {
    let value = (deadline.timeIntervalSince1970 * 1000).rounded(.down)
    guard value.isFinite, value >= -9.2e18, value <= 9.2e18 else {
      // Not `\(deadline)`: describing a Date of NaN or infinite seconds traps in Foundation.
      throw FerryError.invalidArgument(
        "the deadline \(deadline.timeIntervalSince1970) s since 1970 is not a time Ferry can store")
    }
    return Int64(value)
  }

  private func queueTables<R>(_ body: (QueueTables<ProjectionReader>) throws -> R) throws -> R {
    try log.read { view in try body(QueueTables(view.tables(of: TaskQueueProjection.projectionName))) }
  }

  static func decodeError(_ id: TaskID, _ bytes: [UInt8]) throws -> RecordedError {
    var reader = PayloadReader(bytes)
    let errorId = try reader.read(UInt64.self, "errorId")
    let message = try reader.readString("message")
    let at = try reader.read(Int64.self, "recordedAt")
    try reader.finish("an error row")
    return RecordedError(taskId: id, errorId: errorId, message: message, recordedAtMs: at)
  }

  /// The longest message logged with a failure or a recorded error, in UTF-8 bytes.
  public static let maxMessageLength = 64 << 10

  /// `message`, cut to ``maxMessageLength`` bytes (on a character boundary) so it can always be logged.
  static func loggable(_ message: String) -> String {
    if message.utf8.count <= maxMessageLength { return message }
    var cut = ""
    for character in message {
      if cut.utf8.count + character.utf8.count > maxMessageLength - 3 { break }
      cut.append(character)
    }
    return cut + "…"
  }

  /// Whether `value` has the bytes of `wanted`; true when nothing is wanted.
  static func sameBytes(_ value: String?, _ wanted: String?) -> Bool {
    guard let wanted else { return true }
    guard let value else { return false }
    return value.utf8.elementsEqual(wanted.utf8)
  }

  private static func validate(_ value: String, name: String, max: Int) throws {
    let count = value.utf8.count
    guard (1...max).contains(count) else {
      throw FerryError.invalidArgument("\(name) must be 1 to \(max) UTF-8 bytes, not \(count)")
    }
  }
}
