@_spi(Engine) @_spi(Experimental) import Ferry
import FerryLog
import Foundation
import LMDB
import TestSupport
import Testing

@Suite(.timeLimit(.minutes(20))) struct SegmentStoreCommandTests {
  /// A worker that opens the store at `path` read-write alone and is stopped (SIGSTOP) after the
  /// first transaction of its projection fold; its standard input keeps it from going on.
  static func openerStoppedInItsFold(_ path: String) async throws -> (opener: Child, input: Pipe) {
    let input = Pipe()
    let opener = try Child(
      "ferry-test-worker", ["store-rebuild", path, "1"], stdin: input.fileHandleForReading,
      environment: ["FERRY_CRASH_POINT": "rebuild.chunk", "FERRY_CRASH_SIGNAL": "STOP"])
    try await pollUntil { isStopped(opener.pid) || !opener.process.isRunning }
    if !isStopped(opener.pid) { opener.kill() }
    try #require(isStopped(opener.pid), "the opener did not reach its fold: \(opener.output)")
    return (opener, input)
  }

  /// A store with a write-ahead segment: while its writer lives, `ferry recover` only reads (and
  /// leaves the live process alone); once the writer is killed with commits in the segment, reads
  /// are refused ("needs recovery", naming `ferry recover`), `ferry recover` replays them and keeps
  /// the segment, a second run only reads, and every task the writer acknowledged is queued.
  @Test func recoverSettlesWhatAKilledWriterLeftAndKeepsTheSegment() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    // The writer alive and holding the store: nothing to recover.
    let input = Pipe()
    let adder = try Child(
      "ferry-test-worker", ["store-segment-add", fixture.path, "200"], stdin: input.fileHandleForReading)
    _ = try await adder.waitForLine(startingWith: "holding")
    let shared = try Child("ferry", ["recover", fixture.path, "--json"])
    #expect(try await shared.wait() == 0)
    #expect(try recoverReport(shared) == RecoverReport(recovered: false, head: 200, writeAheadSegment: true))
    #expect(adder.process.isRunning)
    withExtendedLifetime(input) { adder.kill() }
    #expect(adder.process.terminationReason == .uncaughtSignal)
    let acknowledged = Set(adder.acknowledgedIds)
    #expect(acknowledged.count == 200)

    // Killed with frames to replay: a read-only open alone is refused, and says what to run.
    do {
      let store = try FerryStore.openReadOnly(at: fixture.path)
      store.close()
      Issue.record("a read-only open read a store whose segment holds commits to replay")
    } catch .needsRecovery {
      #expect("\(FerryError.needsRecovery(path: fixture.path))".contains("ferry recover \(fixture.path)"))
    } catch {
      Issue.record("the read-only open threw \(error), not needsRecovery")
    }
    // Every read command reads a recovered copy (RecoveredCopyViewTests), says so naming
    // `ferry recover`, and nothing in the store's files changed.
    let before = try storeFiles(fixture.path)
    for command in ["stats", "inspect", "log", "verify", "export"] {
      let read = try OperatorCompanyTests.ferry([command, fixture.path])
      #expect(read.status == 0, "\(command): \(read.stderr)")
      #expect(read.stderr.contains("ferry recover \(fixture.path)"), "\(command): \(read.stderr)")
    }
    #expect(try storeFiles(fixture.path) == before, "a read wrote to the store")

    let recover = try Child("ferry", ["recover", fixture.path, "--json"])
    #expect(try await recover.wait() == 0)
    #expect(try recoverReport(recover) == RecoverReport(recovered: true, head: 200, writeAheadSegment: true))
    #expect(
      FileManager.default.fileExists(atPath: fixture.path + "/ferry-segment"), "the segment was turned off")
    let again = try Child("ferry", ["recover", fixture.path])
    #expect(try await again.wait() == 0)
    #expect(again.output.contains { $0.hasPrefix("nothing to recover") }, "\(again.output)")
    let stats = try Child("ferry", ["stats", fixture.path])
    #expect(try await stats.wait() == 0)
    try await expectEveryAcknowledgedTaskQueued(fixture, acknowledged, count: 200)
  }

  /// An operator command on a store with a segment, run alone, keeps the segment (an open alone
  /// that does not ask for it would turn it off) and does what it says.
  @Test(arguments: ["pause", "resume", "cancel", "revive", "resolve", "forget"])
  func anOperatorCommandKeepsTheSegment(_ command: String) async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var ids: [TaskID] = []
    var doomed: TaskID = 0
    do {
      let store = try await fixture.openStore { $0.writeAheadSegment = true }
      for n in 0..<20 { ids.append(try await store.queue.add(tag: "t", payload: ["n": n])) }
      // A dead task (for revive), a recorded error (for resolve), a cache age (for forget).
      doomed = try await store.queue.add(tag: "doomed", payload: ["n": 0])
      let runner = TaskRunner(queue: store.queue)
      runner.register(tag: "doomed") { _ in .failed("refused", retryable: false) }
      _ = try await runner.run(.task(doomed))
      try #require(try store.queue.task(doomed)?.status == .dead)
      _ = try await store.queue.recordError(ids[1], message: "fix it")
      try await store.ledger.recordFetch(key: "notes", outcome: .success(isEmpty: false))
      store.close()
    }
    let target: [String] =
      switch command {
      case "cancel": [String(ids[0])]
      case "revive": [String(doomed)]
      case "resolve": [String(ids[1])]
      case "forget": ["notes"]
      default: []
      }
    let child = try Child("ferry", [command, fixture.path] + target)
    #expect(try await child.wait() == 0)
    #expect(
      FileManager.default.fileExists(atPath: fixture.path + "/ferry-segment"),
      "ferry \(command) turned the segment off")
    let store = try await fixture.openStore { $0.writeAheadSegment = true }
    defer { store.close() }
    #expect(try store.queue.isPaused() == (command == "pause"))
    #expect(try store.queue.pendingTasks().filter { $0.tag == "t" }.count == (command == "cancel" ? 19 : 20))
    #expect((try store.queue.task(doomed)?.status == .dead) == (command != "revive"))
    #expect(try store.queue.errors().map(\.taskId) == (command == "resolve" ? [] : [ids[1]]))
    #expect((try store.ledger.record("notes") == nil) == (command == "forget"))
    #expect(try store.log.verify().isHealthy)
  }

}

