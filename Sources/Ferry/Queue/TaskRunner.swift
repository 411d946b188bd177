import FerryLog
import Foundation
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
/// let window = try await runner.run(for: .seconds(25))   // or: a background window (run(until:))
/// runner.conditionsChanged()                   // the network is back: ask isReadyToRun again
/// ```
///
/// Before a handler is called its `runStarted` event is durable, and its result is logged when it
/// returns: a crash in between leaves a run the next open reports as interrupted (at-least-once).
public final class TaskRunner: Sendable {
  /// How the runner runs.
  public struct Configuration: Sendable {
    /// Tasks of different groups may run at once, up to this many; one group never runs two.
    /// Taken as 1 to ``TaskRunner/widestPass`` (so `Int.max` means "as many as that").
    public var maxConcurrentTasks = 1
    /// The retry policy of tags registered without one.
    public var defaultRetry = RetryPolicy()
    /// Named sets of tags, for ``RunFilter/collection(_:)``.
    public var collections: [String: [String]] = [:]
    /// A random number in 0..<1 for backoff jitter (tests make it fixed).
    public var random: @Sendable () -> Double = { Double.random(in: 0..<1) }
    /// While running automatically, how often to look for runs whose owner died (another process
    /// killed mid-run) so that their tasks run again here.
    public var deadOwnerCheckInterval: Duration = .seconds(2)
    /// The time limit of a run of tags registered without one (nil: no limit). See
    /// ``TaskRunner/register(tag:retry:timeLimit:isReadyToRun:handler:)-(String,_,_,_,_)``.
    public var defaultTimeLimit: Duration?
    /// How long a run past its time limit has, once its handler is cancelled, to end before the
    /// runner logs the timeout and stops waiting for it.
    public var timeLimitGrace: Duration = .seconds(5)
    /// How long a run has, once its pass is stopped (``TaskRunner/stop()``, a window's deadline,
    /// or the cancellation of a window's caller) and its handler cancelled, to end before the
    /// runner logs it as interrupted and stops waiting for it. Measured on the store's clock.
    public var interruptionGrace: Duration = .seconds(2)
    /// A check every task must pass before it runs, whatever its tag — the conditions of the
    /// whole runner, like a scheduler's constraints ("the network is reachable", "not in Low
    /// Power Mode"). Asked before the tag's own `isReadyToRun`; a `false` skips the task with
    /// ``SkipReason/notReady`` like the tag's check. Call ``TaskRunner/conditionsChanged()`` when
    /// what it reads changes. Nil (the default): no such check. With a check, each task is asked
    /// and then claimed (two commits instead of one).
    public var isReadyToRun: (@Sendable (PendingTask) async -> Bool)?
    /// Whether the device can reach the network (`PathConnectivity` on Apple platforms, your
    /// own or ``ManualConnectivity`` elsewhere). While it says offline no run starts — no attempt
    /// is spent, no backoff grows — and a retryable failure that ends then is a deferral; when it
    /// comes back, automatic running and every window run a pass at once. Nil (the default): the
    /// runner assumes it is online.
    public var connectivity: (any Connectivity)?
    /// How long a task whose run said ``TaskResult/deferred(_:)`` waits in this runner before it
    /// is tried again, unless connectivity comes back or ``TaskRunner/conditionsChanged()`` is
    /// called first. At least ``TaskRunner/minimumDeferralDelay`` (1 s).
    public var deferralDelay: Duration = .seconds(30)

    /// The defaults: one task at a time, no limit on attempts with 1 s doubling backoff up to
    /// 1 h, no time limit, no connectivity input.
    public init() {}
  }

  /// A handler with its policies.
  struct Registration: Sendable {
    let retry: RetryPolicy?
    let timeLimit: Duration?
    let isReadyToRun: (@Sendable (PendingTask) async -> Bool)?
    let run: @Sendable (RunningTask) async throws -> TaskResult
    /// A batched handler (``TaskRunner/register(tag:batchSize:retry:timeLimit:isReadyToRun:handler:)``)
    /// and its most tasks a call; nil for a handler of one task.
    var batch: (size: Int, handler: @Sendable ([RunningTask]) async throws -> [TaskID: TaskResult])?
  }

