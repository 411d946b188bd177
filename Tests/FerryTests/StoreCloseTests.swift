import FerryLog
import Foundation
import TestSupport
import Testing

@testable import Ferry

/// `FerryStore.close()` is synchronous and returns once the writes already handed to the writer
/// are committed; a write asked for after it throws `closed` (its doc comment).
@Suite(.timeLimit(.minutes(20))) struct StoreCloseTests {
  @Test func everyAddThatReturnedBeforeOrDuringCloseIsThereAfterReopen() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    // Each add returns its id once durable, or nil when the store refused it as closed.
    let results = await withTaskGroup(of: TaskID?.self) { group -> [TaskID?] in
      for n in 0..<40 {
        group.addTask {
          do {
            return try await store.queue.add(tag: "t", payload: Item(name: "\(n)"))
          } catch FerryError.closed {
            return nil
          } catch {
            Issue.record("an add failed otherwise: \(error)")
            return nil
          }
        }
      }
      await Task.yield()
      store.close()  // no await: it waits for the writer to commit what it was handed
      var results: [TaskID?] = []
      for await result in group { results.append(result) }
      return results
    }
    #expect(results.count == 40)
    let ids = results.compactMap { $0 }
    await #expect(throws: FerryError.closed) {
      try await store.queue.add(tag: "t", payload: Item(name: "late"))
    }
    let reopened = try await fixture.openStore()
    defer { reopened.close() }
    let queued = Set(try reopened.queue.pendingTasks().map(\.id))
    #expect(Set(ids).isSubset(of: queued))
  }
}
