import FerryLog
import FerryTesting
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// What a handler returns with its success, as a hostile handler returns it: stale keys that are
/// no keys, the same key many times, more names than an event holds.
@Suite(.timeLimit(.minutes(20))) struct RunOutcomeEdgeTests {
  /// Invalid cache keys are ignored by the fold; they must not also make the success unloggable.
  /// Twenty thousand names of 1,000 bytes are 20 MB, past the log's 16 MiB event: the success's
  /// commit failed, `run()` threw, and the task stayed claimed by a live process — it ran again
  /// at every launch, its success never logged.
  @Test func invalidStaleKeysNeverMakeASuccessUnloggable() async throws {
    try await withStore { store, _, _ in
      let run = runner(store.queue)
      let tooLong = String(repeating: "x", count: 1_000)
      run.register(tag: "push") { _ in
        .succeeded(
          output: try TaskOutput(["serverId": "42"]),
          invalidating: Array(repeating: tooLong, count: 20_000) + ["", "notes", "notes"])
      }
      let id = try await store.queue.add(tag: "push", payload: Item(name: "a"))
      let report = try await run.run()
      #expect(report.outcome(of: id) == .succeeded)
      #expect(try store.queue.task(id) == nil)
      #expect(try store.queue.output(of: id)?.decode(as: [String: String].self) == ["serverId": "42"])
      #expect(try store.ledger.record("notes")?.isInvalidated == true)
      // What the log keeps is what counts: the valid key, once.
      let stale = try store.log.events(after: 0, limit: 100).compactMap { event -> [String]? in
        guard event.type == "task.runSucceeded", case .runSucceeded(_, let details) = try TaskEvent(event)
        else {
          return nil
        }
        return details.invalidates
      }
      #expect(stale == [["notes"]])
      try expectConsistent(store.queue)
    }
  }

  /// A task cancelled while its run is under way, the run then deferring: the task is gone, its
  /// group goes on, and nothing runs it again.
  @Test func aCancelDuringARunThatDefersEndsTheTask() async throws {
    try await withStore { store, _, _ in
      let run = runner(store.queue)
      let gate = Gate()
      let started = Atomic<Int>(0)
      run.register(tag: "t") { task in
        if task.groupId == "g", started.add(1, ordering: .relaxed).newValue == 1 {
          await gate.wait()
          return .deferred("portal")
        }
        return .succeeded
      }
      let id = try await store.queue.add(tag: "t", payload: Item(name: "a"), groupId: "g")
      let behind = try await store.queue.add(tag: "t", payload: Item(name: "b"), groupId: "g")
      let pass = Task { try await run.run() }
      try await pollUntil { started.load(ordering: .relaxed) == 1 }
      try await store.queue.cancel(id)
      gate.open()
      _ = try await pass.value
      #expect(try store.queue.task(id) == nil)
      _ = try await run.run()
      #expect(try store.queue.task(behind) == nil)
      #expect(started.load(ordering: .relaxed) == 2, "the cancelled task never runs again")
      try expectConsistent(store.queue)
    }
  }
}

/// Limits that keep a runner from looping on what a handler returns.
@Suite(.timeLimit(.minutes(20))) struct RunnerLimitTests {
  @Test func aSuccessNamingTooManyStaleKeysIsLoggedWithTheFirstThousand() async throws {
    try await withStore { store, _, _ in
      let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
      let run = runner(store.queue)
      // 50,000 valid keys of 400 bytes: 20 MB, past the log's payload limit were they all logged.
      let keys = (0..<50_000).map { String(format: "%06d", $0) + String(repeating: "k", count: 394) }
      run.register(tag: "t") { _ in .succeeded(invalidating: keys) }
      #expect(try await run.run().succeeded == 1)
      #expect(try store.queue.task(id) == nil)
      let success = try #require(
        try store.log.events(after: 0, limit: 100).first { $0.type == "task.runSucceeded" })
      guard case .runSucceeded(_, let details) = try TaskEvent(success) else { return }
      #expect(details.invalidates == Array(keys.prefix(TaskRunner.maxStaleKeys)))
    }
  }

  @Test func aZeroDeferralDelayIsTakenAsTheMinimum() async throws {
    try await withStore { store, clock, _ in
      let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
      let run = runner(store.queue) { $0.deferralDelay = .zero }
      run.register(tag: "t") { _ in .deferred("not now") }
      #expect(try await run.run().deferred == 1)
      // The clock has not moved: the task waits in this runner instead of running again at once.
      #expect(try await run.run().entries.isEmpty)
      clock.advance(by: TaskRunner.minimumDeferralDelay)
      #expect(try await run.run().outcome(of: id) == .deferred("not now"))
    }
  }
}