  /// The run whose handler the current task is in: set around every handler call (and so seen
  /// by every task the handler starts, structured or not, but not by detached ones).
  struct HandlerScope: Sendable {
    /// The store the run is on (its directory).
    let store: String
    let taskId: TaskID
    /// The other tasks of a batched handler's call (empty for a call of one task): a request
    /// from the handler to run one of them waits for that same call too.
    var batchIds: [TaskID] = []
    /// The pass that called the handler; nil for a single-task run.
    let pass: ObjectIdentifier?
    /// The handler's own call: which task runs it, and whether it is still under way.
    let call: HandlerCall

    /// Whether the caller is the handler itself, its call still under way: a request from it
    /// that waits for its pass (or its own run) would wait for itself. A task the handler
    /// started and does not await sees this scope too, but cannot hold the handler: its request
    /// waits for the pass like anyone's.
    var isTheHandlerItself: Bool { call.isCurrentTask }
  }

  @TaskLocal static var handlerScope: HandlerScope?

  /// The most runs one pass has under way at once, whatever ``Configuration/maxConcurrentTasks`` says.
  public static let widestPass = 1 << 16

  /// Throws ``FerryError/invalidArgument(_:)`` when the caller is a handler called by this
  /// runner's pass under way, asking from its own task while its call is under way: a request
  /// that joins that pass, or waits for it to end, would wait for the handler that waits for it —
  /// forever. A task the handler started is not refused: unless the handler awaits it, the
  /// handler returns and the pass ends (the runner cannot see whether it is awaited).
  func refuseWaitingForOwnPass(_ what: String) throws {
    guard let scope = Self.handlerScope, let mine = scope.pass, scope.isTheHandlerItself else { return }
    let waitsForItself = state.withLock { s in s.pass.map { ObjectIdentifier($0.control) == mine } ?? false }
    if waitsForItself {
      throw FerryError.invalidArgument(
        "\(what) from a handler called by this runner's pass would wait for that pass, which waits for the handler"
      )
    }
  }

  /// The pass under way.
  struct ActivePass {
    let task: Task<RunReport, any Error>
    let filter: RunFilter
    let control: PassControl
  }

  struct State {
    var handlers: [String: Registration] = [:]
    /// The batched tags' batch sizes, kept beside `handlers` so a claim command reads them as one value.
    var batchSizes: [String: Int] = [:]
    var pass: ActivePass?
    /// The automatic-running loop and the signal that wakes it (one per loop, so a loop stopped
    /// and a new one started never share a waiter).
    var automatic: (task: Task<Void, Never>, wakeup: WakeSignal)?
    /// The background windows under way (``TaskRunner/run(until:_:)``), by number.
    var windows: [Int: WindowHandle] = [:]
    var nextWindow = 0
    /// A suspension of the store stopped automatic running, and the app has not stopped the
    /// runner since: the resume starts it again.
    var resumesAutomatically = false
  }

  /// The queue it runs.
  public let queue: TaskQueue
  /// Its configuration.
  public let configuration: Configuration
  let state = Mutex(State())
  /// This runner's number among the queue's runners: its claims name it, with the process's owner id.
  let number: UInt32
  let unhandled = UnhandledTasks()
  /// Tasks whose run in this runner was deferred, until when (store-clock ms).
  let deferred = DeferredTasks()
  /// The task that listens to the connectivity input; cancelled with the runner.
  private let connectivityListener = Mutex<Task<Void, Never>?>(nil)

  /// The most cache keys one success makes stale (``TaskResult/succeeded(output:invalidating:)``);
  /// further keys are dropped. 1,000 keys of 400 bytes fit the log's payload limit many times over.
  public static let maxStaleKeys = 1000
  /// The shortest ``Configuration/deferralDelay``: a shorter one would run a task that always
  /// defers again and again.
  public static let minimumDeferralDelay: Duration = .seconds(1)

  /// Whether the runner's connectivity input says it may reach the network.
  var isOnline: Bool { configuration.connectivity?.isOnline ?? true }

  /// A runner for `queue`.
  public init(queue: TaskQueue, configuration: Configuration = Configuration()) {
    self.queue = queue
    self.configuration = configuration
    self.number = queue.nextRunnerNumber()
    queue.adopt(self)
    if let connectivity = configuration.connectivity {
      // Back online: whatever waited for the network (automatic running, windows, deferred tasks) goes on at once.
      let changes = connectivity.changes()
      let listener = Task { [weak self] in
        for await online in changes where online {
          guard let self else { return }
          self.conditionsChanged()
        }
      }
      connectivityListener.withLock { $0 = listener }
    }
  }

