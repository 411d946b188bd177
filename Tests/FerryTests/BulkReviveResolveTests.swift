import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// After an outage or a batch of refusals, one call brings a tag, a group or the whole queue back:
/// each dead task revived once, each blocked task resolved once, a run under way never touched.
@Suite(.timeLimit(.minutes(20))) struct BulkReviveResolveTests {
  /// How often each task's event of `type` is in the log (read back, not counted by the code).
  static func count(_ type: String, in log: EventLog) throws -> [TaskID: Int] {
    var counts: [TaskID: Int] = [:]
    for event in try log.events(after: 0, limit: 100_000) where event.type == type {
      switch try TaskEvent(event) {
      case .revived(let id), .errorResolved(let id): counts[id, default: 0] += 1
      default: break
      }
    }
    return counts
  }

  @Test func concurrentBulkRevivesReviveEachDeadTaskOnceAndLeaveTheRestAlone() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      var dead: [String: [TaskID]] = [:]
      for n in 0..<24 {
        let tag = n % 2 == 0 ? "upload" : "edit"
        let id = try await queue.add(tag: tag, payload: Item(name: "\(n)"))
        dead[tag, default: []].append(id)
      }
      let alive = try await queue.add(tag: "upload", payload: Item(name: "later"), options: [.manual])
      let run = runner(queue)
      run.register(tag: "upload") { _ in .failed("offline for good", retryable: false) }
      run.register(tag: "edit") { _ in .failed("offline for good", retryable: false) }
      _ = try await run.run()
      #expect(try queue.pendingTasks().filter { $0.status == .dead }.count == 24)
      // Two callers at once, by tag and for everything: every dead task once, in one commit each.
      async let byTag = queue.revive(tag: "upload")
      async let everything = queue.reviveAll()
      let (a, b) = try await (byTag, everything)
      #expect(Set(a).isDisjoint(with: b))
      #expect(Set(a + b) == Set(dead.values.flatMap { $0 }))
      #expect(try Self.count("task.revived", in: store.log).values.allSatisfy { $0 == 1 })
      #expect(try queue.task(alive)?.attempts == 0)
      #expect(try await queue.reviveAll().isEmpty)
      try expectConsistent(queue)
    }
  }

  @Test func bulkResolveLeavesAnErrorRecordedDuringARunToThatRun() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let a = try await queue.add(tag: "save", payload: Item(name: "a"), groupId: "list")
      let b = try await queue.add(tag: "save", payload: Item(name: "b"), groupId: "other")
      let running = try await queue.add(tag: "slow", payload: Item(name: "c"))
      let started = Gate()
      let release = Gate()
      let run = runner(queue) { $0.maxConcurrentTasks = 4 }
      run.register(tag: "save") { _ in .recordError("title too long") }
      run.register(tag: "slow") { task in
        started.open()
        await release.wait()
        return .succeeded
      }
      let pass = Task { try await run.run() }
      await started.wait()
      try await queue.recordError(running, message: "the app saw a problem")
      try await pollUntil {
        (try? queue.task(a)?.status) == .blockedByError && (try? queue.task(b)?.status) == .blockedByError
      }
      let byGroup = try await queue.resolveErrors(group: "list")
      #expect(byGroup.changed == [a])
      let all = try await queue.resolveAllErrors()
      #expect(all.changed == [b])
      #expect(all.running == [running])
      release.open()
      _ = try await pass.value
      #expect(try Self.count("task.errorResolved", in: store.log) == [a: 1, b: 1])
      try expectConsistent(queue)
    }
  }
}
