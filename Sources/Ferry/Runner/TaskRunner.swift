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
    let task: Task<PassReport, any Error>
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
  ///
  /// - Parameters:
  ///   - queue: The queue whose tasks it runs (``FerryStore/queue``).
  ///   - configuration: How it runs: concurrency, default retry policy and time limit, collections,
  ///     connectivity.
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
  ///
  /// - Parameters:
  ///   - tag: The tag whose tasks the handler runs.
  ///   - retry: The retry policy of its failures; ``Configuration/defaultRetry`` when nil.
  ///   - timeLimit: The most a run may take; ``Configuration/defaultTimeLimit`` when nil.
  ///   - isReadyToRun: Asked before each run (after ``Configuration/isReadyToRun``): `false` skips the task.
  ///     Nil: always ready.
  ///   - handler: Runs one task and returns its outcome (``TaskResult``). A thrown error is a retryable
  ///     failure, except a ``FerryError/payload(taskId:reason:)`` of the task itself, which fails it for
  ///     good.
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
  /// `batchSize` of the tag's tasks that may start, claimed in one commit, and returns an outcome for each by id. Their outcomes are logged in one commit.
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
  ///
  /// - Parameters:
  ///   - tag: The tag whose tasks the handler runs.
  ///   - batchSize: The most tasks a call is given; taken as 1 to ``maxBatchSize``.
  ///   - retry: The retry policy of its failures; ``Configuration/defaultRetry`` when nil.
  ///   - timeLimit: The most a call may take, for the batch as a whole; ``Configuration/defaultTimeLimit``
  ///     when nil.
  ///   - isReadyToRun: Asked of the batch's first task (after ``Configuration/isReadyToRun``): `false` skips
  ///     it. Nil: always ready.
  ///   - handler: Runs the batch and returns an outcome for each task, by id.
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
  /// a task of its batch) it is refused: it would wait for itself.
  /// From a task the handler starts it runs like any request, once the handler has returned — as
  /// long as the handler does not await that task.
  ///
  /// - Parameter filter: The tasks to run: ``RunFilter/all`` (not manual ones), a group, a collection, or one
  ///   task.
  /// - Returns: What happened to each task the pass touched.
  /// - Throws: ``FerryError/unknownCollection(_:)`` for a collection not in the configuration;
  ///   ``FerryError/noSuchTask(_:)`` for a `.task` that is not queued; ``FerryError/invalidArgument(_:)``
  ///   when the handler's own task asks for what would wait for itself (see above); ``FerryError/closed`` or
  ///   ``FerryError/suspended`` when the store is closed or suspended; ``FerryError/notCurrent(_:)``,
  ///   ``FerryError/permissionDenied(path:detail:)`` (a store opened read-only),
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when reading the queue or logging a run fails.
  public func run(_ filter: RunFilter = .all) async throws(FerryError) -> PassReport {
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
  ) async throws -> (report: PassReport, cutShort: Bool) {
    let required = try queue.log.head()
    while true {
      let (pass, control, joined) = state.withLock { s -> (Task<PassReport, any Error>, PassControl, Bool) in
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
}