  deinit { connectivityListener.withLock { $0 }?.cancel() }

  /// Registers the handler of a tag (replacing any earlier one), with an optional retry policy, an
  /// optional time limit per run and an optional check that the task may run now (a `false`
  /// skips it with ``SkipReason/notReady``).
  ///
  /// A run still going when its **time limit** (measured on the store's clock; at least 1 ms;
  /// ``Configuration/defaultTimeLimit`` when nil) has passed is cancelled: the handler's task is
  /// cancelled, and a handler that then throws — `CancellationError` or anything else — has
  /// failed with "timed out after …", a retryable failure under the tag's retry policy, so its
  /// group goes on after the backoff. A handler that returns a result after all has that result
  /// logged. A handler that ignores cancellation gets ``Configuration/timeLimitGrace`` more; then
  /// the runner logs the timeout and stops waiting for it, so it never holds its group (or the
  /// pass) for ever. Whatever it returns later is dropped: its run's one outcome is logged.
  ///
  /// ```swift
  /// runner.register(tag: "upload", timeLimit: .seconds(30)) { task in
  ///   try await api.upload(task.payload(as: Upload.self))   // URLSession stops when cancelled
  ///   return .succeeded
  /// }
  /// ```
  public func register(
    tag: String, retry: RetryPolicy? = nil, timeLimit: Duration? = nil,
    isReadyToRun: (@Sendable (PendingTask) async -> Bool)? = nil,
    handler: @escaping @Sendable (RunningTask) async throws -> TaskResult
  ) {
    let loop = state.withLock { s in
      s.handlers[tag] = Registration(
        retry: retry, timeLimit: timeLimit, isReadyToRun: isReadyToRun, run: handler)
      s.batchSizes[tag] = nil
      unhandled.forget()
      return s.automatic
    }
    loop?.wakeup.signal()
  }

  /// The largest batch a batched handler is given, whatever its registration asks.
  public static let maxBatchSize = 1000

  /// Registers a batched handler of a tag (replacing any earlier handler): each call gets up to
  /// `batchSize` of the tag's tasks that may start (taken as 1 to ``maxBatchSize``), claimed in
  /// one commit, and returns an outcome for each by id. Their outcomes are logged in one commit.
  ///
  /// A batch is the tasks a pass would have run one by one, in that order: the first task the
  /// pass may start, then the tasks right behind it **in its group** while they have this tag
  /// and may start, then other group heads (and tasks without a group) of the tag at the same
  /// priority, each followed by the tasks behind it in its group. **Group order:** when a task of
  /// a group does not succeed — it fails, records an error, is deferred or has no outcome — every
  /// later task of that group in the batch is given back (not run: its attempt does not count,
  /// and it waits behind its group's head as usual) whatever the handler said of it, and the
  /// report lists it as ``SkipReason/partOfFailedGroup``. A server that applies a batch must so
  /// stop each group at its first failure, and answer for the rest that they were not applied.
  ///
  /// - A task the handler gives **no outcome** for is deferred (``TaskResult/deferred(_:)``): its
  ///   attempt is given back, and this runner tries it again after
  ///   ``Configuration/deferralDelay`` (or when conditions change). Outcomes for ids not in the
  ///   batch are ignored.
  /// - A **thrown error** fails every task of the batch — retryable by the tag's retry policy,
  ///   except that a ``FerryError/payload(taskId:reason:)`` fails its own task for good.
  /// - The **time limit** applies to the call as a whole; a timed-out batch fails every task.
  /// - `isReadyToRun` and ``Configuration/isReadyToRun`` are asked of the batch's first task;
  ///   the tasks the claim adds to it run with it.
  /// - Each task keeps its own ``RunningTask/idempotencyKey``. A batch cut short by a crash is
  ///   interrupted as a whole when the store opens again, and its tasks are sent again — in a
  ///   batch, with the same keys. An output a task's success leaves is kept when the batch's
  ///   outcomes are logged: a later task of the same batch cannot read it.
  /// - ``run(_:)`` with ``RunFilter/task(_:)`` calls the handler with that one task.
  ///
  /// ```swift
  /// runner.register(tag: "note-change", batchSize: 16) { tasks in
  ///   let answers = try await api.apply(tasks.map { ($0.idempotencyKey, $0.payloadBytes) })
  ///   return Dictionary(uniqueKeysWithValues: zip(tasks.map(\.id), answers.map { $0.ok ? .succeeded : .failed($0.error) }))
  /// }
  /// ```
  public func register(
    tag: String, batchSize: Int, retry: RetryPolicy? = nil, timeLimit: Duration? = nil,
    isReadyToRun: (@Sendable (PendingTask) async -> Bool)? = nil,
    handler: @escaping @Sendable ([RunningTask]) async throws -> [TaskID: TaskResult]
  ) {
    let size = min(max(1, batchSize), Self.maxBatchSize)
    let loop = state.withLock { s in
      var registration = Registration(
        retry: retry, timeLimit: timeLimit, isReadyToRun: isReadyToRun,
        run: { task in
          try await handler([task])[task.id] ?? .deferred(Self.noOutcome)
        })
      registration.batch = (size, handler)
      s.handlers[tag] = registration
      s.batchSizes[tag] = size
      unhandled.forget()
      return s.automatic
    }
    loop?.wakeup.signal()
  }

