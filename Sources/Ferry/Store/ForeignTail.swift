import FerryLog
import Synchronization

/// Reads what other processes append to a store's log while anyone in this process observes, so
/// that observers see an app extension's changes too. Started when a first observer subscribes,
/// stopped when the last one ends (and at close).
final class ForeignTail: Sendable {
  /// How often the log is read for other processes' appends.
  static let pollInterval: Duration = .milliseconds(200)
  /// Events read at most per read transaction.
  static let chunkSize = 1000

  private let task = Mutex<Task<Void, Never>?>(nil)

  /// Starts reading after the current head (once); `deliver` gets every event another process
  /// appended, in order. `missed` is called after a read that found events gone before they
  /// could be read — a compaction removed them — of which some were not appended here (this
  /// process's own were told to its observers when committed): what they said is lost, and the
  /// observers must read the state again.
  func start(
    _ log: EventLog, deliver: @escaping @Sendable (LoggedEvent) -> Void,
    missed: @escaping @Sendable () -> Void
  ) {
    task.withLock { task in
      guard task == nil, !log.isClosed, let head = try? log.head() else { return }
      task = Task {
        var last = head
        while !Task.isCancelled && !log.isClosed {
          do {
            // The head first: every event at or below it that the read after does not find was
            // removed (a later append can only be above it).
            let head = try log.head()
            let events = try log.events(after: last, limit: Self.chunkSize)
            var lost = false
            for event in events {
              if event.sequence > last &+ 1, !log.appendedHere(allOf: (last + 1)...(event.sequence - 1)) {
                lost = true
              }
              last = event.sequence
              if !log.appendedHere(event.sequence) { deliver(event) }
            }
            if events.count < Self.chunkSize, head > last {
              if !log.appendedHere(allOf: (last + 1)...head) { lost = true }
              last = head
            }
            if lost { missed() }
            if events.count == Self.chunkSize { continue }
          } catch {
            return  // The log closed or failed: observers keep what they saw.
          }
          // Only other processes' appends are of interest here, and they cannot wake this one.
          do { try await Task.sleep(for: Self.pollInterval) } catch { return }
        }
      }
    }
  }

  /// Whether the tail is being read now (started and not stopped).
  var isRunning: Bool { task.withLock { $0 != nil } }

  func stop() {
    task.withLock { task in
      task?.cancel()
      task = nil
    }
  }
}
