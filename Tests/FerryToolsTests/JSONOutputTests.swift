import Ferry
import FerryLog
import FerryTools
import Foundation
import TestSupport
import Testing

/// A tag and a message that try to forge a line and drive the terminal.
let hostileTag = "evil\u{1B}[2J\ntag\u{202E}"
let hostileMessage = "bad\r\nnews\u{07}"

/// A store holding tasks with hostile strings: one blocked by an error, one dead.
func hostileStore() async throws -> DemoStore {
  let demo = DemoStore()
  let store = try await FerryStore.open(at: demo.path)
  let blocked = try await store.queue.add(
    tag: hostileTag, payload: ["note": "milk\u{1B}]0;title\u{07}"], options: [.manual])
  let runner = TaskRunner(queue: store.queue)
  runner.register(tag: hostileTag) { _ in .recordError(hostileMessage) }
  _ = try await runner.run(.task(blocked))
  try await store.ledger.recordFetch(key: "lists\u{1B}[31m", outcome: .success(isEmpty: false))
  store.close()
  return demo
}

/// No byte of `text` may be a terminal control (C0 other than the line ends between lines, DEL).
func expectNoControls(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) {
  let bad = text.unicodeScalars.filter {
    ($0.value < 0x20 && $0 != "\n") || (0x7F...0x9F).contains($0.value) || $0 == "\u{202E}"
  }
  #expect(
    bad.isEmpty, "control characters in output: \(bad.map { String($0.value, radix: 16) })",
    sourceLocation: sourceLocation)
}