  /// The deferral of a batch's task its handler gave no outcome for.
  static let noOutcome = "the batch handler returned no outcome for this task"

  // MARK: Passes

  /// Runs one pass over the tasks `filter` selects and reports what happened to each task it
  /// touched. A pass claims runnable tasks one after another from the queue's indexes — due
  /// retries first (oldest retry time first), then ready tasks in task-id order, and within a
  /// group strictly in order — so blocked, dead, waiting, manual and non-head tasks cost nothing
  /// and are not in the report. A task whose handler is missing or whose `isReadyToRun` says no is
  /// skipped; one that fails or records an error keeps the rest of its group for a later pass, and
  /// the report names that rest (``SkipReason/partOfFailedGroup``). A `.group` pass whose head may
  /// not start says why.
  ///
  /// `.task(id)` runs that task (manual or not) alongside any pass; when another runner or
  /// process is running it, it waits for that run and reports its outcome. A pass asked for while
  /// one runs joins it when that pass covers the request (the same filter, or `.all` for a group
  /// or a collection): the joined pass goes on until it has looked at the queue as it stood when
  /// the request came, so a task added before `run()` is in its report.
  ///
  /// A handler may call it, from its own task or from a task it starts (`Task {}`). Asked from
  /// the handler's own task for the pass that called it (or, by any runner, for its own task or
  /// a task of its batch) it throws ``FerryError/invalidArgument(_:)``: it would wait for itself.
  /// From a task the handler starts it runs like any request, once the handler has returned — as
  /// long as the handler does not await that task.
  ///
  /// Throws ``FerryError/unknownCollection(_:)`` and ``FerryError/noSuchTask(_:)`` for a filter
  /// naming nothing.
  public func run(_ filter: RunFilter = .all) async throws(FerryError) -> RunReport {
    try await engine {
      if case .collection(let name) = filter, configuration.collections[name] == nil {
        throw FerryError.unknownCollection(name)
      }
      if case .task(let id) = filter {
        if let scope = Self.handlerScope, scope.taskId == id || scope.batchIds.contains(id),
          scope.store == queue.log.path, scope.isTheHandlerItself
        {
          // It would wait for this very run's outcome, which waits for it.
          throw FerryError.invalidArgument(
            "task \(id)'s own handler cannot run it: the run would wait for itself")
        }
        guard try queue.task(id) != nil else { throw FerryError.noSuchTask(id) }
        return try await runSingle(id)
      }
      try refuseWaitingForOwnPass("run(\(filter))")
      return try await pass(filter, joinRunning: true).report
    }
  }