extension SegmentStoreCommandTests {
  /// A raw LMDB write into a closed store's `data.mdb` behind its segment's back (here: event 7
  /// deleted) is a commit after the checkpoint that no frame holds: every read command refuses
  /// with "needs recovery" (13) instead of reading the edited file as settled, and `ferry recover`
  /// puts the checkpoint — every acknowledged event, event 7 too — back.
  @Test func aRawWriteBehindTheSegmentsBackNeedsRecoveryAndIsUndone() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var ids: [TaskID] = []
    do {
      let store = try await fixture.openStore()
      for n in 0..<20 { ids.append(try await store.queue.add(tag: "t", payload: ["n": n])) }
      store.close()
    }
    #expect(FileManager.default.fileExists(atPath: fixture.path + "/ferry-segment"))
    do {
      let env = try LMDB.Environment.open(path: fixture.path, databases: ["events"])
      defer { env.close() }
      let events = try env.database("events")
      try env.write { txn in _ = try txn.delete(events, key: UInt64(7).bigEndianBytes) }
    }
    // The read commands read a recovered copy, in which the edit is undone too.
    for command in ["verify", "export", "log", "stats"] {
      let read = try OperatorCompanyTests.ferry([command, fixture.path])
      #expect(read.status == 0, "\(command): \(read.status) \(read.stderr)")
      #expect(read.stderr.contains("ferry recover \(fixture.path)"), "\(command): \(read.stderr)")
    }
    let exported = try OperatorCompanyTests.ferry(["export", fixture.path])
    #expect(exported.stdout.split(separator: "\n").filter { $0.contains("task.added") }.count == 20)
    let recover = try Child("ferry", ["recover", fixture.path, "--json"])
    #expect(try await recover.wait() == 0)
    #expect(try recoverReport(recover) == RecoverReport(recovered: true, head: 20, writeAheadSegment: true))
    let verify = try OperatorCompanyTests.ferry(["verify", fixture.path])
    #expect(verify.status == 0, "\(verify.stdout) \(verify.stderr)")
    let store = try await fixture.openStore()
    defer { store.close() }
    var sequences: [UInt64] = []
    try store.log.forEachEvent { sequences.append($0.sequence) }
    #expect(sequences == Array(1...20))
    #expect(try store.queue.pendingTasks().map(\.id) == ids)
    #expect(try store.log.verify().isHealthy)
  }

  /// `ferry compact` keeps a store's segment; `ferry compact --copy`, alone, settles and turns it
  /// off before it swaps a copy in (the segment's checkpoint describes the old file's pages), and
  /// the app's next open turns it on again: nothing is lost either way.
  @Test(arguments: [false, true]) func compactKeepsTheSegmentOrTurnsItOffToCopy(copy: Bool) async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var ids: Set<TaskID> = []
    do {
      let store = try await fixture.openStore { $0.writeAheadSegment = true }
      for n in 0..<300 { ids.insert(try await store.queue.add(tag: "t", payload: ["n": n])) }
      let runner = TaskRunner(queue: store.queue)
      runner.register(tag: "t") { task in
        (task.id.rawValue % 2 == 0) ? .succeeded : .failed("later", retryable: false)
      }
      _ = try await runner.run()
      store.close()
    }
    let compact = try Child(
      "ferry", ["compact", fixture.path, "--retention", "0"] + (copy ? ["--copy"] : []))
    #expect(try await compact.wait() == 0)
    #expect(FileManager.default.fileExists(atPath: fixture.path + "/ferry-segment") == !copy)
    let store = try await fixture.openStore { $0.writeAheadSegment = true }
    defer { store.close() }
    #expect(FileManager.default.fileExists(atPath: fixture.path + "/ferry-segment"))
    let kept = Set(try store.queue.pendingTasks().map(\.id))
    #expect(kept == Set(ids.filter { $0.rawValue % 2 == 1 }))
    #expect(try store.log.verify().isHealthy)
  }
}

