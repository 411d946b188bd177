import FerryLog
import FerryTesting
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @_spi(Experimental) @testable import Ferry

#if canImport(Glibc)
  import Glibc
#endif

/// `FerryStore.suspend()` and `resume()`: a suspended store holds no lock on any of its files (an
/// iOS app suspended with one in an app group is killed), another process may open it read-write
/// meanwhile, calls while suspended fail with `FerryError.suspended`, and what the app holds
/// — queue, ledger, runners, update streams — goes on after the resume.
@Suite(.timeLimit(.minutes(20))) struct SuspensionTests {
  static let hasProcLocks = FileManager.default.fileExists(atPath: "/proc/locks")

  @Test(.enabled(if: hasProcLocks), arguments: [false, true])
  func aSuspendedStoreHoldsNoLockAndAnotherProcessAddsBeforeTheResumeSeesIt(segment: Bool) async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore { $0.writeAheadSegment = segment }
    defer { store.close() }
    let run = runner(store.queue)
    run.register(tag: "t") { _ in .succeeded }
    run.register(tag: "app") { _ in .succeeded }  // the worker's tasks
    _ = try await store.queue.add(tag: "t", payload: ["n": 0])
    let first = try await run.run()  // the process's liveness token exists from here on
    #expect(first.succeeded == 1)
    let updates = store.queue.updates()  // observed: other processes' adds are read for it
    let held = StoreFiles(fixture.path).lockedFiles()
    // The test could fail: before the suspension, each kind of lock is there.
    #expect(held.contains("lock.mdb"), "\(held)")
    #expect(held.contains("ferry-open.lock"), "\(held)")
    #expect(held.contains { $0.hasPrefix("owners/") }, "\(held) of \(StoreFiles(fixture.path).inodes)")

    await store.suspend()
    #expect(store.isSuspended)
    let files = StoreFiles(fixture.path)
    #expect(files.lockedFiles().isEmpty, "locks held while suspended: \(files.lockedFiles())")
    #expect(files.openHere().isEmpty, "files of the store open while suspended: \(files.openHere())")

    // Another process opens the store read-write (alone: nobody else has it) and adds.
    let adder = try Child("ferry-test-worker", ["add-tasks", fixture.path, "5"])
    #expect(try await adder.wait() == 0, "\(adder.output)")
    let theirs = adder.acknowledgedIds
    try #require(theirs.count == 5, "\(adder.output)")

    try await store.resume()
    #expect(!store.isSuspended)
    // Projections caught up with the other process's adds; the app's objects work.
    #expect(Set(try store.queue.pendingTasks().map(\.id)) == Set(theirs))
    let report = try await run.run()
    #expect(Set(report.entries.filter { $0.outcome == .succeeded }.map(\.taskId)) == Set(theirs))
    // The stream the app held before the suspension tells it the other process's adds.
    var told: Set<TaskID> = []
    for await update in updates {
      if case .added(let id) = update { told.insert(id) }
      if told == Set(theirs) { break }
    }
    #expect(told == Set(theirs))
    #expect(try store.log.verify().isHealthy)
  }

  @Test func callsWhileSuspendedFailWithSuspendedAndWorkAfterTheResume() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let first = try await store.queue.add(tag: "t", payload: ["n": 0])
    try await store.ledger.recordFetch(key: "notes", outcome: .success(isEmpty: false))
    let run = runner(store.queue)
    run.register(tag: "t") { _ in .succeeded }

    await store.suspend()
    await store.suspend()  // twice: nothing more
    await expectSuspended { try await store.queue.add(tag: "t", payload: ["n": 1]) }
    await expectSuspended { try store.queue.task(first) }
    await expectSuspended { try store.queue.pendingTasks() }
    await expectSuspended { try store.ledger.state(key: "notes", maxAge: .seconds(60)) }
    await expectSuspended { try await store.ledger.recordFetch(key: "x", outcome: .success(isEmpty: false)) }
    await expectSuspended { try await run.run() }
    await expectSuspended { try await store.queue.cancel(first) }
    await expectSuspended { try store.log.head() }

    try await store.resume()
    try await store.resume()  // twice: nothing more
    // Nothing a refused call asked for was written.
    #expect(try store.queue.pendingTasks().map(\.id) == [first])
    #expect(try store.ledger.record("x") == nil)
    #expect(try store.ledger.record("notes") != nil)
    let second = try await store.queue.add(tag: "t", payload: ["n": 2])
    let report = try await run.run()
    #expect(Set(report.entries.filter { $0.outcome == .succeeded }.map(\.taskId)) == [first, second])
    #expect(try store.log.verify().isHealthy)
  }

  @Test func aStoreClosedWhileSuspendedOpensAgain() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let id: TaskID
    do {
      let store = try await fixture.openStore()
      id = try await store.queue.add(tag: "t", payload: ["n": 0])
      await store.suspend()
      store.close()
      await store.suspend()
      try await store.resume()  // closed: nothing to resume
      #expect(store.log.isClosed)
      do {
        _ = try await store.queue.add(tag: "t", payload: ["n": 1])
        Issue.record("an add on a closed store succeeded")
      } catch FerryError.closed {
      } catch {
        Issue.record("an add on a closed store threw \(error), not closed")
      }
    }
    let store = try await fixture.openStore()
    defer { store.close() }
    #expect(try store.queue.pendingTasks().map(\.id) == [id])
  }

  /// A handler blocked on a gate that ignores its cancellation, with no grace: the suspension
  /// logs the run as interrupted (the runner's stop), and after the resume automatic running runs
  /// the task again, once — read from the log.
  @Test func aRunInFlightAtTheSuspensionIsInterruptedAndRunsOnceAfterTheResume() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let gate = Gate()
    let calls = Atomic<Int>(0)
    let run = runner(store.queue) { $0.interruptionGrace = .zero }
    run.register(tag: "t") { _ in
      if calls.add(1, ordering: .relaxed).newValue == 1 { await gate.wait() }
      return .succeeded
    }
    let updates = store.queue.updates()
    let id = try await store.queue.add(tag: "t", payload: ["n": 0])
    run.startAutomaticRunning()
    for await update in updates {
      if case .running(id, _) = update { break }
    }
    await store.suspend()
    #expect(!run.isRunningAutomatically)
    try await store.resume()
    #expect(run.isRunningAutomatically)
    for await update in updates {
      if case .succeeded(id) = update { break }
    }
    gate.open()  // the first call returns now: its outcome is dropped
    run.stop()
    let ledger = try RunLedger(store.log, deadOwners: { _ in true })
    ledger.expectEachTaskRanOnce([id])
    let runs = ledger.tasks[id] ?? .init()
    #expect(runs.starts.count == 2 && runs.interruptions.count == 1 && runs.successes == 1, "\(runs)")
    #expect(try store.queue.pendingTasks().isEmpty)
  }

  /// A handler that honours its cancellation: its outcome (a failure) is logged within the grace.
  @Test func aHandlerThatReturnsWithinTheGraceHasItsOutcomeLogged() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let gate = Gate()
    let calls = Atomic<Int>(0)
    let run = runner(store.queue)
    run.register(tag: "t") { _ in
      if calls.add(1, ordering: .relaxed).newValue == 1 {
        await withTaskCancellationHandler {
          await gate.wait()
        } onCancel: {
          gate.open()
        }
        return .failed("cut short", retryable: true)
      }
      return .succeeded
    }
    let updates = store.queue.updates()
    let id = try await store.queue.add(tag: "t", payload: ["n": 0])
    run.startAutomaticRunning()
    for await update in updates {
      if case .running(id, _) = update { break }
    }
    await store.suspend()
    try await store.resume()
    let ledger = try RunLedger(store.log)
    let runs = ledger.tasks[id] ?? .init()
    // Logged before the log let go: the run ended (as the stopped pass logs it), none open.
    #expect(runs.starts.count == runs.finishes + runs.interruptions.count, "\(runs)")
    #expect(runs.starts.count == 1, "\(runs)")
    #expect(ledger.violations.isEmpty, "\(ledger.violations)")
    run.stop()
  }

  /// A run outside any pass (`run(.task)`) whose handler still runs at the suspension is left
  /// as a killed process leaves it: the resume interrupts it, and it runs again.
  @Test func aSingleRunLeftRunningIsInterruptedByTheResume() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let gate = Gate()
    let calls = Atomic<Int>(0)
    let run = runner(store.queue)
    run.register(tag: "t") { _ in
      if calls.add(1, ordering: .relaxed).newValue == 1 { await gate.wait() }
      return .succeeded
    }
    let updates = store.queue.updates()
    let id = try await store.queue.add(tag: "t", payload: ["n": 0])
    let single = Task { try await run.run(.task(id)) }
    for await update in updates {
      if case .running(id, _) = update { break }
    }
    await store.suspend()
    gate.open()
    // Its outcome could not be logged: the call fails, and nothing was written.
    await expectSuspended { try await single.value }
    try await store.resume()
    #expect(store.queue.interruptedAtOpen == [id])
    let report = try await run.run()
    #expect(report.entries.filter { $0.outcome == .succeeded }.map(\.taskId) == [id])
    let ledger = try RunLedger(store.log, deadOwners: { _ in true })
    ledger.expectEachTaskRanOnce([id])
    #expect(ledger.tasks[id]?.interruptions.count == 1)
  }

  @Test func automaticRunningAndUpdateStreamsGoOnAfterTheResume() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let run = runner(store.queue)
    run.register(tag: "t") { _ in .succeeded }
    run.startAutomaticRunning()
    let updates = store.queue.updates()
    await store.suspend()
    try await store.resume()
    let id = try await store.queue.add(tag: "t", payload: ["n": 0])
    for await update in updates {
      if case .succeeded(id) = update { break }
    }
    try await store.ledger.recordFetch(key: "notes", outcome: .success(isEmpty: false))
    #expect(try store.ledger.record("notes") != nil)
    #expect(try store.queue.pendingTasks().isEmpty)
    run.stop()
  }

  /// The lifecycle hook's decision (the UIKit notifications themselves exist on iOS only): the
  /// store ends as the app's latest move asked, whatever order its tasks run in.
  @Test func followingTheAppSuspendsAndResumesAsItsLatestMoveAsked() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    store.appWantsSuspension.withLock { $0 = true }
    await store.followApp()
    #expect(store.isSuspended)
    await store.followApp()  // a second task of the same move: nothing more
    #expect(store.isSuspended)
    store.appWantsSuspension.withLock { $0 = false }
    await store.followApp()
    #expect(!store.isSuspended)
    // The background's task runs after the foreground's: the store stays open.
    store.appWantsSuspension.withLock { $0 = true }
    store.appWantsSuspension.withLock { $0 = false }
    await store.followApp()
    await store.followApp()
    #expect(!store.isSuspended)
    _ = try await store.queue.add(tag: "t", payload: ["n": 0])
  }

  /// Adds from several tasks while the store is suspended and resumed: every add either is
  /// committed and acknowledged, or fails with `suspended` and is not in the log.
  @Test func aSuspensionRacingAddsLosesNoAcknowledgedAddAndWritesNoRefusedOne() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let (adders, each) = (6, 40)
    let started = Tally()
    let outcomes = await withTaskGroup(of: ([TaskID], Int, [String]).self) { group in
      for adder in 0..<adders {
        group.addTask {
          var acked: [TaskID] = []
          var refused = 0
          var other: [String] = []
          for n in 0..<each {
            do {
              acked.append(try await store.queue.add(tag: "t", payload: ["a": adder, "n": n]))
            } catch FerryError.suspended {
              refused += 1
            } catch {
              other.append("\(error)")
            }
            started.count.add(1, ordering: .relaxed)
          }
          return (acked, refused, other)
        }
      }
      group.addTask {
        // Suspend once the adds are under way, resume, and again.
        for round in 1...2 {
          while started.count.load(ordering: .relaxed) < round * adders * each / 3 { await Task.yield() }
          await store.suspend()
          try? await store.resume()
        }
        return ([], 0, [])
      }
      var all: [([TaskID], Int, [String])] = []
      for await outcome in group { all.append(outcome) }
      return all
    }
    let acked = outcomes.flatMap(\.0)
    let refused = outcomes.map(\.1).reduce(0, +)
    #expect(outcomes.flatMap(\.2).isEmpty, "\(outcomes.flatMap(\.2).prefix(3))")
    #expect(acked.count + refused == adders * each)
    #expect(Set(acked).count == acked.count)
    var added: [TaskID] = []
    try store.log.forEachEvent { event in
      if event.type == "task.added" { added.append(TaskID(rawValue: event.sequence)) }
    }
    #expect(Set(added) == Set(acked), "acknowledged \(acked.count), logged \(added.count)")
    #expect(try store.log.verify().isHealthy)
  }

  /// Suspended and resumed many times while automatic running works through the tasks added
  /// between: every task runs once (from the log), the store verifies, and no lock leaks.
  @Test func suspendAndResumeInALoop() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let run = runner(store.queue)
    run.register(tag: "t") { _ in .succeeded }
    run.startAutomaticRunning()
    let updates = store.queue.updates()
    var ids: [TaskID] = []
    for round in 0..<25 {
      ids.append(try await store.queue.add(tag: "t", payload: ["n": round]))
      await store.suspend()
      try await store.resume()
    }
    var succeeded: Set<TaskID> = []
    for await update in updates {
      if case .succeeded(let id) = update { succeeded.insert(id) }
      if succeeded.isSuperset(of: ids) { break }
    }
    run.stop()
    let ledger = try RunLedger(store.log, deadOwners: { _ in true })
    ledger.expectEachTaskRanOnce(ids)
    #expect(ids.allSatisfy { ledger.tasks[$0]?.successes == 1 })
    #expect(try store.log.verify().isHealthy)
    if Self.hasProcLocks {
      await store.suspend()
      #expect(StoreFiles(fixture.path).lockedFiles().isEmpty)
      #expect(StoreFiles(fixture.path).openHere().isEmpty)
    }
  }
}