  /// Starts a pass, or joins the one under way when `joinRunning` and it covers `filter` (the
  /// same filter, or `.all` for a group or collection), was not stopped, and will still look at
  /// the queue as it stands now. `cutShort`: the pass was stopped or reached a window's deadline
  /// (``PassControl/wasCutShort``) rather than running out of work.
  func pass(
    _ filter: RunFilter, joinRunning: Bool, automatic: Bool = false
  ) async throws -> (report: RunReport, cutShort: Bool) {
    let required = try queue.log.head()
    while true {
      let (pass, control, joined) = state.withLock { s -> (Task<RunReport, any Error>, PassControl, Bool) in
        if let running = s.pass {
          let joins =
            joinRunning && Self.covers(running.filter, filter) && !running.task.isCancelled
            && running.control.join(requiring: required)
          return (running.task, running.control, joins)
        }
        let control = PassControl(stopsWhenPaused: automatic)
        let pass = Task { [self] in
          defer { state.withLock { $0.pass = nil } }
          return try await executePass(filter, control: control)
        }
        s.pass = ActivePass(task: pass, filter: filter, control: control)
        return (pass, control, true)
      }
      if joined {
        let report = try await pass.value
        // An automatic pass joined by a caller stopped claiming when the queue was paused: the
        // caller's own request is not bound by the pause, so it runs a pass of its own.
        if control.wasStoppedByPause && !automatic { continue }
        return (report, control.wasCutShort)
      }
      _ = try? await pass.value  // wait for it to end, then start one of our own
    }
  }

  /// Whether a running pass over `running` answers a request for `requested`.
  static func covers(_ running: RunFilter, _ requested: RunFilter) -> Bool {
    if running == requested { return true }
    switch (running, requested) {
    case (.all, .group), (.all, .collection): return true
    default: return false
    }
  }

  /// Cancels the pass under way (its handler sees cancellation; its task is logged as
  /// interrupted and is ready again) and stops automatic running.
  ///
  /// Windows under way (``run(until:_:)``) end too, with ``WindowReport/End/stopped``. A handler
  /// that ignores its cancellation gets ``Configuration/interruptionGrace``; then its run is
  /// logged as interrupted and the runner stops waiting for it.
  public func stop() {
    _ = halt(forSuspension: false)
  }

  /// What ``stop()`` does; returns the pass and the automatic loop it stopped. For a suspension
  /// the resume is to start automatic running again; after a stop of the app's it is not.
  private func halt(forSuspension: Bool) -> (pass: ActivePass?, automatic: Task<Void, Never>?) {
    let (pass, automatic, windows) = state.withLock { s in
      defer { s.automatic = nil }
      s.resumesAutomatically = forSuspension && (s.automatic != nil || s.resumesAutomatically)
      // Cut under the lock: a window never starts a pass after this (see `windowPass`).
      for window in s.windows.values { window.cut.cut(.stopped) }
      return (s.pass, s.automatic, Array(s.windows.values))
    }
    automatic?.task.cancel()
    automatic?.wakeup.signal()
    for window in windows { window.wakeup.signal() }
    pass?.task.cancel()
    return (pass, automatic?.task)
  }

  /// Stops the runner for a suspension of its store, as ``stop()`` does, and waits until the pass
  /// under way has ended — its runs' outcomes logged, or logged as interrupted after
  /// ``Configuration/interruptionGrace`` — and automatic running has stopped. Returns whether it
  /// ran automatically, so that the resume starts it again.
  func suspendRunning() async -> Bool {
    let (pass, automatic) = halt(forSuspension: true)
    _ = try? await pass?.task.value
    await automatic?.value
    return automatic != nil
  }

  /// After the store's resume: starts automatic running again when a suspension stopped it and
  /// the app did not stop the runner since; wakes a loop the app started while the store was
  /// suspended (its passes found the store suspended, and nothing else may come to wake it).
  func resumeRunning() {
    let (restart, running) = state.withLock { s in
      defer { s.resumesAutomatically = false }
      return (s.resumesAutomatically && s.automatic == nil, s.automatic?.wakeup)
    }
    if restart { startAutomaticRunning() }
    running?.signal()
  }

  /// Tells the runner that what its `isReadyToRun` checks look at has changed (the network is
  /// back, the battery is charging, the user signed in): automatic running runs a pass now, and
  /// every window (``run(until:_:)``) waiting for a retry time runs one too, asking the checks
  /// again. A task skipped as ``SkipReason/notReady`` runs then, without the app calling
  /// ``run(_:)``. A pass under way finishes first and another follows it. With neither automatic
  /// running nor a window under way it does nothing: call ``run(_:)``.
  ///
  /// ```swift
  /// runner.register(tag: "upload", isReadyToRun: { _ in network.isOnline }) { task in … }
  /// runner.startAutomaticRunning()
  /// network.onChange { runner.conditionsChanged() }     // e.g. from NWPathMonitor
  /// ```
  public func conditionsChanged() {
    deferred.removeAll()
    let (automatic, windows) = state.withLock { s in (s.automatic, Array(s.windows.values)) }
    automatic?.wakeup.signal()
    for window in windows { window.wakeup.signal() }
  }

