import FerryLog
import Foundation
import Synchronization

/// What a background window did (``TaskRunner/run(until:_:)``).
public struct WindowReport: Sendable, Equatable {
  /// Why a window ended.
  public enum End: Sendable, Equatable, CustomStringConvertible {
    /// Its deadline came: it claimed nothing more and cancelled the runs under way.
    case deadline
    /// Nothing was left for it to run before its deadline: no task it could run now, and no
    /// retry time due before the deadline.
    case outOfWork
    /// ``TaskRunner/stop()`` was called, or the task awaiting the window was cancelled (an
    /// operating system's expiration handler, say): like a deadline, sooner.
    case stopped
    /// The queue is paused (``TaskQueue/pause()``): a window runs nothing while it is.
    case paused

    /// What the window did, as a phrase: "reached its deadline", "ran out of work"…
    public var description: String {
      switch self {
      case .deadline: return "reached its deadline"
      case .outOfWork: return "ran out of work"
      case .stopped: return "was stopped"
      case .paused: return "found the queue paused"
      }
    }
  }

  /// Why the window ended.
  public internal(set) var end: End
  /// Every task the window touched with its last outcome in the window (a task that failed and
  /// then succeeded on its retry within the window reads `succeeded`), in task-id order.
  public internal(set) var entries: [PassReport.Entry]
  /// When to schedule the next window: the earliest time a task will be runnable — now when work
  /// is ready (the deadline cut the window short, or a run was interrupted), else the earliest
  /// retry time; nil when nothing queued becomes runnable by time alone (the queue is empty or
  /// paused, or what is left is blocked, dead, manual, or was skipped by this window as
  /// ``SkipReason/notReady`` or ``SkipReason/noHandler`` — those wait for a condition, see
  /// ``TaskRunner/conditionsChanged()``).
  public internal(set) var nextDue: Date?

  /// Tasks whose last run in the window succeeded.
  public var succeeded: Int { count { $0 == .succeeded } }
  /// Tasks whose last run failed (retryable or not). Errors recorded are counted apart, in
  /// ``errorsRecorded``.
  public var failed: Int {
    count {
      if case .failed = $0 { return true }
      return false
    }
  }
  /// Tasks whose last run recorded an error for the user: blocked until it is resolved.
  public var errorsRecorded: Int {
    count {
      if case .errorRecorded = $0 { return true }
      return false
    }
  }
  /// Tasks whose last run was interrupted (the deadline, a stop): they are ready again, their
  /// attempt not a failure.
  public var interrupted: Int { count { $0 == .interrupted } }
  /// Tasks the window skipped (and did not run after).
  public var skipped: Int {
    count {
      if case .skipped = $0 { return true }
      return false
    }
  }
  /// The task's last outcome in the window, if it touched it.
  public func outcome(of id: TaskID) -> RunOutcome? { entries.first { $0.taskId == id }?.outcome }

  private func count(_ matches: (RunOutcome) -> Bool) -> Int { entries.filter { matches($0.outcome) }.count }
}

extension WindowReport: CustomStringConvertible {
  /// A one-line summary: "the window reached its deadline: 2 succeeded, 1 interrupted; next due
  /// 2026-05-01T10:00:00Z".
  public var description: String {
    var counts: [String] = []
    for (count, word) in [
      (succeeded, "succeeded"), (failed, "failed"),
      (errorsRecorded, errorsRecorded == 1 ? "error recorded" : "errors recorded"),
      (interrupted, "interrupted"), (skipped, "skipped"),
    ] where count > 0 {
      counts.append("\(count) \(word)")
    }
    let did = counts.isEmpty ? "nothing ran" : counts.joined(separator: ", ")
    let next = nextDue.map { "next due \($0.ISO8601Format())" } ?? "nothing due by time alone"
    return "the window \(end): \(did); \(next)"
  }
}

/// Ends a window: by its deadline, by `stop()`, or by its caller's cancellation — the first
/// reason wins — and cancels the pass it is attached to then or when it attaches.
final class WindowCut: Sendable {
  private struct State {
    var reason: WindowReport.End?
    var pass: Task<PassReport, any Error>?
  }
  private let state = Mutex(State())

  var reason: WindowReport.End? { state.withLock { $0.reason } }

  func cut(_ reason: WindowReport.End) {
    let pass = state.withLock { s -> Task<PassReport, any Error>? in
      if s.reason == nil { s.reason = reason }
      return s.pass
    }
    pass?.cancel()
  }

