import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

// Twenty minutes: some tests here make thousands of durable commits, which a loaded disk can
// take minutes over; the limit is there to end a hang, not to time the work.

/// Owner tokens and the owners directory: a run stays with its live owner (paused, or a pid
/// that only looks alive), and odd files or exhausted descriptors never break a pass.
///
/// A test marked "Regression:" failed on the code before its fix.
@Suite(.timeLimit(.minutes(20)), .serialized) struct OwnerTokenTests {
  // MARK: Tokens that are missing for other reasons

  /// Regression: a store copied by `ferry export | ferry import` while a task runs elsewhere. In the new
  /// store the run's owner has no token, and the owner's pid is alive (it is running a task of the
  /// *original* store): the copy's task is "running" for as long as that unrelated process lives,
  /// and `run(.task(id))` on the copy waits for it. The pid fallback cannot tell "the owner of this
  /// store's run" from "some process with that number" (same for a reused pid, pid 1 in a container,
  /// another pid namespace).
  @Test func anImportedStoreWithARunUnderWayElsewhereIsStuckWhileThatPidLives() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let copy = QueueFixture()
    defer { copy.remove() }
    let hanging = try Child("ferry-test-worker", ["run-and-hang", fixture.path])
    defer { hanging.kill() }
    let line = try await hanging.waitForLine(startingWith: "running ")
    let id = try #require(TaskID(line.dropFirst("running ".count)))
    let exportPath = fixture.path + ".jsonl"
    defer { try? FileManager.default.removeItem(atPath: exportPath) }
    _ = FileManager.default.createFile(atPath: exportPath, contents: nil)
    let export = Process()
    export.executableURL = productURL("ferry")
    export.arguments = ["export", fixture.path]
    export.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: exportPath))
    try export.run()
    export.waitUntilExit()
    #expect(export.terminationStatus == 0)
    let importing = try Child(
      "ferry", ["import", copy.path], stdin: FileHandle(forReadingAtPath: exportPath))
    #expect(try await importing.wait() == 0)

    // The import interrupted it: no process owns runs in a store that did not exist a moment ago.
    #expect(
      importing.output.contains { $0.hasPrefix("interrupted 1 run that was under way") },
      "\(importing.output)")
    let queue = try await TaskQueue.open(at: copy.path)
    defer { queue.close() }
    #expect(try queue.task(id)?.status == .ready)
    let runner = TaskRunner(queue: queue)
    runner.register(tag: "hang") { _ in .succeeded }
    // No wall-clock give-up: a run that keeps waiting is caught by the suite's time limit.
    let outcome = try await runner.run(.task(id))
    #expect(outcome.outcome(of: id) == .succeeded, "run(.task) on the copy: \(outcome)")
  }

  // MARK: A paused (SIGSTOP) owner

  /// Passes: a SIGSTOPped owner keeps its flock, so its run is neither interrupted at open, by the
  /// periodic check of automatic running, nor by run(.task(id)) (which waits).
  @Test func aStoppedOwnerKeepsItsRun() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let hanging = try Child("ferry-test-worker", ["run-and-hang", fixture.path])
    defer {
      kill(hanging.pid, SIGCONT)
      hanging.kill()
    }
    let line = try await hanging.waitForLine(startingWith: "running ")
    let id = try #require(TaskID(line.dropFirst("running ".count)))
    kill(hanging.pid, SIGSTOP)
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    #expect(queue.interruptedAtOpen.isEmpty)
    var configuration = TaskRunner.Configuration()
    configuration.deadOwnerCheckInterval = .milliseconds(20)
    let runner = TaskRunner(queue: queue, configuration: configuration)
    let ran = Atomic<Int>(0)
    runner.register(tag: "hang") { _ in
      ran.add(1, ordering: .relaxed)
      return .succeeded
    }
    runner.startAutomaticRunning()
    let single = try await resultWithin(1.5) { try await runner.run(.task(id)) }
    runner.stop()
    #expect(single == nil, "run(.task) should still be waiting for the paused owner")
    #expect(ran.load(ordering: .relaxed) == 0)
    #expect(try queue.task(id)?.status == .running)
    #expect(try !queue.log.events(after: 0, limit: 100).map(\.type).contains("task.runInterrupted"))
  }

  /// Passes: three runner processes on one store, one of them SIGSTOPped for a while mid-way: each
  /// task runs once, nobody's run is interrupted.
  @Test func threeRunnerProcessesOneOfThemPausedRunEachTaskOnce() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var ids: [TaskID] = []
    do {
      let queue = try await TaskQueue.open(at: fixture.path)
      defer { queue.close() }
      for n in 0..<600 {
        ids.append(
          try await queue.add(
            tag: "job", payload: ["kind": "ok", "n": "\(n)"], groupId: n % 4 == 0 ? "g\(n % 20)" : nil))
      }
    }
    let children = [
      try Child("ferry-test-worker", ["run-tasks", fixture.path]),
      try Child("ferry-test-worker", ["run-tasks", fixture.path, "3"]),
      try Child("ferry-test-worker", ["run-tasks", fixture.path, "2"]),
    ]
    _ = try await children[1].waitForLine(startingWith: "ran ")
    kill(children[1].pid, SIGSTOP)
    try await Task.sleep(for: .milliseconds(1500))
    kill(children[1].pid, SIGCONT)
    for child in children { #expect(try await child.wait() == 0) }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let runs = try runsByTask(queue.log)
    for id in ids {
      let r = runs[id]
      #expect(
        r?.starts == 1 && r?.successes == 1 && r?.interruptions == 0, "task \(id): \(String(describing: r))")
    }
  }

  // MARK: The owners directory and descriptors

  /// Passes (checks for crash/hang): `owners` is a file; a pass says why it cannot run (an error),
  /// neither crashes nor hangs nor reports success.
  @Test func ownersIsAFile() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    _ = FileManager.default.createFile(atPath: fixture.path + "/owners", contents: Data("x".utf8))
    let id = try await queue.add(tag: "t", payload: ["n": 1])
    let runner = TaskRunner(queue: queue)
    runner.register(tag: "t") { _ in .succeeded }
    await #expect(throws: (any Error).self) { try await runner.run() }
    await #expect(throws: (any Error).self) { try await runner.run(.task(id)) }
    #expect(try queue.task(id)?.status == .ready)
  }

  /// Passes: garbage in `owners/` (a directory, a FIFO and a symlink to a FIFO under owner-like
  /// names, a stale staging file, junk names) neither blocks nor crashes open, sweep or a pass.
  @Test func garbageInOwnersIsHarmless() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    do {
      let queue = try await TaskQueue.open(at: fixture.path)
      try await queue.add(tag: "t", payload: ["n": 1])
      queue.close()
    }
    let owners = fixture.path + "/owners"
    try? FileManager.default.createDirectory(atPath: owners, withIntermediateDirectories: true)
    try FileManager.default.createDirectory(
      atPath: owners + "/abc-0000000000000001", withIntermediateDirectories: true)
    #expect(mkfifo(owners + "/abd-0000000000000002", 0o600) == 0)
    #expect(mkfifo(fixture.path + ".fifo", 0o600) == 0)
    defer { unlink(fixture.path + ".fifo") }
    #expect(symlink(fixture.path + ".fifo", owners + "/abe-0000000000000003") == 0)
    _ = FileManager.default.createFile(atPath: owners + "/.abf-0000000000000004.new", contents: nil)
    _ = FileManager.default.createFile(atPath: owners + "/not an owner", contents: nil)
    // No wall-clock give-up: a pass that hangs is caught by the suite's time limit.
    let result: PassReport
    do {
      let queue = try await TaskQueue.open(at: fixture.path)
      defer { queue.close() }
      let runner = TaskRunner(queue: queue)
      runner.register(tag: "t") { _ in .succeeded }
      result = try await runner.run()
    }
    #expect(result.entries.count == 1)
  }

  /// Passes: every descriptor in use while a pass starts: the pass fails with an error (no crash,
  /// no claim left behind), and succeeds once descriptors are back.
  @Test func noFileDescriptorsLeft() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let child = try Child("ferry-test-worker", ["run-without-descriptors", fixture.path])
    let status = try await child.wait()
    #expect(status == 0, "\(child.output)")
    #expect(child.output.contains { $0.hasPrefix("first error") }, "\(child.output)")
    #expect(child.output.contains("second Optional(succeeded)"), "\(child.output)")
  }
}
