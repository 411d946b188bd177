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
  /// The app stops a runner while its store is suspended (it is leaving for good, or the user
  /// turned sync off): the resume must not start it again behind the app's back.
  @Test func aRunnerStoppedWhileSuspendedStaysStoppedAfterTheResume() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let run = runner(store.queue)
    run.register(tag: "t") { _ in .succeeded }
    run.startAutomaticRunning()
    await store.suspend()
    run.stop()
    try await store.resume()
    #expect(!run.isRunningAutomatically)
    // A task added now stays pending: nothing runs it.
    let id = try await store.queue.add(tag: "t", payload: ["n": 0])
    #expect(try store.queue.pendingTasks().map(\.id) == [id])
    run.stop()
  }

  /// The app starts automatic running while the store is suspended — its foreground handler ran
  /// before the store's resume (the lifecycle hook's task runs later): the loop's first pass
  /// found the store suspended. After the resume the tasks that were waiting must run without
  /// anything else waking the loop.
  @Test func automaticRunningStartedWhileSuspendedRunsWhatWaitsAfterTheResume() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let run = runner(store.queue)
    run.register(tag: "t") { _ in .succeeded }
    let id = try await store.queue.add(tag: "t", payload: ["n": 0])
    let updates = store.queue.updates()
    await store.suspend()
    run.startAutomaticRunning()
    try await store.resume()
    for await update in updates {
      if case .succeeded(id) = update { break }
    }
    #expect(try store.queue.pendingTasks().isEmpty)
    run.stop()
    let ledger = try RunLedger(store.log)
    ledger.expectEachTaskRanOnce([id])
  }

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