  func executePass(_ filter: RunFilter, control: PassControl) async throws -> RunReport {
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

  private var handlerInfo: HandlerInfo {
    // The generation is read with the handlers, under the same lock `register` takes.
    state.withLock { s in
      HandlerInfo(
        tags: s.handlers.mapValues { $0.isReadyToRun != nil || configuration.isReadyToRun != nil },
        batchSizes: s.batchSizes, unhandled: unhandled,
        generation: unhandled.generation, deferred: deferred)
    }
  }

  /// A run that ended, with the events that log its outcome.
  /// A run that ended: what to log and report. A struct, not a tuple: a tuple is copied through
  /// the runtime's generic witnesses (~300 instructions a copy, several copies a run, measured).
  struct Finished: Sendable {
    let run: ClaimedRun
    let events: [TaskEvent]
    let outcome: TaskOutcome
    /// The last (or only) run of a handler call: the call's lane is free again.
    var endsLane = true
    init(_ run: ClaimedRun, _ events: [TaskEvent], _ outcome: TaskOutcome) {
      self.run = run
      self.events = events
      self.outcome = outcome
    }
  }

  /// What one command of a pass did: the outcomes it logged, the runs it claimed, what it skipped
  /// and where its search stopped.
  struct BatchStep: Sendable {
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
        let step: BatchStep
        do {
          step = try await queue.log.execute { context -> BatchStep in
            var step = BatchStep(cursors: cursors)
            // A claim of a batched tag leads a batch, filled in this command. (`step` passed, not
            // captured: a captured struct is checked as a whole, and two of its fields are inout below.)
            func take(_ run: ClaimedRun, _ step: inout BatchStep) throws {
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
            var successors: [String] = []
            for run in toFinish {
              var repetition: TaskID?
              let logged = try QueueCommand.finish(
                run.run.task.id, claim: run.run.claim, outcome: run.events, now: clock(), context,
                repetition: &repetition)
              if let repetition { step.repetitions.append((repetition, run.run.task)) }
              step.logged.append(logged)
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
            if !self.isOnline {
              step.offline = true
              return step
            }
            // Automatic running paused while its pass was under way: nothing more is claimed.
            if control.stopsWhenPaused,
              try QueueCommand.tables(context).tables.get("state", key: QueueKey.paused) == [1]
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
            return step
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
      let result = try await queue.log.execute { context -> (SingleClaim?, [ClaimedRun]?) in
        let now = clock()
        // A window's deadline came while the check was asked — the window may have joined then.
        if let deadline = control.deadline, now >= deadline { return (nil, nil) }
        let decision = try ClaimSearch.claim(
          task.id, context, owner: owner, runner: runner, now: now, handlers: handlers, checked: true)
        guard case .claimed(let run) = decision, let size = handlers.batchSizes[run.task.tag] else {
          return (decision, nil)
        }
        let batch = try ClaimSearch.fillBatch(
          run, size: size, context, pass: pass, cursors: pass.cursors(), handlers: handlers, owner: owner,
          runner: runner, now: now)
        return (decision, batch)
      }
      (decided, members) = (result.0, result.1)
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
  private func isReady(_ task: PendingTask, _ registration: Registration) async -> Bool {
    if let check = configuration.isReadyToRun, !(await check(task)) { return false }
    if let check = registration.isReadyToRun, !(await check(task)) { return false }
    return true
  }

  /// Logs runs' outcomes in one command (each only if the run is still the runner's) and tells
  /// observers of those logged.
  private func logOutcomes(_ runs: [Finished]) async throws -> [QueueCommand.FinishOutcome] {
    let clock = queue.clock
    let (logged, repetitions) = try await queue.log.execute { context in
      var repetitions: [(id: TaskID, of: PendingTask)] = []
      let logged = try runs.map { run in
        var repetition: TaskID?
        defer { if let repetition { repetitions.append((repetition, run.run.task)) } }
        return try QueueCommand.finish(
          run.run.task.id, claim: run.run.claim, outcome: run.events, now: clock(), context,
          repetition: &repetition)
      }
      return (logged, repetitions)
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

  /// Calls the handler of a claimed run and turns its result into the events that end the run.
  private func runClaimed(_ run: ClaimedRun, control: PassControl? = nil) async -> Finished {
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
  private func finished(
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
  private func runBatch(_ runs: [ClaimedRun], control: PassControl? = nil) async -> [Finished] {
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
  private func failure(_ error: any Error, of id: TaskID) -> TaskResult {
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

  private func skip(_ id: TaskID, _ reason: SkipReason) -> TaskOutcome {
    queue.publish(.skipped(id, reason))
    return .skipped(reason)
  }

  // MARK: One task

  /// Runs one task now, or waits for the run another runner has under way, and reports its outcome.
  private func runSingle(_ id: TaskID) async throws -> RunReport {
    try await queue.interruptRunsOfDeadOwners()
    let owner = try queue.runOwner().id
    let runner = number
    let clock = queue.clock
    var checked = false
    while true {
      if !isOnline {
        var report = RunReport()
        report.entries = [RunReport.Entry(taskId: id, outcome: skip(id, .offline))]
        report.offline = true
        return queue.observer.passEnded(report)
      }
      let handlers = handlerInfo
      let isChecked = checked
      queue.reserveRuns(1)
      let decision: SingleClaim
      do {
        decision = try await queue.log.execute { context in
          try ClaimSearch.claim(
            id, context, owner: owner, runner: runner, now: clock(), handlers: handlers, checked: isChecked)
        }
      } catch {
        queue.endRuns(1)
        throw error
      }
      if case .claimed = decision {} else { queue.endRuns(1) }
      let outcome: TaskOutcome
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
      var report = RunReport()
      report.entries = [RunReport.Entry(taskId: id, outcome: outcome)]
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
  ) async throws -> TaskOutcome {
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

/// One handler call: the task that runs it (known once it starts) and whether it is still under
/// way. A request made from that very task while it runs would wait for itself; one made from a
/// task it started is another task, and one made after it ended waits for nothing of it.
final class HandlerCall: Sendable {
  private let state = Mutex<(task: Int?, ended: Bool)>((nil, false))

  /// Called first thing in the handler's own task.
  func enter() {
    let task = withUnsafeCurrentTask { $0?.hashValue }
    state.withLock { $0.task = task }
  }

  /// The runner is done with the call (it returned, threw, or was left behind).
  func end() { state.withLock { $0.ended = true } }

  /// Whether the current task is the handler's own and its call is still under way. (A task's
  /// identity is unique among live tasks; once the call ended, a new task that took its place in
  /// memory is not mistaken for it.)
  var isCurrentTask: Bool {
    guard let current = withUnsafeCurrentTask(body: { $0?.hashValue }) else { return false }
    return state.withLock { !$0.ended && $0.task == current }
  }
}

/// The tasks a runner found no handler for, since its last `register`. A pass remembers what it
/// found under the generation it started with: a `register` in between starts a new generation,
/// and what an older pass found then is not remembered (it may have a handler now).
final class UnhandledTasks: Sendable {
  private let state = Mutex<(generation: Int, ids: Set<TaskID>)>((0, []))

  var generation: Int { state.withLock { $0.generation } }
  func contains(_ id: TaskID) -> Bool { state.withLock { $0.ids.contains(id) } }
  /// Remembers a task found without a handler under `generation`; false when it was known already
  /// (or the generation is over: then nothing is remembered, and the skip is reported).
  func insert(_ id: TaskID, generation: Int) -> Bool {
    state.withLock { s in
      guard s.generation == generation else { return true }
      return s.ids.insert(id).inserted
    }
  }
  func forget() {
    state.withLock { s in
      s.generation += 1
      s.ids = []
    }
  }
}

/// The tasks a runner's runs deferred (``TaskResult/deferred(_:)``), each until a time on the
/// store's clock: its passes pass over them (their group waits with them) until then, or until
/// connectivity returns or ``TaskRunner/conditionsChanged()`` forgets them all. Kept in memory
/// only: another runner, process or launch tries them at once, which costs no attempt.
final class DeferredTasks: Sendable {
  private let state = Mutex<[TaskID: Int64]>([:])

  func insert(_ id: TaskID, until: Int64) { state.withLock { $0[id] = until } }
  func contains(_ id: TaskID, now: Int64) -> Bool {
    state.withLock { s in
      guard let until = s[id] else { return false }
      if until > now { return true }
      s[id] = nil
      return false
    }
  }
  /// The earliest time at or after `start` a deferred task may be tried again. Deferrals that
  /// ended before `start` are forgotten, not returned: a pass that began at `start` would have
  /// tried their tasks, and one that did not reach them — the task cancelled or run by another
  /// process, the pass offline or the queue paused — would not reach them on the next wake-up
  /// either, so a time in the past would wake its loop again at once, for ever.
  func earliest(atOrAfter start: Int64) -> Int64? {
    state.withLock { s in
      if s.isEmpty { return nil }
      s = s.filter { $0.value >= start }
      return s.values.min()
    }
  }
  var isEmpty: Bool { state.withLock { $0.isEmpty } }
  func removeAll() { state.withLock { $0.removeAll() } }
}

/// Where a pass's handlers leave their ended runs: the pass takes everything there, waiting for
/// the first when there is nothing yet.
final class Mailbox<Item: Sendable>: Sendable {
  private let core = MailboxCore<Item>()

  func put(_ item: Item) { core.put(item) }
  /// Puts `items` at once: a taker gets all of them or none.
  func put(contentsOf items: [Item]) { core.put(contentsOf: items) }
  /// Everything left so far, without waiting.
  func takeAvailable() -> [Item] { core.takeAvailable() }
  /// Everything left so far; waits for the first item when there is none.
  func takeAll() async -> [Item] { await core.takeAll() }
}

/// What a ``Mailbox`` does, in a struct that a class that is not generic can hold.
struct MailboxCore<Item: Sendable>: ~Copyable, Sendable {
  // Not private: Swift 6.3's debug build of another file that holds a `MailboxCore` crashes on
  // a private nested type here ("Global is external, but doesn't have external linkage").
  struct State {
    var items: [Item] = []
    // Unsafe, not checked: `put` takes the waiter out under the lock before resuming it, so it
    // is resumed exactly once (a checked one costs an allocation and a metadata lookup a wait).
    var waiter: UnsafeContinuation<[Item], Never>?
  }
  private let state = Mutex(State())

  func put(contentsOf items: [Item]) {
    let resume = state.withLock { s -> (UnsafeContinuation<[Item], Never>, [Item])? in
      s.items += items
      guard let waiter = s.waiter else { return nil }
      s.waiter = nil
      defer { s.items = [] }
      return (waiter, s.items)
    }
    if let (waiter, items) = resume { waiter.resume(returning: items) }
  }

  func put(_ item: Item) {
    let resume = state.withLock { s -> (UnsafeContinuation<[Item], Never>, [Item])? in
      s.items.append(item)
      guard let waiter = s.waiter else { return nil }
      s.waiter = nil
      defer { s.items = [] }
      return (waiter, s.items)
    }
    if let (waiter, items) = resume { waiter.resume(returning: items) }
  }

  /// Everything left so far, without waiting.
  func takeAvailable() -> [Item] {
    state.withLock { s in
      defer { s.items = [] }
      return s.items
    }
  }

  /// Everything left so far; waits for the first item when there is none.
  func takeAll() async -> [Item] {
    await withUnsafeContinuation { (continuation: UnsafeContinuation<[Item], Never>) in
      let ready = state.withLock { s -> [Item]? in
        if s.items.isEmpty {
          // One waiter at a time (the pass's loop, or one handler call's): a second would be lost.
          assert(s.waiter == nil, "a mailbox has one waiter at a time")
          s.waiter = continuation
          return nil
        }
        defer { s.items = [] }
        return s.items
      }
      if let ready { continuation.resume(returning: ready) }
    }
  }
}

/// What a batched handler returned, set in its call's task before that call ends.
final class BatchAnswers: Sendable {
  private let state = Mutex<[TaskID: TaskResult]?>(nil)
  func set(_ answers: [TaskID: TaskResult]) { state.withLock { $0 = answers } }
  var value: [TaskID: TaskResult]? { state.withLock { $0 } }
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

  /// Takes a signal given while nobody waited; false when there was none.
  func take() -> Bool {
    state.withLock { s in
      defer { s.pending = false }
      return s.pending
    }
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