@Suite(.timeLimit(.minutes(20)), .serialized) struct JSONOutputTests {
  @Test func verifyStatsCompactAndImportPrintJSONThatParsesBack() async throws {
    let demo = try await hostileStore()
    defer { demo.remove() }

    let verify = try ferry(["verify", demo.path, "--json"])
    #expect(verify.status == 0, "\(verify.stderr)")
    let verified = try JSONDecoder().decode(VerifyJSON.self, from: Data(verify.stdout.utf8))
    #expect(verified.healthy)
    #expect(verified.problems.isEmpty)
    #expect(verified.head > 0)
    #expect(verified.recordsChecked == Int(verified.head))
    #expect(verify.stdout.split(separator: "\n").count == 1)
    #expect(verify.stderr.isEmpty)  // no progress bar in a pipe

    let stats = try ferry(["stats", demo.path, "--json"])
    #expect(stats.status == 0, "\(stats.stderr)")
    let counted = try JSONDecoder().decode(StatsJSON.self, from: Data(stats.stdout.utf8))
    #expect(counted.events == Int(verified.head))
    #expect(counted.types["task.added"] == 1)
    #expect(counted.types["task.errorRecorded"] == 1)
    #expect(counted.types["cache.fetched"] == 1)
    #expect(counted.oldest?.seq == 1)
    #expect(counted.newest?.seq == verified.head)
    #expect(counted.dataFileBytes > 0)

    // The whole log exported, imported into a new store, with JSON.
    let exported = try ferry(["export", demo.path])
    #expect(exported.status == 0)
    let copy = DemoStore()
    defer { copy.remove() }
    let imported = try ferry(["import", copy.path, "--json"], input: exported.stdout)
    #expect(imported.status == 0, "\(imported.stderr)")
    let importReport = try JSONDecoder().decode(ImportJSON.self, from: Data(imported.stdout.utf8))
    #expect(importReport.imported == Int(verified.head))
    #expect(importReport.store == copy.path)

    let compact = try ferry(["compact", demo.path, "--retention", "0", "--json"])
    #expect(compact.status == 0, "\(compact.stderr)")
    let compacted = try JSONDecoder().decode(CompactJSON.self, from: Data(compact.stdout.utf8))
    #expect(compacted.copied == false)
    #expect(compacted.snapshotSequence >= verified.head)
    #expect(compacted.dataFileBytesAfter == compacted.dataFileBytesBefore)
  }

  @Test func hostileStringsAreEscapedInHumanAndJSONOutput() async throws {
    let demo = try await hostileStore()
    defer { demo.remove() }
    for arguments in [
      ["inspect", demo.path], ["inspect", demo.path, "--json"], ["log", demo.path],
      ["log", demo.path, "--json"],
      ["export", demo.path], ["stats", demo.path], ["stats", demo.path, "--json"],
      ["verify", demo.path, "--json"],
    ] {
      let run = try ferry(arguments)
      #expect(run.status == 0, "\(arguments): \(run.stderr)")
      expectNoControls(run.stdout)
    }
    // The JSON reads back as the very strings stored.
    let inspect = try JSONDecoder().decode(
      InspectReport.self, from: Data(try ferry(["inspect", demo.path, "--json"]).stdout.utf8))
    #expect(inspect.tasks.first?.tag == hostileTag)
    #expect(inspect.errors.first?.message == hostileMessage)
    #expect(inspect.caches.first?.key == "lists\u{1B}[31m")
    // The human table shows the escapes, on one line each.
    let table = try ferry(["inspect", demo.path]).stdout
    #expect(table.contains(#"evil\u001B[2J\ntag\u202E"#))
  }

  @Test func exportAndLogShowPayloadsDecodedAndLogFollowsAReplacement() async throws {
    let demo = DemoStore()
    defer { demo.remove() }
    let store = try await FerryStore.open(at: demo.path)
    let first = try await store.queue.add(
      tag: "save", payload: ["item": "milk\u{1B}[1m", "size": "2l"], dataId: "note-1",
      options: [.unique(.replace)])
    let second = try await store.queue.add(
      tag: "save", payload: ["item": "oat milk", "size": "1l"], dataId: "note-1", options: [.unique(.replace)]
    )
    let other = try await store.queue.add(
      tag: "save", payload: [1, 2, 3], dataId: "note-2", options: [.unique(.replace)])
    store.close()

    struct Exported: Decodable {
      let seq: UInt64
      let type: String
      let payload: String
      let payloadJSON: JSONValue?
    }
    let export = try ferry(["export", demo.path])
    #expect(export.status == 0)
    expectNoControls(export.stdout)
    let events = try export.stdout.split(separator: "\n").dropFirst().map {
      try JSONDecoder().decode(Exported.self, from: Data($0.utf8))
    }
    #expect(events.count == 3)
    #expect(events[0].payloadJSON == .object(["item": .string("milk\u{1B}[1m"), "size": .string("2l")]))
    #expect(events[2].payloadJSON == .array([.integer(1), .integer(2), .integer(3)]))
    #expect(events.allSatisfy { Data(base64Encoded: $0.payload) != nil })
    // The bytes are still what import reads: the round trip gives the same export.
    let copy = DemoStore()
    defer { copy.remove() }
    #expect(try ferry(["import", copy.path], input: export.stdout).status == 0)
    #expect(try ferry(["export", copy.path]).stdout == export.stdout)

    // `log --task` of the replaced task shows the add that replaced it.
    let human = try ferry(["log", demo.path, "--task", String(first)])
    #expect(human.status == 0)
    let lines = human.stdout.split(separator: "\n")
    #expect(lines.count == 2)
    #expect(lines.last?.contains("task \(second) added") == true)
    #expect(lines.last?.contains("(replaces task \(first)") == true)
    #expect(human.stdout.contains(#""item":"oat milk""#))
    let json = try ferry(["log", demo.path, "--task", String(first), "--json"])
    let logged = try json.stdout.split(separator: "\n").map {
      try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] ?? [:]
    }
    #expect(logged.count == 2)
    #expect(logged.last?["replaces"] as? Int == Int(first.rawValue))
    #expect((logged.last?["payloadJSON"] as? [String: Any])?["item"] as? String == "oat milk")
    #expect(
      try ferry(["log", demo.path, "--task", other.description]).stdout.split(separator: "\n").count == 1)
  }
}

