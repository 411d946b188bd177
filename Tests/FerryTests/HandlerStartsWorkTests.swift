import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@testable import Ferry

/// A handler that awaits a request for its own pass (or its own run) would wait for itself and is
/// refused; a task the handler starts and does not await cannot hold the pass, and its request
/// runs (`Specs/task-events.md` §4.3, "From a handler").
@Suite(.timeLimit(.minutes(20))) struct HandlerStartsWorkTests {
  /// Where a handler leaves the tasks it started, for the test to await.
  final class Started: Sendable {
    let tasks = Mutex<[Task<PassReport, any Error>]>([])
    func keep(_ task: Task<PassReport, any Error>) { tasks.withLock { $0.append(task) } }
    var all: [Task<PassReport, any Error>] { tasks.withLock { $0 } }
  }

  @Test func aPassAwaitedByTheHandlerIsRefused() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let run = runner(queue)
      let refused = Mutex<[String]>([])
      run.register(tag: "t") { task in
        for request in [RunFilter.all, .task(task.id)] {
          do throws(any Error) {
            _ = try await run.run(request)
          } catch FerryError.invalidArgument(let message) {
            refused.withLock { $0.append(message) }
          }
        }
        return .succeeded
      }
      let id = try await queue.add(tag: "t", payload: Item(name: "a"))
      let report = try await run.run()
      #expect(report.outcome(of: id) == .succeeded)
      #expect(refused.withLock { $0.count } == 2)
    }
  }

  @Test func aPassStartedByTheHandlerInATaskItDoesNotAwaitRuns() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let run = runner(queue)
      let started = Started()
      run.register(tag: "starter") { task in
        // Not awaited: the handler returns, its pass ends, and these requests go on.
        started.keep(Task { try await run.run() })
        started.keep(Task { try await run.run(.task(task.id)) })
        return .succeeded
      }
      run.register(tag: "later") { _ in .succeeded }
      let starter = try await queue.add(tag: "starter", payload: Item(name: "s"))
      let report = try await run.run()
      #expect(report.outcome(of: starter) == .succeeded)
      // A task added after that pass: the started pass, if it has not run yet, or a later one runs it.
      for started in started.all {
        let report = try await started.value  // refused before: "would wait for that pass"
        _ = report
      }
      let later = try await queue.add(tag: "later", payload: Item(name: "l"))
      #expect(try await run.run().outcome(of: later) == .succeeded)
      #expect(try queue.pendingTasks().isEmpty)
    }
  }
}
