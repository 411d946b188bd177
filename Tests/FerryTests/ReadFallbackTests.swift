import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @_spi(Experimental) @testable import Ferry

/// Reads whose projection another process keeps moving — rebuilding it back to back — never give
/// up with `projectionNotCurrent` in a read-write open: when a catch-up through this process's
/// writer loses the race, the read runs in the writer's transaction (EventLog.read).
@Suite(.serialized, .timeLimit(.minutes(20))) struct ReadFallbackTests {
  /// What the readers of ``readsBesideARebuildLoopNeverGiveUp(segment:)`` saw.
  struct Seen: Sendable {
    var reads = 0
    var errors: [String] = []
    var inconsistencies: [String] = []
  }

  /// Another process rebuilds every projection back to back (each rebuild resets the queue's
  /// projection, then folds it in chunks of 5) while this one, for 10 seconds, adds manual tasks
  /// (never run: their count only grows), adds and runs jobs, and reads the queue from eight
  /// threads of its own. No read, add or pass may fail; no read may see fewer manual tasks than
  /// were acknowledged before it began, or than it saw last, or a job whose run finished before it
  /// began. Before reads fell back to the writer's transaction, some of them gave up with
  /// `projectionNotCurrent` after three catch-ups that each lost the race to the next reset —
  /// dozens a run with the write-ahead segment (whose catch-up checkpoints before its reader reads
  /// again), a few or none without.
  @Test(arguments: [false, true])
  func readsBesideARebuildLoopNeverGiveUp(segment: Bool) async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var configuration = FerryStore.Configuration()
    configuration.writeAheadSegment = segment
    let store = try await FerryStore.open(at: fixture.path, configuration: configuration)
    defer { store.close() }
    let queue = store.queue
    var held = 0
    for i in 0..<50 {
      _ = try await queue.add(tag: "held", payload: ["n": "\(i)"], options: [.manual])
      held += 1
    }
    let runner = TaskRunner(queue: queue)
    runner.register(tag: "job") { _ in .succeeded }
    let finished = Mutex<Set<TaskID>>([])
    for entry in try await runner.run(.all).entries where entry.outcome == .succeeded {
      finished.withLock { _ = $0.insert(entry.taskId) }
    }
    _ = try await addJobs(queue, 300)

    let input = Pipe()
    let rebuilder = try Child(
      "ferry-test-worker", ["rebuild-until-line", fixture.path, "5"] + (segment ? ["segment"] : []),
      stdin: input.fileHandleForReading)
    defer { if rebuilder.process.isRunning { rebuilder.kill() } }
    _ = try await rebuilder.waitForLine(startingWith: "round 0")

    let started = ContinuousClock.now
    let acknowledgedHeld = Atomic<Int>(held)
    let stop = Atomic<Bool>(false)
    let seen = Mutex(Seen())
    let readersDone = Atomic<Int>(0)
    // Eight readers, four a core on the 2-core hosts this runs on: a reader its catch-up wakes
    // often waits for a core, and the other process's next reset gets in first.
    let readers = 8
    for _ in 0..<readers {
      Thread.detachNewThread {
        var lastHeld = 0
        while !stop.load(ordering: .sequentiallyConsistent) {
          let heldBefore = acknowledgedHeld.load(ordering: .sequentiallyConsistent)
          let finishedBefore = finished.withLock { $0 }
          do {
            let pending = try queue.pendingTasks()
            let heldNow = pending.count { $0.tag == "held" }
            let back = pending.filter { finishedBefore.contains($0.id) }.map(\.id)
            seen.withLock { seen in
              seen.reads += 1
              if heldNow < heldBefore || heldNow < lastHeld {
                seen.inconsistencies.append(
                  "\(heldNow) manual tasks after \(heldBefore) acknowledged, \(lastHeld) seen")
              }
              if !back.isEmpty { seen.inconsistencies.append("finished tasks came back: \(back.prefix(5))") }
            }
            lastHeld = heldNow
            _ = try queue.nextRunnable()
          } catch {
            seen.withLock { $0.errors.append("\(error) (after \(ContinuousClock.now - started))") }
          }
        }
        readersDone.add(1, ordering: .sequentiallyConsistent)
      }
    }

    var passFailures: [String] = []
    // Sized by rounds, not seconds: a loaded machine runs fewer per second, not fewer.
    for _ in 0..<60 {
      do {
        _ = try await queue.add(tag: "held", payload: ["n": "\(held)"], options: [.manual])
        held += 1
        acknowledgedHeld.store(held, ordering: .sequentiallyConsistent)
        _ = try await addJobs(queue, 16)
        for entry in try await runner.run(.all).entries where entry.outcome == .succeeded {
          finished.withLock { _ = $0.insert(entry.taskId) }
        }
      } catch {
        passFailures.append("\(error)")
      }
    }
    stop.store(true, ordering: .sequentiallyConsistent)
    // A reader that hangs is caught by the suite's time limit, not a wall-clock wait.
    while readersDone.load(ordering: .sequentiallyConsistent) < readers {
      try await Task.sleep(for: .milliseconds(5))
    }
    say("stop", to: input)
    let closed = try await rebuilder.waitForLine(startingWith: "closed")

    let result = seen.withLock { $0 }
    // A read may still give up when this process's writer does not get to it within its four
    // seconds — the documented bound, met here when the shared host's disk stalls a commit, or the
    // other process's back-to-back chunk transactions keep LMDB's write lock from this writer: its
    // reason says so, and it is counted, not failed. Any other failure is a read that gave up on
    // a race the writer's transaction cannot lose (every one, before it existed).
    let heldUp = result.errors.filter { $0.contains("did not get to the read within") }
    let otherwise = result.errors.filter { !$0.contains("did not get to the read within") }
    #expect(
      otherwise.isEmpty,
      "\(otherwise.count) of \(result.reads + result.errors.count) reads failed: \(otherwise.prefix(3))")
    #expect(passFailures.isEmpty, "\(passFailures.count) adds or passes failed: \(passFailures.prefix(3))")
    #expect(result.inconsistencies.isEmpty, "\(result.inconsistencies.prefix(5))")
    #expect(result.reads > 100, "only \(result.reads) reads")
    // With the segment a catch-up checkpoints before its reader reads again, which leaves the
    // other process time to reset the projection: there it loses many races (without the
    // segment, fewer), so the writer's transaction is certainly what some reads here went through.
    if segment { #expect(store.log.readsRunInWriter > 0, "no read lost a race: the test tested nothing") }
    let pending = try queue.pendingTasks()
    #expect(pending.count { $0.tag == "held" } == held)
    #expect(pending.filter { $0.tag == "job" }.isEmpty)
    #expect(try store.log.verify().isHealthy)
    print(
      "segment \(segment): reads \(result.reads), failed \(otherwise.count), gave up on a held-up writer "
        + "\(heldUp.count) \(heldUp.prefix(2)), run in the writer's transaction \(store.log.readsRunInWriter), "
        + "rebuilds in the other process: \(closed), \(store.log.storageCounters)")
  }

  // MARK: A writer held up by another process

  /// A read whose projection is behind (another process's rebuild killed part-way) while a third
  /// process holds LMDB's write lock — a suspended app extension — waits for this process's
  /// writer four seconds in all (a second for its catch-up, then for its turn in the writer's
  /// transaction), then throws `projectionNotCurrent`: never for as long as the lock is held.
  /// Once the lock is released the writer takes the read's abandoned job and must not run its
  /// body — the caller's closure, gone with the read's stack frame.
  @Test func aReadWhoseWriterIsHeldUpGivesUpWithinTheBoundAndItsBodyNeverRunsLater() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let ids = try await addJobs(queue, 1_000)
    try await killedRebuild(fixture.path, chunk: 100)
    let input = Pipe()
    let locker = try Child(
      "ferry-test-worker", ["hold-write-lock", fixture.path], stdin: input.fileHandleForReading)
    defer { if locker.process.isRunning { locker.kill() } }
    _ = try await locker.waitForLine(startingWith: "locked")

    let bodyOnWriter = Atomic<Int>(0)
    let outcome = Mutex<(String, Duration)?>(nil)
    Thread.detachNewThread {
      let reader = pthread_self()
      let started = ContinuousClock.now
      let result: String
      do {
        let count = try queue.log.read { view -> Int in
          // Not on the reading thread: on the writer's.
          if pthread_equal(pthread_self(), reader) == 0 {
            bodyOnWriter.add(1, ordering: .sequentiallyConsistent)
          }
          return try view.tables(of: TaskQueueProjection.projectionName).count("tasks")
        }
        result = "rows \(count)"
      } catch {
        result = isNotCurrent(error) ? "notCurrent: \(error)" : "error \(error)"
      }
      outcome.withLock { $0 = (result, ContinuousClock.now - started) }
    }
    while outcome.withLock({ $0 }) == nil {
      try await Task.sleep(for: .milliseconds(5))
    }
    let seen = try #require(outcome.withLock { $0 }, "the read never ended")
    #expect(seen.0.hasPrefix("notCurrent"), "\(seen.0)")
    #expect(seen.0.contains("did not get to the read within 4 s"), "\(seen.0)")
    // `readWriterWait` (4 s), not less (it gave up early); that it gave up at its deadline rather
    // than after the lock is its reason above (no upper bound: a loaded machine may be slow to say so).
    #expect(seen.1 >= .milliseconds(3_900), "the read gave up after \(seen.1)")

    say("go", to: input)
    _ = try await locker.waitForLine(startingWith: "released")
    // An add goes through the writer after every job queued before it: the read's catch-up, then
    // its abandoned turn in the writer's transaction.
    let added = try await queue.add(tag: "job", payload: ["n": "late"])
    #expect(
      bodyOnWriter.load(ordering: .sequentiallyConsistent) == 0, "the abandoned read's body ran on the writer"
    )
    #expect(queue.log.readsRunInWriter == 0)
    #expect(try queue.pendingTasks().map(\.id) == ids + [added])
    #expect(try queue.log.verify().isHealthy)
  }

  /// The same held-up writer, released after two seconds: the read's catch-up did not finish in
  /// its second, so its turn in the writer's transaction is queued behind it; the writer begins
  /// it before the read's four seconds are up, and the body takes three more seconds there. The
  /// read waits for it — a body the writer has begun is the read's own work — and returns its
  /// rows, after the four seconds.
  @Test func aReadWhoseBodyTheWriterHasBegunIsWaitedForPastTheBound() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let ids = try await addJobs(queue, 1_000)
    try await killedRebuild(fixture.path, chunk: 100)
    let input = Pipe()
    let locker = try Child(
      "ferry-test-worker", ["hold-write-lock", fixture.path], stdin: input.fileHandleForReading)
    defer { if locker.process.isRunning { locker.kill() } }
    _ = try await locker.waitForLine(startingWith: "locked")

    let bodyOnWriter = Atomic<Int>(0)
    let outcome = Mutex<(String, Duration)?>(nil)
    Thread.detachNewThread {
      let reader = pthread_self()
      let started = ContinuousClock.now
      let result: String
      do {
        let count = try queue.log.read { view -> Int in
          let tables = try view.tables(of: TaskQueueProjection.projectionName)
          if pthread_equal(pthread_self(), reader) == 0 {
            bodyOnWriter.add(1, ordering: .sequentiallyConsistent)
            Thread.sleep(forTimeInterval: 3)
          }
          return try tables.count("tasks")
        }
        result = "rows \(count)"
      } catch {
        result = isNotCurrent(error) ? "notCurrent" : "error \(error)"
      }
      outcome.withLock { $0 = (result, ContinuousClock.now - started) }
    }
    try await Task.sleep(for: .seconds(2))
    say("go", to: input)
    _ = try await locker.waitForLine(startingWith: "released")
    while outcome.withLock({ $0 }) == nil {
      try await Task.sleep(for: .milliseconds(5))
    }
    let seen = try #require(outcome.withLock { $0 }, "the read never ended")
    // An add goes through the writer after every job the read queued: the writer is idle after it.
    _ = try await queue.add(tag: "job", payload: ["n": "after"])
    if seen.0 == "notCurrent" {
      // Under a loaded machine the writer may not begin the body within the read's four seconds
      // even after the lock's release: then the read gives up as documented — and its body must
      // never have run, then or later (what this test is about is that a body the writer has
      // begun is never abandoned).
      print(
        "the writer did not begin the read's body within its bound (machine load): gave up after \(seen.1)")
      #expect(
        bodyOnWriter.load(ordering: .sequentiallyConsistent) == 0, "a body the writer began was abandoned")
      #expect(queue.log.readsRunInWriter == 0)
    } else {
      #expect(seen.0 == "rows \(ids.count)", "\(seen.0)")
      #expect(seen.1 >= .seconds(4), "the read returned after \(seen.1), before its body could have ended")
      #expect(bodyOnWriter.load(ordering: .sequentiallyConsistent) == 1)
      #expect(queue.log.readsRunInWriter == 1)
    }
    #expect(try queue.log.verify().isHealthy)
  }
}
