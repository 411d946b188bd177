import FerryLog
import FerryTesting
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @_spi(Experimental) @testable import Ferry

/// Attacks on `FerryStore.suspend()` / `resume()` with real processes and files: what the app
/// does to its runners while the store is suspended, observers across a suspension, a resume
/// that fails, another process rewriting the store while this one is suspended.
@Suite(.timeLimit(.minutes(20))) struct SuspensionCompanyTests {
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
  @Test func theOtherProcessFollowerTellsNothingTwiceAcrossASuspensionMidDelivery() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let log = store.log
    let start = try log.head()
    let follower = OtherProcessFollower()
    let told = Mutex<[UInt64]>([])
    let (seen, seeing) = AsyncStream<UInt64>.makeStream()
    let replaced = Atomic<Bool>(false)
    follower.start(
      log,
      deliver: { event in
        told.withLock { $0.append(event.sequence) }
        seeing.yield(event.sequence)
        // The first event told: a suspension and a resume replace the loop right now.
        if !replaced.exchange(true, ordering: .relaxed) {
          follower.suspend()
          follower.resume(log)
        }
      }, missed: {})
    defer { follower.stop() }
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

  /// A resume that cannot open the store — the directory moved away, then a data file that is
  /// not LMDB's in its place — throws a typed error and leaves the store suspended (calls still
  /// fail with `suspended`, no lock taken); once the store is back a resume works.
  @Test func aFailedResumeLeavesTheStoreSuspendedAndALaterOneWorks() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let first = try await store.queue.add(tag: "t", payload: ["n": 0])
    await store.suspend()
    let away = fixture.path + ".away"
    defer { try? FileManager.default.removeItem(atPath: away) }
    try FileManager.default.moveItem(atPath: fixture.path, toPath: away)
    do {
      try await store.resume()
      Issue.record("a resume of a store that moved away succeeded")
    } catch FerryError.noSuchStore {
    } catch {
      Issue.record("a resume of a store that moved away threw \(error)")
    }
    #expect(store.isSuspended)
    #expect(!FileManager.default.fileExists(atPath: fixture.path), "the resume created a directory")
    await expectSuspended { try store.queue.pendingTasks() }
    await expectSuspended { try await store.queue.add(tag: "t", payload: ["n": 1]) }

    // Back, but with its data file swapped for bytes that are no LMDB file.
    try FileManager.default.moveItem(atPath: away, toPath: fixture.path)
    let data = fixture.path + "/data.mdb"
    try FileManager.default.moveItem(atPath: data, toPath: away)
    try Data(repeating: 0x5A, count: 16384).write(to: URL(fileURLWithPath: data))
    do {
      try await store.resume()
      Issue.record("a resume of a store whose data file is garbage succeeded")
    } catch {
      switch error {
      case .damaged, .notAStore: break
      default: Issue.record("a resume of a garbage data file threw \(error)")
      }
    }
    #expect(store.isSuspended)
    if SuspensionTests.hasProcLocks {
      #expect(StoreFiles(fixture.path).lockedFiles().isEmpty)
      #expect(StoreFiles(fixture.path).openHere().isEmpty)
    }
    await expectSuspended { try store.queue.pendingTasks() }

    try FileManager.default.removeItem(atPath: data)
    try FileManager.default.moveItem(atPath: away, toPath: data)
    try await store.resume()
    #expect(!store.isSuspended)
    #expect(try store.queue.pendingTasks().map(\.id) == [first])
    let second = try await store.queue.add(tag: "t", payload: ["n": 2])
    let run = runner(store.queue)
    run.register(tag: "t") { _ in .succeeded }
    let report = try await run.run()
    #expect(Set(report.entries.filter { $0.outcome == .succeeded }.map(\.taskId)) == [first, second])
    #expect(try store.log.verify().isHealthy)
  }

  /// While this store is suspended the same process opens the store again (another part of the
  /// app) and adds: the resume is refused with `alreadyOpen` while that one is open — the store
  /// stays suspended, the other open unharmed — and works once it is closed, seeing its adds.
  @Test func aResumeWhileTheStoreIsOpenAgainInTheProcessIsRefusedThenWorks() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let first = try await store.queue.add(tag: "t", payload: ["n": 0])
    await store.suspend()
    let other = try await fixture.openStore()
    let second = try await other.queue.add(tag: "t", payload: ["n": 1])
    do {
      try await store.resume()
      Issue.record("a resume succeeded while the store was open again in the process")
    } catch FerryError.alreadyOpen {
    } catch {
      Issue.record("the resume threw \(error), not alreadyOpen")
    }
    #expect(store.isSuspended)
    // The other open still holds its locks and works.
    if SuspensionTests.hasProcLocks {
      let held = StoreFiles(fixture.path).lockedFiles()
      #expect(held.contains("lock.mdb") && held.contains("ferry-open.lock"), "\(held)")
    }
    let third = try await other.queue.add(tag: "t", payload: ["n": 2])
    other.close()
    try await store.resume()
    #expect(Set(try store.queue.pendingTasks().map(\.id)) == [first, second, third])
    #expect(try store.log.verify().isHealthy)
  }

  /// While suspended, another process adds hundreds of tasks and then compacts the store into a
  /// copy that replaces data.mdb: after the resume the projections match the log, the app's queue
  /// runs exactly the tasks the log holds, once each, and adds go on.
  @Test(arguments: [false, true])
  func anotherProcessAddsAndCompactsIntoACopyWhileSuspended(segment: Bool) async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore { $0.writeAheadSegment = segment }
    defer { store.close() }
    let run = runner(store.queue)
    run.register(tag: "t") { _ in .succeeded }
    run.register(tag: "app") { _ in .succeeded }
    let done = try await store.queue.add(tag: "t", payload: ["n": 0])
    #expect(try await run.run().succeeded == 1)
    let updates = store.queue.updates()
    await store.suspend()
    let adder = try Child("ferry-test-worker", ["add-tasks", fixture.path, "300"])
    #expect(try await adder.wait() == 0, "\(adder.output)")
    let theirs = adder.acknowledgedIds
    try #require(theirs.count == 300)
    let compact = try Child("ferry", ["compact", fixture.path, "--retention", "0", "--copy"])
    #expect(try await compact.wait() == 0, "\(compact.output)")
    try await store.resume()
    #expect(try store.log.verify().isHealthy)
    #expect(Set(try store.queue.pendingTasks().map(\.id)) == Set(theirs))
    let mine = try await store.queue.add(tag: "t", payload: ["n": 1])
    let report = try await run.run()
    #expect(Set(report.entries.filter { $0.outcome == .succeeded }.map(\.taskId)) == Set(theirs + [mine]))
    #expect(try store.queue.pendingTasks().isEmpty)
    #expect(try store.queue.task(done) == nil)  // succeeded: no longer queued
    // The stream held across the suspension goes on with this process's own changes.
    for await update in updates {
      if case .succeeded(mine) = update { break }
    }
    #expect(try store.log.verify().isHealthy)
  }
}
