@testable import Ferry
import FerryLog
import FerryTesting
import Foundation
import Synchronization
import TestSupport
import Testing

/// Attacks on `FerryStore.suspend()` / `resume()` with real processes and files: what the app
/// does to its runners while the store is suspended, observers across a suspension, a resume
/// that fails, another process rewriting the store while this one is suspended.
@Suite(.timeLimit(.minutes(5))) struct SuspensionAttackTests {
  /// The reading of other processes' appends is replaced by a suspension while it is telling an
  /// event (the suspension comes from inside the delivery: the moment is then exact): the loop
  /// the resume starts must go on after what was told, never tell it again; and nothing of the
  /// other process's may be lost. Checked against the log.
  @Test func theForeignTailTellsNothingTwiceAcrossASuspensionMidDelivery() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let log = store.log
    let start = try log.head()
    let tail = ForeignTail()
    let told = Mutex<[UInt64]>([])
    let (seen, seeing) = AsyncStream<UInt64>.makeStream()
    let replaced = Atomic<Bool>(false)
    tail.start(
      log,
      deliver: { event in
        told.withLock { $0.append(event.sequence) }
        seeing.yield(event.sequence)
        // The first event told: a suspension and a resume replace the loop right now.
        if !replaced.exchange(true, ordering: .relaxed) {
          tail.suspend()
          tail.resume(log)
        }
      }, missed: {})
    defer { tail.stop() }
    let adder = try Child("ferry-test-worker", ["add-tasks", fixture.path, "6"])
    #expect(try await adder.wait() == 0, "\(adder.output)")
    // A marker appended afterwards, by another process too: only the loop now current tells it,
    // after anything it tells again.
    let marker = try Child("ferry-test-worker", ["add-tasks", fixture.path, "1"])
    #expect(try await marker.wait() == 0, "\(marker.output)")
    let head = try log.head()
    for await sequence in seen where sequence == head { break }
    var logged: [UInt64] = []
    try log.forEachEvent(from: start + 1) { logged.append($0.sequence) }
    let wasReplaced = replaced.load(ordering: .relaxed)
    #expect(wasReplaced)
    #expect(told.withLock { $0 } == logged)
  }
}
