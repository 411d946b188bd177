import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@testable import Ferry

/// The key a server deduplicates a change on: the same on every attempt, across reopen and
/// compaction; new with a new payload; never repeated by another store, even one created anew
/// at the same path.
@Suite(.timeLimit(.minutes(20))) struct IdempotencyKeyTests {
  /// Keys the handler was handed, by task.
  final class Keys: Sendable {
    let seen = Mutex<[TaskID: [String]]>([:])
    func note(_ task: RunningTask) { seen.withLock { $0[task.id, default: []].append(task.idempotencyKey) } }
    var all: [TaskID: [String]] { seen.withLock { $0 } }
  }

  @Test func theKeyIsTheSameOnEveryAttemptAcrossReopenAndCompaction() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let keys = Keys()
    var id: TaskID = 0
    do {
      let store = try await fixture.openStore()
      defer { store.close() }
      id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
      let run = runner(store.queue)
      run.register(tag: "t") { task in
        keys.note(task)
        return .failed("server said 500")
      }
      _ = try await run.run()
      fixture.time += 10_000
      _ = try await run.run()
      _ = try await store.compact(retention: .zero)
    }
    let store = try await fixture.openStore()
    defer { store.close() }
    fixture.time += 60_000
    let run = runner(store.queue)
    run.register(tag: "t") { task in
      keys.note(task)
      return .succeeded
    }
    #expect(try await run.run().succeeded == 1)
    let seen = try #require(keys.all[id])
    #expect(seen.count == 3)
    #expect(Set(seen).count == 1, "\(seen)")
    // The key is the id of the event that holds the payload: read back from the log, not from the code's memory.
    #expect(seen.first?.count == 36)
  }

  @Test func aPayloadUpdateIsANewChangeWithAKeyOfItsOwn() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let keys = Keys()
    let id = try await store.queue.add(tag: "t", payload: Item(name: "draft"))
    let run = runner(store.queue)
    let attempts = Atomic<Int>(0)
    run.register(tag: "t") { task in
      keys.note(task)
      return attempts.add(1, ordering: .relaxed).newValue == 1 ? .failed("timeout") : .succeeded
    }
    _ = try await run.run()
    try await store.queue.updatePayload(id, to: Item(name: "final"))
    fixture.time += 60_000
    _ = try await run.run()
    let seen = try #require(keys.all[id])
    #expect(seen.count == 2)
    #expect(seen[0] != seen[1], "a server that applied the draft must not drop the final text")
  }

  @Test func aStoreCreatedAnewAtTheSamePathNeverRepeatsAKey() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var all: [String] = []
    var storeIds: [String] = []
    for _ in 0..<3 {
      let store = try await fixture.openStore()
      storeIds.append(try store.storeId)
      let keys = Keys()
      // Concurrent adders: the keys of one store are unique among themselves too.
      try await withThrowingTaskGroup(of: Void.self) { group in
        for n in 0..<8 {
          group.addTask {
            for i in 0..<5 { _ = try await store.queue.add(tag: "t", payload: Item(name: "\(n)-\(i)")) }
          }
        }
        try await group.waitForAll()
      }
      let run = runner(store.queue) { $0.maxConcurrentTasks = 4 }
      run.register(tag: "t") { task in
        keys.note(task)
        return .succeeded
      }
      #expect(try await run.run().succeeded == 40)
      // Task ids restart at 1 in a new store: the keys must not.
      #expect(keys.all.keys.min() == 1)
      all += keys.all.values.flatMap { $0 }
      store.close()
      fixture.remove()
    }
    #expect(all.count == 120)
    #expect(Set(all).count == 120)
    #expect(Set(storeIds).count == 3)
  }

  @Test func theStoreIdSurvivesReopenAndIsNotAnotherStoresId() async throws {
    let a = QueueFixture()
    let b = QueueFixture()
    defer {
      a.remove()
      b.remove()
    }
    let first = try await a.openStore()
    let id = try first.storeId
    first.close()
    let again = try await a.openStore()
    #expect(try again.storeId == id)
    again.close()
    let other = try await b.openStore()
    #expect(try other.storeId != id)
    other.close()
  }
}
