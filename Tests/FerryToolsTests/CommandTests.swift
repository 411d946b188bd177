import Ferry
import FerryLog
import FerryTools
import Foundation
import LMDB
import Synchronization
import TestSupport
import Testing

/// What a run of the `ferry` executable printed and how it ended.
struct CommandResult {
  let status: Int32
  let stdout: String
  let stderr: String
}

/// Runs the built `ferry` with `arguments` (and `input` on standard input), killing it after ten
/// minutes (a hang guard, far above what a loaded machine takes).
func ferry(
  _ arguments: [String], input: String? = nil, environment: [String: String] = [:],
  executable: String = "ferry"
) throws -> CommandResult {
  signal(SIGPIPE, SIG_IGN)  // a write to a child that died must fail, not kill the test process
  let process = Process()
  process.executableURL = productURL(executable)
  process.arguments = arguments
  if !environment.isEmpty {
    process.environment = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
  }
  let out = Pipe()
  let err = Pipe()
  process.standardOutput = out
  process.standardError = err
  let inputPipe = Pipe()
  process.standardInput = inputPipe
  try process.run()
  // The watchdog holds the process weakly: held strongly, every call kept its process and three
  // pipes open for a minute — over a thousand descriptors across the suite, past what Foundation's
  // `Process.run()` scans of /proc/self/fd without reading beyond its buffer (a SIGSEGV in CI).
  DispatchQueue.global().asyncAfter(deadline: .now() + 600) { [weak process] in
    if let process, process.isRunning { process.terminate() }
  }
  if let input { inputPipe.fileHandleForWriting.write(Data(input.utf8)) }
  try inputPipe.fileHandleForWriting.close()
  let stderrData = Mutex<Data>(Data())
  let group = DispatchGroup()
  group.enter()
  Thread.detachNewThread {  // its own thread: a blocking read must not wait for a pool thread
    stderrData.withLock { $0 = err.fileHandleForReading.readAll() }
    group.leave()
  }
  let stdout = out.fileHandleForReading.readAll()
  group.wait()
  process.waitUntilExit()
  return CommandResult(
    status: process.terminationStatus, stdout: String(decoding: stdout, as: UTF8.self),
    stderr: String(decoding: stderrData.withLock { $0 }, as: UTF8.self))
}

/// A demo store in a fresh directory, removed by `remove()`.
struct DemoStore {
  let path = FileManager.default.temporaryDirectory.path + "/ferry-cli-\(UUID().uuidString.prefix(8))"
  func remove() { try? FileManager.default.removeItem(atPath: path) }
}

