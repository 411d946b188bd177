import FerryLog
import Foundation
import Synchronization

#if canImport(UIKit) && !os(macOS)
  import UIKit
#endif

/// Whether a store is suspended, what its resume starts again, and the turn of each
/// ``FerryStore/suspend()`` and ``FerryStore/resume()`` call: one at a time, in the order called.
final class Suspension: Sendable {
  private struct State {
    var suspended = false
    /// The runners that ran automatically when the store was suspended.
    var automaticRunners: [TaskRunner] = []
    var busy = false
    var waiting: [CheckedContinuation<Void, Never>] = []
  }

  private let state = Mutex(State())

  var isSuspended: Bool { state.withLock { $0.suspended } }

  /// Runs `body` when no other suspend or resume is under way. Never cancelled part-way: a
  /// suspension left half done would hold some locks and not others.
  func serialized<R: Sendable>(_ body: () async throws -> R) async rethrows -> R {
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
      let now = state.withLock { s -> Bool in
        if !s.busy {
          s.busy = true
          return true
        }
        s.waiting.append(continuation)
        return false
      }
      if now { continuation.resume() }
    }
    defer {
      let next = state.withLock { s -> CheckedContinuation<Void, Never>? in
        if s.waiting.isEmpty {
          s.busy = false
          return nil
        }
        return s.waiting.removeFirst()
      }
      next?.resume()
    }
    return try await body()
  }

  func markSuspended(restarting runners: [TaskRunner]) {
    state.withLock { s in
      s.suspended = true
      s.automaticRunners = runners
    }
  }

  /// Marks the store resumed; returns the runners to start again.
  func markResumed() -> [TaskRunner] {
    state.withLock { s in
      defer {
        s.suspended = false
        s.automaticRunners = []
      }
      return s.automaticRunners
    }
  }
}

extension FerryStore {
  /// Lets go of the store so that the app may be suspended, or another process open it alone:
  /// afterwards this process holds no lock on any file of the store and has none of them open.
  ///
  /// iOS ends an app that it suspends while the app holds a file lock in a container shared
  /// with other processes (an app group): exception `0xdead10cc`. A store keeps locks for as
  /// long as it is open — LMDB's on `lock.mdb`, Ferry's on `ferry-open.lock`, and this process's
  /// liveness token in `owners/` while runners run — so an app whose store sits in an app group
  /// suspends it when it leaves the foreground, and resumes it when it comes back
  /// (``Configuration/suspendsWhenBackgrounded`` does both).
  ///
  /// In order, it:
  /// - stops every runner of ``queue`` as ``TaskRunner/stop()`` does (windows under way end as
  ///   ``WindowReport/End/stopped``), and waits for each pass under way to end: a handler
  ///   cancelled that returns within ``TaskRunner/Configuration/interruptionGrace`` has its
  ///   outcome logged, one that does not has its run logged as interrupted (its task runs again
  ///   after the resume);
  /// - stops the timers and polling that read the store: automatic compaction, the gauge timer,
  ///   the reading of other processes' changes for observers;
  /// - waits until every write already handed to the writer is committed, closes the LMDB
  ///   environment and gives up every lock.
  ///
  /// A run that was not part of a pass — `run(.task(id))` — or a handler still running past the
  /// grace is left as a killed process leaves it: its outcome cannot be logged, and the run is
  /// interrupted at the resume (or by any other process that opens the store), so its task runs
  /// again — at least once; a handler that ignores cancellation and is still running at the
  /// resume may overlap its rerun, as after ``TaskRunner/stop()`` past the grace. A handler must
  /// not call `suspend()` itself: the suspension waits for the handler's pass to end.
  ///
  /// **While suspended every call that reads or writes the store throws
  /// ``FerryError/suspended`` at once** — an add, a read of a task or a cache age, a pass — and
  /// so does a call that the suspension overtook (begun before, but its write not yet handed to
  /// the writer). Nothing waits for the resume: a suspended app cannot resume itself, and a
  /// call that waited would hold whatever awaits it for as long as the app stays in the
  /// background. Update streams (``TaskQueue/updates()``, ``CacheRepository/states()``) stay
  /// open and deliver again after the resume, what other processes did meanwhile included.
  /// The objects the app holds — the store, ``queue``, ``ledger``, runners, repositories — stay
  /// valid. Suspending a suspended or closed store does nothing; ``close()`` closes a suspended
  /// store for good.
  public func suspend() async {
    await suspension.serialized {
      guard !log.isClosed, !suspension.isSuspended else { return }
      // Runners first: what their passes log reaches the writer before the log lets go.
      let restart = await withTaskGroup(of: TaskRunner?.self) { group in
        for runner in queue.liveRunners {
          group.addTask { await runner.suspendRunning() ? runner : nil }
        }
        var restart: [TaskRunner] = []
        for await runner in group { if let runner { restart.append(runner) } }
        return restart
      }
      automaticCompaction.withLock { task in
        task?.cancel()
        task = nil
      }
      stopGaugeTimer()
      ledger.suspendTail()
      queue.suspendStore()
      suspension.markSuspended(restarting: restart)
    }
  }

