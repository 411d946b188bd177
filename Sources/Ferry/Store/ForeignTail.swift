import FerryLog
import Synchronization

/// Reads what other processes append to a store's log while anyone in this process observes, so
/// that observers see an app extension's changes too. Started on first use, ended at close.
final class ForeignTail: Sendable {
  /// How often the log is read for other processes' appends.
  static let pollInterval: Duration = .milliseconds(200)

  private let task = Mutex<Task<Void, Never>?>(nil)

  /// Starts reading after the current head (once); `deliver` gets every event another process
  /// appended, in order.
  func start(_ log: EventLog, deliver: @escaping @Sendable (LoggedEvent) -> Void) {
    task.withLock { task in
      guard task == nil, !log.isClosed, let head = try? log.head() else { return }
      task = Task {
        do {
          for try await event in log.tail(after: head, pollInterval: Self.pollInterval) {
            if !log.appendedHere(event.sequence) { deliver(event) }
          }
        } catch {
          // The log closed or failed: observers keep what they saw.
        }
      }
    }
  }

  func stop() {
    task.withLock { task in
      task?.cancel()
      task = nil
    }
  }
}
