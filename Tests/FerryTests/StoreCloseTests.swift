import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@testable import Ferry

/// `FerryStore.close()` is synchronous and returns once the writes already handed to the writer
/// are committed; a write asked for after it throws `closed` (its doc comment).
@Suite(.timeLimit(.minutes(2))) struct StoreCloseTests {
  @Test func everyAddThatReturnedBeforeOrDuringCloseIsThereAfterReopen() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    let acknowledged = Mutex<[TaskID]>([])
    let refused = Mutex(0)
    await withTaskGroup(of: Void.self) { group in
      for n in 0..<40 {
        group.addTask {
          do {
            let id = try await store.queue.add(tag: "t", payload: Item(name: "\(n)"))
            acknowledged.withLock { $0.append(id) }
          } catch FerryLogError.closed {
            refused.withLock { $0 += 1 }
          } catch {
            Issue.record("an add failed otherwise: \(error)")
          }
        }
      }
      await Task.yield()
      store.close()  // no await: it waits for the writer to commit what it was handed
    }
    let ids = acknowledged.withLock { $0 }
    #expect(ids.count + refused.withLock { $0 } == 40)
    await #expect(throws: FerryLogError.self) { try await store.queue.add(tag: "t", payload: Item(name: "late")) }
    let reopened = try await fixture.openStore()
    defer { reopened.close() }
    let queued = Set(try reopened.queue.pendingTasks().map(\.id))
    #expect(Set(ids).isSubset(of: queued))
  }
}