  /// The pass the window now waits for; cancelled at once when the window is cut already.
  func attach(_ pass: Task<PassReport, any Error>) {
    let cut = state.withLock { s -> Bool in
      s.pass = pass
      return s.reason != nil
    }
    if cut { pass.cancel() }
  }

  func detach() { state.withLock { $0.pass = nil } }
}

/// A window under way, as ``TaskRunner/stop()`` and ``TaskRunner/conditionsChanged()`` reach it.
struct WindowHandle: Sendable {
  let cut: WindowCut
  let wakeup: WakeSignal
}

extension TaskRunner {
  /// Runs the queue's work until `deadline`, then stops cleanly, and reports what it did and
  /// when work will be due next: for a background window the operating system grants (iOS
  /// `BGTaskScheduler`, Android `WorkManager` periodic work).
  ///
  /// Until the deadline the window runs passes over `filter` (`.all`, a group or a collection):
  /// a pass now, and again when a retry time comes before the deadline, when a task is added, an
  /// error resolved, a task revived or the queue resumed, and on ``conditionsChanged()``. It ends
  /// early — ``WindowReport/End/outOfWork`` — once a pass found nothing more it could run and no
  /// retry time comes before the deadline. Times are the store's clock.
  ///
  /// At the deadline (decided inside the claim commands: nothing is claimed from the deadline
  /// on) the window cancels the handlers under way:
  /// - a handler that then throws — `CancellationError`, `URLError.cancelled`, anything — has
  ///   its run logged as **interrupted**: its task is ready again at once, with no failure, no
  ///   backoff (its attempt number stays counted, as for any interrupted run);
  /// - a handler that returns a result before ``Configuration/interruptionGrace`` passes has that
  ///   result logged;
  /// - a handler still running after the grace is left behind: its run is logged interrupted and
  ///   whatever it returns later is dropped. Each run has exactly one outcome in the log.
  ///
  /// ``stop()`` and cancelling the task that awaits the window end it the same way, sooner
  /// (``WindowReport/End/stopped``): that is what an expiration handler does. A paused queue
  /// runs nothing (``WindowReport/End/paused``); a deadline already past runs nothing and
  /// still reports ``WindowReport/nextDue``. If a pass of this runner is under way (``run(_:)``,
  /// automatic running), the window joins it when it covers `filter` and waits for it
  /// otherwise; either way that pass too claims nothing from the deadline on and is cut at it.
  ///
  /// ```swift
  /// // iOS (not compiled here): a BGProcessingTask drives a window.
  /// BGTaskScheduler.shared.register(forTaskWithIdentifier: "app.sync", using: nil) { bgTask in
  ///   let window = Task {
  ///     try await store.resume()                           // if the app suspended it
  ///     return try await runner.run(until: Date().addingTimeInterval(25))
  ///   }
  ///   bgTask.expirationHandler = { window.cancel() }       // ends the window at once
  ///   Task {
  ///     let report = try? await window.value
  ///     if let next = report?.nextDue {
  ///       let request = BGProcessingTaskRequest(identifier: "app.sync")
  ///       request.earliestBeginDate = next
  ///       request.requiresNetworkConnectivity = true
  ///       try? BGTaskScheduler.shared.submit(request)
  ///     }
  ///     await store.suspend()                              // no lock held once it completes
  ///     bgTask.setTaskCompleted(success: report?.end == .outOfWork)
  ///   }
  /// }
  /// ```
  ///
  /// - Parameters:
  ///   - deadline: When the window ends, on the store's clock.
  ///   - filter: The tasks to run: ``RunFilter/all``, a group or a collection.
  /// - Returns: What the window ran, how it ended and when work is due next (``WindowReport``).
  /// - Throws: ``FerryError/unknownCollection(_:)`` for a collection not in the configuration;
  ///   ``FerryError/invalidArgument(_:)`` for ``RunFilter/task(_:)`` (run one task with ``run(_:)``) and for
  ///   a deadline that is no time (NaN seconds); ``FerryError/closed`` or ``FerryError/suspended`` when the
  ///   store is closed or suspended; ``FerryError/notCurrent(_:)``,
  ///   ``FerryError/permissionDenied(path:detail:)`` (a store opened read-only),
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when reading the queue or logging a run fails.
  public func run(until deadline: Date, _ filter: RunFilter = .all) async throws(FerryError) -> WindowReport {
    try await engine {
      // NaN saturated to the end of time: a window that never ends.
      guard !deadline.timeIntervalSince1970.isNaN else {
        throw FerryError.invalidArgument("a window's deadline must be a time, not NaN seconds since 1970")
      }
      return try await window(until: Self.unixMilliseconds(deadline), filter)
    }
  }