/// `ferry recover --json`'s object.
private struct RecoverReport: Decodable, Equatable {
  var recovered: Bool
  var head: UInt64
  var writeAheadSegment: Bool
}

private func recoverReport(_ child: Child) throws -> RecoverReport {
  let line = try #require(child.output.last)
  return try JSONDecoder().decode(RecoverReport.self, from: Data(line.utf8))
}

extension SegmentStoreCommandTests {
  /// An app that does not ask for the segment opens a killed writer's store alone: it marks the
  /// store unsettled, replays the frames, removes the segment, and is killed while it folds them
  /// into its projections (one event per transaction), before it shared the open lock. The store
  /// then has no segment and `ferry-open.lock` still says "unsettled": the next read-write open
  /// settles it (`ferry recover`), after which reads work again and a second read-write open that
  /// shares the store with a live app gets in at once. (Before, the mark stayed for good: every
  /// read-only open — every read command — was refused with "needs recovery", `ferry recover`
  /// said "recovered" each time, and a read-write open beside a live app waited 30 s and failed.)
  @Test func anOpenKilledAfterItRemovedTheSegmentLeavesAStoreThatReadsAgain() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let acknowledged = try await killedSegmentAdder(fixture.path, adds: 500)
    let segment = fixture.path + "/ferry-segment"
    try #require(FileManager.default.fileExists(atPath: segment))

    // The opener stops itself after the first transaction of its fold (the first `rebuild.chunk`
    // of its life comes after the segment's removal): no race with the fold's speed (it raced a
    // 1 ms poll before, and lost under load when the fold of 500 events ended first).
    let (opener, input) = try await SegmentStoreCommandTests.openerStoppedInItsFold(fixture.path)
    defer { opener.kill() }
    let mark = try Data(contentsOf: URL(fileURLWithPath: fixture.path + "/ferry-open.lock"))
    withExtendedLifetime(input) { opener.kill() }
    try #require(!FileManager.default.fileExists(atPath: segment), "the opener did not remove the segment")
    try #require(!opener.output.contains("open"), "the opener finished opening before it was stopped")
    try #require(mark.first == UInt8(ascii: "1"), "the open lock is not marked unsettled")