/// A projection another version of the app added (one `ferry` does not configure), left behind
/// by appends of this version: `ferry compact` removes nothing, and says why — in its line and
/// in `--json` — rather than reporting "removed 0" and leaving an operator to guess why the log
/// never shrinks.
@Suite(.timeLimit(.minutes(20)), .serialized) struct CompactHeldBackTests {
  /// Counts every event (a stand-in for a projection a later app version added).
  struct Tally: Projection {
    let name = "tally"
    let version: UInt32 = 1
    let tables = ["count"]
    func apply(_ event: LoggedEvent, to tables: ProjectionTables) throws {
      let now =
        try tables.value("count", key: [0]) { bytes in bytes.reduce(UInt64(0)) { $0 << 8 | UInt64($1) } } ?? 0
      try tables.put("count", key: [0], value: withUnsafeBytes(of: (now + 1).bigEndian, Array.init))
    }
  }

  @Test func aCompactionHeldBackByAProjectionOfAnotherVersionSaysWhich() async throws {
    let store = DemoStore()
    defer { store.remove() }
    let app = try await FerryStore.open(at: store.path)
    let first = try await app.queue.add(tag: "t", payload: ["n": 1])
    app.close()
    // Another version of the app opens the store with a projection of its own (folded to the head).
    let other = try EventLog.open(
      at: store.path, configuration: EventLog.Configuration(projections: [Tally()]))
    other.close()
    // This version runs and finishes tasks: the other version's projection is left behind.
    let again = try await FerryStore.open(at: store.path)
    let runner = TaskRunner(queue: again.queue)
    runner.register(tag: "t") { _ in .succeeded }
    _ = try await again.queue.add(tag: "t", payload: ["n": 2])
    _ = try await runner.run()
    #expect(try again.queue.task(first) == nil)
    again.close()

    let human = try ferry(["compact", store.path, "--retention", "0"])
    #expect(human.status == 0, "\(human.stderr)")
    #expect(human.stdout.contains("removed 0 events"), "\(human.stdout)")
    #expect(
      human.stdout.contains("nothing was removed: a projection another version of the app keeps"),
      "\(human.stdout)")
    #expect(human.stdout.contains("tally (version 1, at "), "\(human.stdout)")
    let json = try ferry(["compact", store.path, "--retention", "0", "--json"])
    #expect(json.status == 0, "\(json.stderr)")
    let report = try JSONDecoder().decode(CompactJSON.self, from: Data(json.stdout.utf8))
    #expect(report.removed == 0)
    #expect(
      report.heldBackBy.count == 1 && report.heldBackBy[0].hasPrefix("tally (version 1, at "), "\(report)")
    #expect(report.heldBackBy[0].hasSuffix("not configured here)"), "\(report)")
  }
}

/// `ferry log --task N` tells data ids apart by their bytes, as the queue does: an add with
/// `replace` whose data id is another spelling of N's ("cafe\u{301}" for "caf\u{E9}") leaves N
/// queued, and the log must not show it as N's replacement (it did while it compared `String`s).
@Suite(.timeLimit(.minutes(20))) struct LogReplacementSpellingTests {
  @Test func anAddWithAnotherSpellingOfTheDataIdIsNotShownAsTheReplacement() async throws {
    let store = DemoStore()
    defer { store.remove() }
    let app = try await FerryStore.open(at: store.path)
    let first = try await app.queue.add(
      tag: "t", payload: ["v": 1], dataId: "caf\u{E9}", options: [.unique(.replace)])
    let second = try await app.queue.add(
      tag: "t", payload: ["v": 2], dataId: "cafe\u{301}", options: [.unique(.replace)])
    let third = try await app.queue.add(
      tag: "t", payload: ["v": 3], dataId: "caf\u{E9}", options: [.unique(.replace)])
    #expect(try app.queue.task(first) == nil, "the same spelling replaces")
    #expect(try app.queue.task(second) != nil, "another spelling is another data id")
    app.close()
    let lines = try ferry(["log", store.path, "--task", String(first)]).stdout.split(separator: "\n")
    let replacing = lines.filter { $0.contains("(replaces task \(first)") }
    #expect(replacing.count == 1 && replacing[0].contains("task \(third) added"), "\(lines)")
    let other = try ferry(["log", store.path, "--task", String(second)]).stdout
    #expect(!other.contains("replaces task"), "\(other)")
  }
}
