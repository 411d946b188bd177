@_spi(Engine) import Ferry
import FerryLog
import FerryTools
import Foundation
import TestSupport
import Testing

/// `ferry log --json` lines, parsed back.
struct LoggedLine: Decodable, Equatable {
  let seq: UInt64
  let type: String
  let taskId: TaskID?
  let key: String?
}

/// `ferry cancel|revive|resolve|forget|pause|resume --json`, parsed back.
struct OperatorJSONReport: Decodable {
  struct Refusal: Decodable {
    let id: TaskID
    let reason: String
  }
  let command: String
  let changed: [TaskID]
  let running: [TaskID]
  let refused: [Refusal]
  let key: String?
  let hadRecord: Bool?
  let paused: Bool?
  let stateChanged: Bool?
  let runsUnderWay: Int?
}

/// A store a second process works on: a worker (`ferry-test-worker run-and-hang`) holds a run of
/// task `hang` (group "list") for as long as the test lives, while the test adds its own tasks.
struct WorkedStore {
  let store = DemoStore()
  let worker: Child
  let hang: TaskID

  init() async throws {
    worker = try Child("ferry-test-worker", ["run-and-hang", store.path])
    guard worker.waitForOutput("\n") else { throw ToolError(.storageError, "the worker ended early") }
    let line = String(decoding: worker.seenOutput, as: UTF8.self).split(separator: "\n").first ?? ""
    guard line.hasPrefix("running "), let id = TaskID(String(line.dropFirst("running ".count))) else {
      worker.killAbruptly()
      throw ToolError(.storageError, "the worker said '\(line)'")
    }
    hang = id
  }

  func finish() {
    worker.killAbruptly()
    _ = worker.finish()
    store.remove()
  }

  /// The events appended after `sequence`, as `ferry log --json` shows them.
  func events(after sequence: UInt64) throws -> [LoggedLine] {
    let run = try ferry(["log", store.path, "--from", String(sequence + 1), "--json"])
    #expect(run.status == 0, "\(run.stderr)")
    return try run.stdout.split(separator: "\n").map {
      try JSONDecoder().decode(LoggedLine.self, from: Data($0.utf8))
    }
  }

  func head() throws -> UInt64 {
    let store = try FerryStore.openReadOnly(at: self.store.path)
    defer { store.close() }
    return try store.log.head()
  }
}

func decodeReport(_ run: CommandResult) throws -> OperatorJSONReport {
  try JSONDecoder().decode(OperatorJSONReport.self, from: Data(run.stdout.utf8))
}