    let recover = try Child("ferry", ["recover", fixture.path])
    #expect(try await recover.wait() == 0)
    let stats = try Child("ferry", ["stats", fixture.path])
    #expect(try await stats.wait() == 0, "reads are still refused after ferry recover")

    // A read-write open beside a live app gets in (it waited 30 s for the mark, then failed).
    let appInput = Pipe()
    let app = try Child(
      "ferry-test-worker", ["hold-open", fixture.path], stdin: appInput.fileHandleForReading)
    _ = try await app.waitForLine(startingWith: "open ")
    let began = ContinuousClock.now
    let pause = try Child("ferry", ["pause", fixture.path])
    #expect(try await pause.wait() == 0)
    #expect(ContinuousClock.now - began < .seconds(20))
    appInput.fileHandleForWriting.closeFile()
    _ = try await app.waitForLine(startingWith: "closed")
    try await expectEveryAcknowledgedTaskQueued(fixture, acknowledged, count: 500)
  }
}

extension SegmentStoreCommandTests {
  /// An app holds a store with a segment and someone deletes `ferry-open.lock` (a "stale lock" to
  /// them). Operator commands then take Ferry's open lock alone on a new file while the app still
  /// has the store open: none may take itself for alone — restore the checkpoint's meta pages
  /// under the live app, replay, checkpoint — which broke the app's next commit ("its newest meta
  /// page names transaction …") and left a store only salvage could read. They follow the store as
  /// any open beside a live one does; the app goes on adding, and nothing is lost.
  @Test func operatorCommandsBesideALiveAppWhoseOpenLockFileWasDeletedLeaveItAlone() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let input = Pipe()
    let app = try Child(
      "ferry-test-worker", ["store-segment-add", fixture.path, "300"], stdin: input.fileHandleForReading)
    defer { withExtendedLifetime(input) { app.kill() } }
    _ = try await app.waitForLine(startingWith: "holding")
    #expect(unlink(fixture.path + "/ferry-open.lock") == 0)
    let acknowledged = app.acknowledgedIds
    #expect(acknowledged.count == 300)

    let pause = try Child("ferry", ["pause", fixture.path])
    #expect(try await pause.wait() == 0, "\(pause.output)")
    let cancel = try Child("ferry", ["cancel", fixture.path, String(acknowledged[0])])
    #expect(try await cancel.wait() == 0, "\(cancel.output)")
    let stats = try Child("ferry", ["stats", fixture.path])
    #expect(try await stats.wait() == 0, "\(stats.output)")
    // The app closes (its checkpoint) and a second one adds more, as the first would go on.
    say("close", to: input)
    _ = try await app.waitForLine(startingWith: "closed")
    let more = Pipe()
    let second = try Child(
      "ferry-test-worker", ["store-segment-add", fixture.path, "20"], stdin: more.fileHandleForReading)
    _ = try await second.waitForLine(startingWith: "holding")
    say("close", to: more)
    _ = try await second.waitForLine(startingWith: "closed")
    #expect(try await second.wait() == 0)
    try await expectEveryAcknowledgedTaskQueued(
      fixture, Set(acknowledged.dropFirst() + second.acknowledgedIds), count: 319)
    let store = try await fixture.openStore { $0.writeAheadSegment = true }
    defer { store.close() }
    #expect(try store.queue.isPaused())
    #expect(try store.queue.task(acknowledged[0]) == nil)
  }
}

/// The bytes of every file in the store's directory, by name (the open lock's file left out: every
/// opener takes its lock there).
func storeFiles(_ path: String) throws -> [String: Data] {
  var files: [String: Data] = [:]
  for name in try FileManager.default.contentsOfDirectory(atPath: path) where name != "ferry-open.lock" {
    files[name] = try Data(contentsOf: URL(fileURLWithPath: path + "/" + name))
  }
  return files
}