@Suite(.timeLimit(.minutes(20)), .serialized) struct CommandTests {
  @Test func theDemoTellsTheSameStoryForTheSameSeed() async throws {
    let first = DemoStore()
    let second = DemoStore()
    defer {
      first.remove()
      second.remove()
    }
    let lines = Mutex<[String]>([])
    let a = try await runDemo(
      path: first.path, seed: 7, output: Output(line: { line in lines.withLock { $0.append(line) } }))
    let b = try await runDemo(path: second.path, seed: 7, output: Output(line: { _ in }))
    #expect(a.snapshot == b.snapshot)
    let text = lines.withLock { $0 }.joined(separator: "\n")
    #expect(text.contains("needs the user"))
    #expect(text.contains("projections equal a rebuild: yes"))
    let other = DemoStore()
    defer { other.remove() }
    let c = try await runDemo(path: other.path, seed: 8, output: Output(line: { _ in }))
    #expect(c.snapshot.head != a.snapshot.head || c.snapshot != a.snapshot)

    let run = try ferry(["demo", "--seed", "3", "--dir", other.path + "-exe"])
    defer { try? FileManager.default.removeItem(atPath: other.path + "-exe") }
    #expect(run.status == 0)
    #expect(run.stdout.contains("ferry inspect \(other.path)-exe"))
  }

  @Test func inspectPrintsTablesAndStableJSON() async throws {
    let demo = DemoStore()
    defer { demo.remove() }
    let story = try await runDemo(path: demo.path, seed: 7, output: Output(line: { _ in }))
    let table = try ferry(["inspect", demo.path])
    #expect(table.status == 0)
    #expect(table.stdout.contains("pending tasks (1)"))
    #expect(table.stdout.contains("share-list (manual)"))
    let json = try ferry(["inspect", demo.path, "--json", "--max-age", "60"])
    #expect(json.status == 0)
    let report = try JSONDecoder().decode(InspectReport.self, from: Data(json.stdout.utf8))
    #expect(report.head == story.snapshot.head)
    #expect(report.tasks.map(\.id) == story.snapshot.tasks.map(\.id))
    #expect(report.caches.map(\.key) == ["grocery-list", "store-hours"])
    #expect(report.maxAgeMs == 60_000)
    #expect(report.totals.manual == 1)
  }

  /// Issue 14's status and payload updates as the tools show them: a task behind a blocked group
  /// head is "waiting for its group" (after that head) in `ferry inspect`, and `ferry log` reads a
  /// `task.payloadUpdated` out.
  @Test func inspectShowsTasksWaitingForTheirGroupAndLogShowsPayloadUpdates() async throws {
    let demo = DemoStore()
    defer { demo.remove() }
    do {
      let store = try await FerryStore.open(at: demo.path)
      defer { store.close() }
      let head = try await store.queue.add(tag: "save-note", payload: ["text": "typo"], groupId: "note-1")
      _ = try await store.queue.add(tag: "save-note", payload: ["text": "later"], groupId: "note-1")
      try await store.queue.recordError(head, message: "the title is too long")
      try await store.queue.updatePayload(head, to: ["text": "fixed"])
    }
    let table = try ferry(["inspect", demo.path])
    #expect(table.status == 0)
    let behind = table.stdout.split(separator: "\n").first {
      $0.contains("waiting for its group (behind task 1)")
    }
    #expect(behind?.contains("after task 1") == true, "\(table.stdout)")
    #expect(table.stdout.contains("1 waiting for their group"))
    let json = try ferry(["inspect", demo.path, "--json"])
    let report = try JSONDecoder().decode(InspectReport.self, from: Data(json.stdout.utf8))
    #expect(report.tasks.map(\.status) == ["blocked", "waitingForGroup"])
    #expect(report.tasks.map(\.behind) == [nil, 1])
    #expect(report.totals.waitingForGroup == 1)
    let log = try ferry(["log", demo.path, "--type", "task.payloadUpdated"])
    #expect(log.status == 0)
    #expect(log.stdout.contains(#"task 1 payload updated: {"text":"fixed"}"#), "\(log.stdout)")
  }

  /// Priority and deadlines as the tools show them: `ferry inspect` marks a task's priority and
  /// deadline, and `ferry log` reads both out of an add and names the task a pass expired.
  @Test func inspectAndLogShowPriorityDeadlinesAndExpiry() async throws {
    let demo = DemoStore()
    defer { demo.remove() }
    let deadline: Int64 = 4_102_444_800_000  // 2100-01-01T00:00:00Z
    do {
      let store = try await FerryStore.open(at: demo.path)
      defer { store.close() }
      _ = try await store.queue.add(
        tag: "save-note", payload: ["text": "late"], options: [.deadline(Date().addingTimeInterval(-1))])
      _ = try await store.queue.add(
        tag: "save-note", payload: ["text": "urgent"],
        options: [.manual, .priority(.high), .deadline(Date(timeIntervalSince1970: Double(deadline) / 1000))])
      let report = try await TaskRunner(queue: store.queue).run()  // no handler: it only sweeps
      #expect(report.outcome(of: 1) == .expired)
    }
    let table = try ferry(["inspect", demo.path])
    #expect(table.status == 0)
    let line = table.stdout.split(separator: "\n").first { $0.contains("save-note") }
    #expect(line?.contains("save-note (manual)") == true, "\(table.stdout)")
    #expect(line?.contains("priority high; deadline 2100-01-01T00:00:00.000Z") == true, "\(table.stdout)")
    let json = try ferry(["inspect", demo.path, "--json"])
    let report = try JSONDecoder().decode(InspectReport.self, from: Data(json.stdout.utf8))
    #expect(report.tasks.map(\.id) == [2])
    #expect(report.tasks.map(\.priority) == [1])
    #expect(report.tasks.map(\.deadline) == [deadline])
    let log = try ferry(["log", demo.path])
    #expect(log.status == 0)
    #expect(log.stdout.contains("task 1 expired: its deadline passed before it started"), "\(log.stdout)")
    #expect(log.stdout.contains("priority high, deadline 2100-01-01T00:00:00.000Z"), "\(log.stdout)")
  }

  @Test func logFiltersAndReplayTravelsInTime() async throws {
    let demo = DemoStore()
    defer { demo.remove() }
    _ = try await runDemo(path: demo.path, seed: 7, output: Output(line: { _ in }))
    let all = try ferry(["log", demo.path])
    #expect(all.status == 0)
    #expect(all.stdout.split(separator: "\n").count == 33)
    let failures = try ferry(["log", demo.path, "--type", "task.runFailed", "--json"])
    let lines = failures.stdout.split(separator: "\n")
    #expect(!lines.isEmpty)
    for line in lines {
      let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
      #expect(object?["type"] as? String == "task.runFailed")
    }
    let window = try ferry(["log", demo.path, "--from", "5", "--to", "7"])
    #expect(window.stdout.split(separator: "\n").map { $0.prefix(1) } == ["5", "6", "7"])
    let byKey = try ferry(["log", demo.path, "--key", "store-hours"])
    #expect(byKey.stdout.split(separator: "\n").count == 1)

    let past = try ferry(["replay", demo.path, "--until", "4", "--json"])
    #expect(past.status == 0)
    let report = try JSONDecoder().decode(InspectReport.self, from: Data(past.stdout.utf8))
    #expect(report.head == 4)
    #expect(report.tasks.map(\.id) == [1, 2, 3, 4])
    let equal = try ferry(["replay", demo.path])
    #expect(equal.status == 0)
    #expect(equal.stdout.contains("equal the rebuild"))
    let beyond = try ferry(["replay", demo.path, "--until", "999"])
    #expect(beyond.status == ExitStatus.badInput.rawValue)
  }

  @Test func replayAndVerifyCatchAPlantedDivergence() async throws {
    let demo = DemoStore()
    defer { demo.remove() }
    _ = try await runDemo(path: demo.path, seed: 7, output: Output(line: { _ in }))
    try await settleFlushed(demo.path)
    let env = try Environment.open(path: demo.path, databases: ["p:taskQueue:ready"])
    try env.write {
      try $0.put(try env.database("p:taskQueue:ready"), key: UInt64(999).bigEndianBytes, value: [])
    }
    env.close()
    let replayed = try ferry(["replay", demo.path])
    #expect(replayed.status == ExitStatus.problemsFound.rawValue)
    #expect(replayed.stdout.contains("differ"))
    #expect(replayed.stdout.contains("ready"))
    let verified = try ferry(["verify", demo.path])
    #expect(verified.status == ExitStatus.problemsFound.rawValue)
  }

  @Test func verifyNamesTheFirstBadSequenceAfterAFlippedByte() async throws {
    let demo = DemoStore()
    defer { demo.remove() }
    _ = try await runDemo(path: demo.path, seed: 7, output: Output(line: { _ in }))
    var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: demo.path + "/data.mdb")))
    // Only task 9's payload holds this JSON; LMDB may keep stale copies of its page among the free
    // pages, so every occurrence is damaged, the live one with them.
    let needle = Array(#"{"name":"extra virgin"#.utf8)
    let offsets = (0...(bytes.count - needle.count)).filter {
      Array(bytes[$0..<($0 + needle.count)]) == needle
    }
    #expect(!offsets.isEmpty)
    for offset in offsets { bytes[offset + 12] ^= 0x20 }
    try Data(bytes).write(to: URL(fileURLWithPath: demo.path + "/data.mdb"))
    let verified = try ferry(["verify", demo.path])
    // A damaged record is exit 6 in every command, verify too (1 is for projections that differ).
    #expect(verified.status == ExitStatus.corruptRecord.rawValue)
    #expect(verified.stdout.contains("first bad sequence number: 9"))
    #expect(verified.stderr.contains("record 9"))
    let logged = try ferry(["log", demo.path])
    #expect(logged.status == ExitStatus.corruptRecord.rawValue)
    #expect(logged.stderr.contains("sequence 9"))
  }

  @Test func exportThenImportReproducesAnEqualStore() async throws {
    let demo = DemoStore()
    let copy = DemoStore()
    defer {
      demo.remove()
      copy.remove()
    }
    _ = try await runDemo(path: demo.path, seed: 7, output: Output(line: { _ in }))
    let exported = try ferry(["export", demo.path])
    #expect(exported.status == 0)
    #expect(exported.stdout.hasPrefix("{\"events\":33,\"format\":\"ferry-export\""))
    let imported = try ferry(["import", copy.path], input: exported.stdout)
    #expect(imported.status == 0)
    #expect(imported.stdout.contains("imported 33 events"))
    #expect(try ferry(["verify", copy.path]).status == 0)
    #expect(try ferry(["export", copy.path]).stdout == exported.stdout)
    let again = try ferry(["import", copy.path], input: exported.stdout)
    #expect(again.status == ExitStatus.badInput.rawValue)
    let garbage = DemoStore()
    defer { garbage.remove() }
    #expect(try ferry(["import", garbage.path], input: "not json\n").status == ExitStatus.badInput.rawValue)
  }

  @Test func statsCountsEventsByType() async throws {
    let demo = DemoStore()
    defer { demo.remove() }
    _ = try await runDemo(path: demo.path, seed: 7, output: Output(line: { _ in }))
    let result = try ferry(["stats", demo.path])
    #expect(result.status == 0)
    #expect(result.stdout.contains("events: 33"))
    #expect(result.stdout.contains("task.added"))
    #expect(result.stdout.contains("map: "))
  }

  @Test func compactShrinksTheStoreAndReplaySaysWhatWasCompacted() async throws {
    let demo = DemoStore()
    defer { demo.remove() }
    _ = try await runDemo(path: demo.path, seed: 7, output: Output(line: { _ in }))
    let before = try JSONDecoder().decode(
      InspectReport.self, from: Data(try ferry(["inspect", demo.path, "--json"]).stdout.utf8))
    let compacted = try ferry(["compact", demo.path, "--retention", "0", "--copy"])
    #expect(compacted.status == 0)
    #expect(compacted.stdout.contains("removed 30 events"))
    // Regression: stats printed the head as the event count and lost its "oldest event" line.
    let stats = try ferry(["stats", demo.path])
    #expect(stats.stdout.contains("events: 3 (head 33)"), "\(stats.stdout)")
    #expect(stats.stdout.contains("compacted through 33: 30 events removed in all"))
    #expect(stats.stdout.contains("oldest event: "))
    #expect(compacted.stdout.contains("compacted copy swapped in"))
    #expect(try ferry(["verify", demo.path]).status == 0)
    let after = try JSONDecoder().decode(
      InspectReport.self, from: Data(try ferry(["inspect", demo.path, "--json"]).stdout.utf8))
    #expect(after.tasks == before.tasks)
    #expect(after.caches.map(\.key) == before.caches.map(\.key))
    let past = try ferry(["replay", demo.path, "--until", "3"])
    #expect(past.status == ExitStatus.badInput.rawValue)
    #expect(past.stderr.contains("compacted"))

    // --copy refuses while another process has the store open.
    let store = try await FerryStore.open(at: demo.path)
    defer { store.close() }
    let refused = try ferry(["compact", demo.path, "--copy"])
    #expect(refused.status == ExitStatus.unavailable.rawValue)
  }

  @Test func eachFailureHasItsOwnExitStatusAndOneLine() async throws {
    let missing = DemoStore()
    let noSuch = try ferry(["inspect", missing.path])
    #expect(noSuch.status == ExitStatus.noSuchStore.rawValue)
    #expect(noSuch.stderr.split(separator: "\n").count == 1)

    let notStore = DemoStore()
    defer { notStore.remove() }
    try FileManager.default.createDirectory(atPath: notStore.path, withIntermediateDirectories: true)
    #expect(FileManager.default.createFile(atPath: notStore.path + "/notes.txt", contents: Data("hi".utf8)))
    #expect(try ferry(["verify", notStore.path]).status == ExitStatus.notAStore.rawValue)

    let newer = DemoStore()
    defer { newer.remove() }
    _ = try await runDemo(path: newer.path, seed: 1, output: Output(line: { _ in }))
    try await settleFlushed(newer.path)
    let env = try Environment.open(path: newer.path, databases: ["meta"])
    try env.write {
      try $0.put(try env.database("meta"), key: Array("format".utf8), value: UInt32(9).bigEndianBytes)
    }
    env.close()
    let refused = try ferry(["stats", newer.path])
    #expect(refused.status == ExitStatus.newerFormat.rawValue)
    #expect(refused.stderr.contains("newer"))

    let badFlags = try ferry(["inspect", "--max-age", "-5", missing.path])
    #expect(badFlags.status == ExitStatus.badFlags.rawValue)
    #expect(
      try ferry(["log", missing.path, "--from", "9", "--to", "2"]).status == ExitStatus.badFlags.rawValue)
    let help = try ferry(["replay", "--help"])
    #expect(help.stdout.contains("Example: ferry replay"))
  }

  @Test func logFollowPrintsEventsAsAnotherProcessAppendsThem() async throws {
    let demo = DemoStore()
    defer { demo.remove() }
    let store = try await FerryStore.open(at: demo.path)
    defer { store.close() }
    try await store.queue.add(tag: "before", payload: ["n": 0])
    let process = Process()
    process.executableURL = productURL("ferry")
    process.arguments = ["log", demo.path, "--follow"]
    let out = Pipe()
    process.standardOutput = out
    try process.run()
    defer { if process.isRunning { process.terminate() } }
    var seen = ""
    func readUntil(_ text: String) {
      // Ends at the text or the end of the output; the deadline is only a hang guard.
      let deadline = Date().addingTimeInterval(600)
      while !seen.contains(text) && Date() < deadline {
        let data = out.fileHandleForReading.availableData
        if data.isEmpty { break }
        seen += String(decoding: data, as: UTF8.self)
      }
    }
    readUntil("tag before")
    #expect(seen.contains("task 1 added: tag before"))
    try await store.queue.add(tag: "after", payload: ["n": 1])
    readUntil("tag after")
    #expect(seen.contains("task 2 added: tag after"))
  }

  @Test func readOnlyCommandsWorkWhileAnotherProcessWrites() async throws {
    let demo = DemoStore()
    defer { demo.remove() }
    let store = try await FerryStore.open(at: demo.path)
    defer { store.close() }
    try await store.queue.add(tag: "t", payload: ["n": 1])
    let before = try ferry(["inspect", demo.path, "--json"])
    #expect(before.status == 0)
    try await store.queue.add(tag: "t", payload: ["n": 2])
    let after = try ferry(["inspect", demo.path, "--json"])
    let report = try JSONDecoder().decode(InspectReport.self, from: Data(after.stdout.utf8))
    #expect(report.totals.tasks == 2)
    try await store.queue.add(tag: "t", payload: ["n": 3])  // the writer is not disturbed
    #expect(try store.queue.pendingTasks().count == 3)
  }
}

/// Turns the store's write-ahead segment off (an open alone asking for flushed commits), before a
/// test edits `data.mdb` with raw LMDB writes: a store with a segment takes those for commits
/// after its checkpoint and undoes them (`Specs/one-sync-commit.md` §5).
func settleFlushed(_ path: String) async throws {
  var configuration = FerryStore.Configuration()
  configuration.writeAheadSegment = false
  try await FerryStore.open(at: path, configuration: configuration).close()
}