  /// A window (``run(until:_:)``) of `budget` from now on the store's clock.
  ///
  /// - Parameters:
  ///   - budget: How long the window lasts from now, on the store's clock.
  ///   - filter: The tasks to run: ``RunFilter/all``, a group or a collection.
  /// - Returns: What the window ran, how it ended and when work is due next (``WindowReport``).
  /// - Throws: As ``run(until:_:)``.
  public func run(for budget: Duration, _ filter: RunFilter = .all) async throws(FerryError) -> WindowReport {
    try await engine {
      try await window(until: queue.clock().addingSaturating(max(0, budget.milliseconds)), filter)
    }
  }

  /// A date as Unix milliseconds (to the nearest), saturating.
  static func unixMilliseconds(_ date: Date) -> Int64 {
    let ms = (date.timeIntervalSince1970 * 1000).rounded()
    guard ms.isFinite else { return ms < 0 ? .min : .max }
    if ms >= 9.2e18 { return .max }
    if ms <= -9.2e18 { return .min }
    return Int64(ms)
  }

  private func window(until deadline: Int64, _ filter: RunFilter) async throws -> WindowReport {
    switch filter {
    case .collection(let name) where configuration.collections[name] == nil:
      throw FerryError.unknownCollection(name)
    case .task:
      throw FerryError.invalidArgument(
        "a window runs .all, a group or a collection; run one task with run(.task(id))")
    default: break
    }
    let handle = WindowHandle(cut: WindowCut(), wakeup: WakeSignal())
    let number = state.withLock { s in
      s.nextWindow += 1
      s.windows[s.nextWindow] = handle
      return s.nextWindow
    }
    let updates = queue.updates()
    // What wakes automatic running wakes a window: a group's next task freed by another runner's
    // run of its head, a retry time another process's run set.
    let listener = Task {
      for await update in updates where Self.wakesAutomaticRunning(update) { handle.wakeup.signal() }
    }
    let timer = Task { [queue] in
      await queue.sleep(deadline)
      if Task.isCancelled { return }
      handle.cut.cut(.deadline)
      handle.wakeup.signal()
    }
    defer {
      timer.cancel()
      listener.cancel()
      _ = state.withLock { $0.windows.removeValue(forKey: number) }
    }
    return try await withTaskCancellationHandler {
      try await windowLoop(until: deadline, filter, handle)
    } onCancel: {
      handle.cut.cut(.stopped)
      handle.wakeup.signal()
    }
  }

  private func windowLoop(
    until deadline: Int64, _ filter: RunFilter, _ handle: WindowHandle
  ) async throws -> WindowReport {
    var outcomes: [TaskID: RunOutcome] = [:]
    var end: WindowReport.End
    while true {
      if let reason = handle.cut.reason {
        end = reason
        break
      }
      let passStart = queue.clock()
      if passStart >= deadline {
        end = .deadline
        break
      }
      if try queue.isPaused() {
        end = .paused
        break
      }
      _ = handle.wakeup.take()  // this pass sees what woke the window so far
      let (report, cutShort) = try await windowPass(filter, until: deadline, handle.cut)
      for entry in report.entries { outcomes[entry.taskId] = entry.outcome }
      if let reason = handle.cut.reason {
        end = reason
        break
      }
      if queue.clock() >= deadline {
        end = .deadline
        break
      }
      if handle.wakeup.take() { continue }  // something changed during the pass
      // Another window's earlier deadline (or its caller's cancellation) cut the pass this window
      // ran or joined: what that pass left is this window's to run until its own deadline.
      if cutShort { continue }
      if !isOnline, try queue.nextDue(excluding: []) != nil {
        // Offline with work queued: the network's return (``conditionsChanged()``) or the
        // deadline wakes the window; nothing starts meanwhile, so no attempt is spent.
        await handle.wakeup.wait()
        continue
      }
      guard let next = nextRetryTime(from: passStart), next < deadline else {
        end = .outOfWork
        break
      }
      let retry = Task { [queue] in
        await queue.sleep(next)
        if !Task.isCancelled { handle.wakeup.signal() }
      }
      await handle.wakeup.wait()
      retry.cancel()
    }
    // Skipped for a reason time does not change: not what the next window is scheduled for.
    let waitingForCondition = Set(
      outcomes.compactMap { id, outcome -> TaskID? in
        switch outcome {
        case .skipped(.notReady), .skipped(.noHandler): return id
        default: return nil
        }
      })
    let nextDue = end == .paused ? nil : try queue.nextDue(excluding: waitingForCondition)
    return WindowReport(
      end: end,
      entries: outcomes.sorted { $0.key < $1.key }.map {
        PassReport.Entry(taskId: $0.key, outcome: $0.value)
      },
      nextDue: nextDue.map(TaskQueue.date(unixMilliseconds:)))
  }