@Suite(.timeLimit(.minutes(20)), .serialized) struct OperatorCommandTests {
  @Test func operatorCommandsAppendTheLibrarysEventsAndNeverTouchAnotherProcesssRun() async throws {
    let worked = try await WorkedStore()
    defer { worked.finish() }
    let path = worked.store.path

    // The test's own tasks, added while the worker's run is under way.
    let store = try await FerryStore.open(at: path)
    let behind = try await store.queue.add(tag: "job", payload: ["n": 1], groupId: "list")
    let loose = try await store.queue.add(tag: "job", payload: ["n": 2])
    let doomed = try await store.queue.add(tag: "die", payload: ["n": 3], options: [.manual])
    let blocked = try await store.queue.add(tag: "err", payload: ["n": 4], options: [.manual])
    let runner = TaskRunner(queue: store.queue)
    runner.register(tag: "die") { _ in .failed("refused", retryable: false) }
    runner.register(tag: "err") { _ in .recordError("fix it") }
    _ = try await runner.run(.task(doomed))
    _ = try await runner.run(.task(blocked))
    try await store.ledger.recordFetch(key: "lists", outcome: .success(isEmpty: false))
    #expect(try store.queue.task(worked.hang)?.status == .running)
    store.close()
    let start = try worked.head()

    // Cancel of the task the worker runs: refused, status 10, nothing appended.
    let refused = try ferry(["cancel", path, String(worked.hang)])
    #expect(refused.status == 10)
    #expect(refused.stdout.contains("run under way"))
    #expect(refused.stdout.contains("nothing was changed"))
    #expect(try worked.head() == start)

    // Its group: the task behind it goes, the running head stays (status 10 names it).
    let group = try ferry(["cancel", path, "--group", "list", "--json"])
    #expect(group.status == 10)
    let groupReport = try decodeReport(group)
    #expect(groupReport.command == "cancel")
    #expect(groupReport.changed == [behind])
    #expect(groupReport.running == [worked.hang])

    // By id, one queued and one unknown: the queued one goes, the other is refused (status 11).
    let byId = try ferry(["cancel", path, String(loose), "999", "--json"])
    #expect(byId.status == 11)
    let byIdReport = try decodeReport(byId)
    #expect(byIdReport.changed == [loose])
    #expect(byIdReport.refused.map(\.id) == [999])

    // By tag with nothing left of it.
    let none = try ferry(["cancel", path, "--tag", "job"])
    #expect(none.status == 0)
    #expect(none.stdout.contains("no task matched"))

    // Revive: the dead task, then one that is not dead.
    #expect(try ferry(["revive", path, String(doomed)]).status == 0)
    let notDead = try ferry(["revive", path, String(blocked), "--json"])
    #expect(notDead.status == 11)
    #expect(try decodeReport(notDead).refused.first?.reason.contains("not dead") == true)

    // Resolve: the blocked task; the worker's running task has no error (11), not a crash.
    let resolved = try ferry(["resolve", path, String(blocked), "--json"])
    #expect(resolved.status == 0)
    #expect(try decodeReport(resolved).changed == [blocked])
    #expect(try ferry(["resolve", path, String(blocked)]).status == 11)

    // Forget a cache key.
    let forgot = try ferry(["forget", path, "lists", "--json"])
    #expect(forgot.status == 0)
    let forgotReport = try decodeReport(forgot)
    #expect(forgotReport.key == "lists")
    #expect(forgotReport.hadRecord == true)

    // Pause twice (the second appends nothing), then resume.
    let paused = try ferry(["pause", path, "--json"])
    #expect(paused.status == 0)
    let pausedReport = try decodeReport(paused)
    #expect(pausedReport.paused == true)
    #expect(pausedReport.stateChanged == true)
    #expect(pausedReport.runsUnderWay == 1)
    let again = try ferry(["pause", path])
    #expect(again.status == 0)
    #expect(again.stdout.contains("paused: yes (it was already; nothing was appended)"))
    #expect(again.stdout.contains("1 run under way goes on"))
    let resumed = try ferry(["resume", path])
    #expect(resumed.status == 0)
    #expect(resumed.stdout.contains("paused: no"))

    // Exactly the events the library appends, and none about the worker's run.
    let events = try worked.events(after: start)
    #expect(
      events.map(\.type) == [
        "task.cancelled", "task.cancelled", "task.revived", "task.errorResolved", "cache.forgotten",
        "queue.paused",
        "queue.resumed",
      ])
    #expect(events.map(\.taskId) == [behind, loose, doomed, blocked, nil, nil, nil])
    #expect(events[4].key == "lists")

    // The worker's run is still under way and still its own.
    let after = try FerryStore.openReadOnly(at: path)
    defer { after.close() }
    #expect(try after.queue.task(worked.hang)?.status == .running)
    #expect(worked.worker.process.isRunning)
  }

  @Test func operatorCommandsRefuseClearly() async throws {
    let missing = DemoStore()
    let run = try ferry(["cancel", missing.path, "1"])
    #expect(run.status == 3)
    #expect(run.stderr.contains("no store"))
    #expect(try ferry(["cancel", missing.path]).status == 64)
    #expect(try ferry(["cancel", missing.path, "1", "--tag", "x"]).status == 64)
    #expect(try ferry(["revive", missing.path, "x"]).status == 64)
  }

  @Test func operatorOutputEscapesControlCharacters() async throws {
    let demo = DemoStore()
    defer { demo.remove() }
    let store = try await FerryStore.open(at: demo.path)
    try await store.ledger.recordFetch(key: "evil\u{1B}[31m\nkey", outcome: .success(isEmpty: false))
    store.close()
    let human = try ferry(["forget", demo.path, "evil\u{1B}[31m\nkey"])
    #expect(human.status == 0)
    #expect(!human.stdout.contains("\u{1B}"))
    #expect(human.stdout.contains(#"evil\u001B[31m\nkey"#))
    #expect(human.stdout.split(separator: "\n").count == 1)
    let json = try ferry(["forget", demo.path, "evil\u{1B}[31m\nkey", "--json"])
    #expect(!json.stdout.contains("\u{1B}"))
    #expect(try decodeReport(json).key == "evil\u{1B}[31m\nkey")
  }
}

/// `ferry revive|resolve --tag|--group|--all` beside another process's run.
@Suite(.timeLimit(.minutes(20)), .serialized) struct BulkOperatorCommandTests {
  @Test func bulkReviveAndResolveChangeEveryMatchingTaskAndNeverAnotherProcesssRun() async throws {
    let worked = try await WorkedStore()
    defer { worked.finish() }
    let path = worked.store.path
    let store = try await FerryStore.open(at: path)
    var dead: [TaskID] = []
    var blocked: [TaskID] = []
    for n in 0..<3 {
      dead.append(try await store.queue.add(tag: "die", payload: ["n": n], options: [.manual]))
    }
    for n in 0..<2 {
      blocked.append(try await store.queue.add(tag: "err", payload: ["n": n], options: [.manual]))
    }
    let runner = TaskRunner(queue: store.queue)
    runner.register(tag: "die") { _ in .failed("refused", retryable: false) }
    runner.register(tag: "err") { _ in .recordError("fix it") }
    for id in dead + blocked { _ = try await runner.run(.task(id)) }
    store.close()

    let usage = try ferry(["revive", path, "--tag", "die", "--all"])
    #expect(usage.status != 0)
    let byTag = try ferry(["revive", path, "--tag", "die", "--json"])
    #expect(byTag.status == 0, "\(byTag.stderr)")
    #expect(try decodeReport(byTag).changed == dead)
    #expect(try decodeReport(ferry(["revive", path, "--all", "--json"])).changed.isEmpty)
    let resolved = try ferry(["resolve", path, "--all", "--json"])
    #expect(resolved.status == 0, "\(resolved.stderr)")
    #expect(try decodeReport(resolved).changed == blocked)
    #expect(try worked.events(after: 0).filter { $0.type == "task.revived" }.map(\.taskId) == dead)
    let reopened = try FerryStore.openReadOnly(at: path)
    defer { reopened.close() }
    #expect(try reopened.queue.task(worked.hang)?.status == .running)
  }
}
