import FerryLog
import Synchronization

/// Reads what other processes append to a store's log while anyone in this process observes, so
/// that observers see an app extension's changes too. Started when a first observer subscribes,
/// stopped when the last one ends (and at close).
final class OtherProcessFollower: Sendable {
  /// How often the log is read for other processes' appends.
  static let pollInterval: Duration = .milliseconds(200)
  /// Events read at most per read transaction.
  static let chunkSize = 1000

  private struct State {
    var task: Task<Void, Never>?
    /// Counts the loops started: a loop that a stop or suspension replaced writes nothing more.
    var generation = 0
    /// The last sequence the loop has read up to (kept across a suspension).
    var last: UInt64?
    /// What the running loop tells.
    var handlers: Handlers?
    /// The loop that a suspension stopped, to be started again from `last` by a resume.
    var suspended: Handlers?
  }

  private typealias Handlers = (deliver: @Sendable (LoggedEvent) -> Void, missed: @Sendable () -> Void)

  private let state = Mutex(State())

  /// Starts reading after the current head (once); `deliver` gets every event another process
  /// appended, in order. `missed` is called after a read that found events gone before they
  /// could be read — a compaction removed them — of which some were not appended here (this
  /// process's own were told to its observers when committed): what they said is lost, and the
  /// observers must read the state again. While the log is suspended it starts at resume.
  func start(
    _ log: EventLog, deliver: @escaping @Sendable (LoggedEvent) -> Void,
    missed: @escaping @Sendable () -> Void
  ) {
    state.withLock { state in
      guard state.task == nil, !log.isClosed else { return }
      if log.isSuspended {
        state.suspended = (deliver, missed)
        return
      }
      guard let head = try? log.head() else { return }
      state.last = head
      launch(log, &state, deliver: deliver, missed: missed)
    }
  }

  /// The loop, from `state.last` on.
  private func launch(
    _ log: EventLog, _ state: inout State, deliver: @escaping @Sendable (LoggedEvent) -> Void,
    missed: @escaping @Sendable () -> Void
  ) {
    state.generation += 1
    state.handlers = (deliver, missed)
    let generation = state.generation
    let first = state.last ?? 0
    state.task = Task { [self] in
      var last = first
      while !Task.isCancelled && !log.isClosed {
        do {
          // The head first: every event at or below it that the read after does not find was
          // removed (a later append can only be above it).
          let head = try log.head()
          let events = try log.events(after: last, limit: Self.chunkSize)
          var lost = false
          for event in events {
            let gap =
              event.sequence > last &+ 1 && !log.appendedHere(allOf: (last + 1)...(event.sequence - 1))
            // Recorded before it is told: the loop a suspension starts next reads from what was
            // recorded, so an event this loop tells is never told again, and one it no longer
            // tells (it was replaced) is told by the next.
            guard record(event.sequence, generation) else {
              if lost { missed() }
              return
            }
            if gap { lost = true }
            last = event.sequence
            if !log.appendedHere(event.sequence) { deliver(event) }
          }
          if events.count < Self.chunkSize, head > last {
            let gap = !log.appendedHere(allOf: (last + 1)...head)
            guard record(head, generation) else {
              if lost { missed() }
              return
            }
            if gap { lost = true }
            last = head
          }
          if lost { missed() }
          guard isCurrent(generation) else { return }
          if events.count == Self.chunkSize { continue }
        } catch {
          return  // The log closed, was suspended or failed: observers keep what they saw.
        }
        // Only other processes' appends are of interest here, and they cannot wake this one.
        do { try await Task.sleep(for: Self.pollInterval) } catch { return }
      }
    }
  }

  private func isCurrent(_ generation: Int) -> Bool { state.withLock { $0.generation == generation } }

  /// Records that the loop of `generation` has read up to `last`; false when a stop or
  /// suspension replaced that loop (it must tell nothing more).
  private func record(_ last: UInt64, _ generation: Int) -> Bool {
    state.withLock { state in
      guard state.generation == generation else { return false }
      state.last = last
      return true
    }
  }

  /// Stops reading for a suspension of the log, keeping where it was: ``resume(_:)`` goes on from
  /// there, so that what other processes appended meanwhile is delivered.
  func suspend() {
    state.withLock { state in
      guard let task = state.task else { return }
      task.cancel()
      state.task = nil
      state.generation += 1
      state.suspended = state.handlers
    }
  }

  /// Starts the loop a suspension stopped again, from where it was.
  func resume(_ log: EventLog) {
    state.withLock { state in
      guard let tail = state.suspended else { return }
      state.suspended = nil
      guard state.task == nil, !log.isClosed, !log.isSuspended else { return }
      if state.last == nil { state.last = try? log.head() }
      launch(log, &state, deliver: tail.deliver, missed: tail.missed)
    }
  }

  /// Whether other processes' appends are being read now (started and not stopped).
  var isRunning: Bool { state.withLock { $0.task != nil } }

  func stop() {
    state.withLock { state in
      state.task?.cancel()
      state.task = nil
      state.generation += 1
      state.suspended = nil
      state.handlers = nil
      state.last = nil
    }
  }
}