  /// One pass of a window: its own, or the runner's pass under way when that covers `filter`
  /// (then joined); another pass under way is waited for, then the window runs its own. Either
  /// way the pass claims nothing from `deadline` on, and is cancelled when the window is cut.
  /// `cutShort`: the pass was stopped or reached a deadline (``PassControl/wasCutShort``).
  private func windowPass(
    _ filter: RunFilter, until deadline: Int64, _ cut: WindowCut
  ) async throws -> (report: PassReport, cutShort: Bool) {
    try refuseWaitingForOwnPass("a window")
    let required = try queue.log.head()
    while true {
      let attached = state.withLock {
        s -> (task: Task<PassReport, any Error>, control: PassControl, mine: Bool)? in
        // Under the lock `stop()` cuts with: once cut, no pass starts.
        if cut.reason != nil { return nil }
        if let running = s.pass {
          running.control.limit(until: deadline)
          let joins =
            Self.covers(running.filter, filter) && !running.task.isCancelled
            && running.control.join(requiring: required)
          return (running.task, running.control, joins)
        }
        let control = PassControl()
        control.limit(until: deadline)
        let pass = Task { [self] in
          defer { state.withLock { $0.pass = nil } }
          return try await executePass(filter, control: control)
        }
        s.pass = ActivePass(task: pass, filter: filter, control: control)
        return (pass, control, true)
      }
      guard let (pass, control, mine) = attached else { return (PassReport(), false) }
      cut.attach(pass)
      let result = await pass.result
      cut.detach()
      if mine { return (try result.get(), control.wasCutShort) }
      if cut.reason != nil || queue.clock() >= deadline { return (PassReport(), false) }
    }
  }
}

extension TaskQueue {
  /// When to schedule the next background window: the earliest time a task will be runnable by
  /// time alone. A queue of only blocked, dead and manual tasks (and tasks behind them) has none;
  /// a run under way is not due.
  ///
  /// Reads the queue's indexes — the first key of `ready` and of `waiting` (by time) — never the
  /// whole queue. Tasks whose `isReadyToRun` says no count as due: the queue does not know the
  /// runners' checks (a window's ``WindowReport/nextDue`` leaves out those it skipped).
  ///
  /// - Returns: The store's clock now when a task could be claimed now, else the earliest retry time; nil
  ///   when the queue is paused or holds nothing that time makes runnable.
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public func nextDueDate() throws(FerryError) -> Date? {
    try engine {
      try nextDue(excluding: []).map(Self.date(unixMilliseconds:))
    }
  }

  /// ``nextDueDate()`` in Unix milliseconds, passing over the tasks in `excluded` (a window's
  /// skips): reads at most as many index keys as are excluded, plus one per index.
  func nextDue(excluding excluded: Set<TaskID>) throws -> Int64? {
    let now = clock()
    return try log.read { view in
      var queue = QueueTables(try view.tables(of: TaskQueueProjection.projectionName))
      if try queue.tables.get("state", key: QueueKey.paused) == [1] { return nil }
      var ready = false
      try queue.tables.scan("ready", from: nil) { key, _ in
        guard let (_, id) = QueueKey.readyEntry(key) else { return true }
        if excluded.contains(id) { return true }
        ready = true
        return false
      }
      if ready { return now }
      // `waiting` is ordered by priority level, then time: the earliest is the least of each
      // level's first time (one seek per level).
      var first: Int64?
      for level in try queue.runnableLevels() {
        try queue.tables.scan("waiting", from: [level]) { key, _ in
          guard let (keyLevel, at, id) = QueueKey.waitingTime(key), keyLevel == level else { return false }
          if excluded.contains(id) && at <= now { return true }  // due, and skipped for a condition
          first = min(first ?? .max, max(at, now))
          return false
        }
      }
      return first
    }
  }

  /// A Unix-milliseconds time as a date.
  static func date(unixMilliseconds ms: Int64) -> Date { Date(timeIntervalSince1970: Double(ms) / 1000) }
}