/// A count several tasks share.
final class Tally: Sendable {
  let count = Atomic<Int>(0)
}

/// Expects `body` to throw `FerryError.suspended` (or the engine's own, for a call on `store.log`).
func expectSuspended<R>(
  sourceLocation: SourceLocation = #_sourceLocation, _ body: () async throws -> R
) async {
  do {
    _ = try await body()
    Issue.record("no error while suspended", sourceLocation: sourceLocation)
  } catch FerryError.suspended {
  } catch FerryLogError.suspended {
  } catch {
    Issue.record("\(error), not suspended", sourceLocation: sourceLocation)
  }
}

/// The files of a store and what this process (or any) holds on them.
struct StoreFiles {
  /// Path inside the store → inode, every file in it and its subdirectories.
  let inodes: [String: UInt64]
  let root: String

  init(_ root: String) {
    self.root = root
    var inodes: [String: UInt64] = [:]
    let enumerator = FileManager.default.enumerator(atPath: root)
    while let name = enumerator?.nextObject() as? String {
      var info = stat()
      if stat(root + "/" + name, &info) == 0 { inodes[name] = UInt64(info.st_ino) }
    }
    self.inodes = inodes
  }

  /// The store's files that any process holds a lock on (`/proc/locks`: POSIX, OFD and flock).
  func lockedFiles() -> Set<String> {
    guard let text = procText("/proc/locks") else { return [] }
    let byInode = Dictionary(inodes.map { ($1, $0) }, uniquingKeysWith: { first, _ in first })
    var locked: Set<String> = []
    for line in text.split(separator: "\n") {
      // "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 EOF" (a waiter has "->" after the number).
      let fields = line.split(whereSeparator: { $0 == " " }).filter { $0 != "->" }
      guard fields.count > 5, let inode = fields[5].split(separator: ":").last.flatMap({ UInt64($0) }),
        let name = byInode[inode]
      else { continue }
      locked.insert(name)
    }
    return locked
  }

  /// The store's files this process has open (`/proc/self/fd`).
  func openHere() -> [String] {
    guard let fds = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") else { return [] }
    return fds.compactMap { fd in
      guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + fd),
        target.hasPrefix(root + "/")
      else { return nil }
      return target
    }
  }
}