  /// Takes the store up again after ``suspend()``, as ``open(at:configuration:)`` would: the
  /// same checks, projections caught up with whatever other processes wrote meanwhile, runs whose
  /// owner is gone — this process's own that the suspension cut short among them — interrupted
  /// and ready again; then automatic compaction, the gauge timer, the reading of other
  /// processes' changes for observers and the automatic running of every runner that ran
  /// automatically start again — unless the app stopped that runner (``TaskRunner/stop()``) while
  /// suspended. Automatic running the app started while suspended runs a pass at once.
  ///
  /// Resuming a store that is not suspended does nothing.
  ///
  /// - Throws: When the store cannot be opened again (removed or damaged meanwhile), the open's error —
  ///   ``FerryError/noSuchStore(path:)``, ``FerryError/notAStore(path:reason:)``,
  ///   ``FerryError/permissionDenied(path:detail:)``, ``FerryError/newerFormat(path:message:)``,
  ///   ``FerryError/damaged(path:message:)``, ``FerryError/ioError(path:detail:)`` or
  ///   ``FerryError/storage(_:)`` — and the store stays suspended: calling again tries again. When only the
  ///   interruption of dead owners' runs fails, that write's error (``FerryError/diskFull(path:)``,
  ///   ``FerryError/quotaExceeded(path:)``, ``FerryError/ioError(path:detail:)``,
  ///   ``FerryError/storage(_:)``), the store resumed all the same (the runners' next passes interrupt those
  ///   runs).
  public func resume() async throws(FerryError) {
    try await engine {
      try await suspension.serialized {
        guard !log.isClosed, suspension.isSuspended else { return }
        try queue.resumeStore()
        ledger.resumeTail()
        var failure: (any Error)?
        if !log.configuration.readOnly {
          do {
            queue.setInterruptedAtOpen(try await queue.recover(sweepingTokens: true, inWriter: false))
          } catch {
            failure = error
          }
        }
        // Closed while the reopen recovered: nothing starts on a closed store.
        if log.isClosed { return }
        if let automaticPolicy { startAutomaticCompaction(automaticPolicy) }
        startGaugeTimer(gaugeInterval: gaugeInterval)
        // Those the suspension stopped (held here: an automatic loop may be all that held one),
        // and any the app started meanwhile.
        let stopped = suspension.markResumed()
        var seen = Set<ObjectIdentifier>()
        for runner in stopped + queue.liveRunners where seen.insert(ObjectIdentifier(runner)).inserted {
          runner.resumeRunning()
        }
        if let failure { throw failure }
      }
    }
  }

  /// Whether the store is suspended (``suspend()``) now.
  public var isSuspended: Bool { suspension.isSuspended }

  /// Suspends and resumes the store with the app (``Configuration/suspendsWhenBackgrounded``).
  func followAppLifecycle() {
    #if canImport(UIKit) && !os(macOS)
      // Not compiled on Linux, where Ferry is built and tested: checked only by reading.
      let center = NotificationCenter.default
      let background = center.addObserver(
        forName: UIApplication.didEnterBackgroundNotification, object: nil, queue: nil
      ) { [weak self] _ in
        guard let self else { return }
        self.appWantsSuspension.withLock { $0 = true }
        // iOS suspends the app soon after this notification: the suspension asks for the time
        // it needs, and gives it back once every lock is let go of.
        Task { @MainActor in
          let request = BackgroundTimeRequest()
          request.id = UIApplication.shared.beginBackgroundTask(withName: "Ferry suspension") {
            MainActor.assumeIsolated { request.end() }
          }
          await self.followApp()
          request.end()
        }
      }
      let foreground = center.addObserver(
        forName: UIApplication.willEnterForegroundNotification, object: nil, queue: nil
      ) { [weak self] _ in
        guard let self else { return }
        self.appWantsSuspension.withLock { $0 = false }
        Task { await self.followApp() }
      }
      lifecycle.withLock { $0 = [background, foreground] }
    #endif
  }

  /// Suspends or resumes the store as the app's latest move asked: the tasks the notifications
  /// start may run in any order, so each does what the latest one wants, and the last to run
  /// leaves the store as the app now is.
  func followApp() async {
    if appWantsSuspension.withLock({ $0 }) {
      await suspend()
    } else {
      try? await resume()
    }
  }

  /// Stops following the app's lifecycle (at close).
  func stopFollowingAppLifecycle() {
    let observers = lifecycle.withLock { observers in
      defer { observers = [] }
      return observers
    }
    for observer in observers { NotificationCenter.default.removeObserver(observer) }
  }
}

#if canImport(UIKit) && !os(macOS)
  /// The background time a suspension asked UIKit for, ended once (by the suspension or by
  /// UIKit's expiration handler, whichever comes first).
  @MainActor final class BackgroundTimeRequest {
    var id = UIBackgroundTaskIdentifier.invalid

    func end() {
      guard id != .invalid else { return }
      UIApplication.shared.endBackgroundTask(id)
      id = .invalid
    }
  }
#endif
