import FerryLog
import Foundation
import TestSupport
import Testing

@_spi(Engine) @_spi(Experimental) @testable import Ferry

/// The writer's poll (`FerryStore.Configuration.writerSpin`) attacked at the store's level, with
/// real processes on one store with a write-ahead segment: two processes adding in serial loops
/// (both writers polling) beside `ferry verify`, `ferry compact`, `ferry stats` and read-only
/// readers; and serial runner passes in two processes while a third adds. What was kept is read
/// from the log's events.
@Suite(.timeLimit(.minutes(20))) struct WriterSpinStoreTests {
  static func freshPath() -> String {
    FileManager.default.temporaryDirectory.path + "/ferry-spin-\(UUID().uuidString.prefix(8))"
  }

  /// The store with the write-ahead segment and a poll window of 2 ms (polls after waits under
  /// 8 ms, even on a machine loaded by a whole test run).
  static func openPolling(_ path: String) async throws -> FerryStore {
    var configuration = FerryStore.Configuration()
    configuration.writeAheadSegment = true
    configuration.writerSpin = .milliseconds(2)
    return try await FerryStore.open(at: path, configuration: configuration)
  }

  /// The data id of every `task.added` in the log, with the sequences that added it.
  static func addedByDataId(_ log: EventLog) throws -> [String: [TaskID]] {
    var added: [String: [TaskID]] = [:]
    try log.forEachEvent { event in
      guard event.type == "task.added" else { return }
      guard case .added(_, _, let dataId, _, _, _, _, _, _) = try TaskEvent(event) else { return }
      added[dataId ?? "", default: []].append(TaskID(rawValue: event.sequence))
    }
    return added
  }

  @Test func twoPollingWritersBesideVerifyCompactAndReadersLoseAndRepeatNothing() async throws {
    let path = Self.freshPath()
    defer { try? FileManager.default.removeItem(atPath: path) }
    let store = try await Self.openPolling(path)
    defer { store.close() }
    let count = 1_000
    let adder = try Child("ferry-test-worker", ["spin-add-tasks", path, "\(count)", "c"])
    // Operators' commands from other processes, all at once, twice while both processes add.
    var tools: [Child] = []
    func launchTools() throws {
      tools += [
        try Child("ferry", ["verify", path]), try Child("ferry", ["compact", path]),
        try Child("ferry", ["stats", path]), try Child("ferry-test-worker", ["log-head", path]),
      ]
    }
    var mine: [String: TaskID] = [:]
    for i in 0..<count {
      if i == 0 || i == count / 2 { try launchTools() }
      mine["p-\(i)"] = try await store.queue.add(tag: "job", payload: ["kind": "ok"], dataId: "p-\(i)")
    }
    let stillRunning = tools.filter { $0.process.isRunning }.count
    #expect(try await adder.wait() == 0)
    var statuses: [Int32] = []
    for tool in tools { statuses.append(try await tool.wait()) }
    #expect(statuses == [Int32](repeating: 0, count: 8), "\(tools.map { $0.output.suffix(2) })")
    print("WriterSpinStoreAttack tools: \(stillRunning) of 8 still running when this process's adds ended")
    var theirs: [String: TaskID] = [:]
    for line in adder.output where line.hasPrefix("ack ") {
      let fields = line.split(separator: " ")
      guard fields.count == 3, let id = TaskID(fields[1]) else { continue }
      theirs["c-\(fields[2])"] = id
    }
    #expect(theirs.count == count)

    let added = try Self.addedByDataId(store.log)
    #expect(added.count == 2 * count)
    for (dataId, id) in mine.merging(theirs, uniquingKeysWith: { first, _ in first }) {
      #expect(added[dataId] == [id], "\(dataId): acknowledged as \(id), logged at \(added[dataId] ?? [])")
    }
    #expect(try store.queue.pendingTasks().count == 2 * count)
    #expect(try store.log.verify().isHealthy)
    // That both writers polled (not what was kept).
    #expect(store.log.statistics.writerSpins > 0)
    let spinsLine = adder.output.first { $0.hasPrefix("spins ") } ?? ""
    #expect(!spinsLine.hasPrefix("spins 0 "), "\(spinsLine)")
  }

  /// Serial runner passes (one task at a time: a finish and the next claim, the commits the poll
  /// is for) in this process and in another, while a third process adds tasks one by one: every
  /// task ran exactly once and succeeded once, by the log's events.
  @Test func serialRunnersInTwoProcessesWhileAThirdAddsRunEachTaskOnce() async throws {
    let path = Self.freshPath()
    defer { try? FileManager.default.removeItem(atPath: path) }
    let store = try await Self.openPolling(path)
    defer { store.close() }
    let count = 150
    var ids: [TaskID] = []
    for i in 0..<count {
      ids.append(try await store.queue.add(tag: "job", payload: ["kind": "ok"], dataId: "early-\(i)"))
    }
    let input = Pipe()
    let otherRunner = try Child(
      "ferry-test-worker", ["spin-run-tasks", path], stdin: input.fileHandleForReading)
    let adder = try Child("ferry-test-worker", ["spin-add-tasks", path, "\(count)", "late"])

    let runner = TaskRunner(queue: store.queue)
    runner.register(tag: "job") { _ in .succeeded }
    var idle = 0
    while idle < 3 {
      let report = try await runner.run()
      let ran = report.entries.contains { entry in
        if case .skipped = entry.outcome { return false } else { return true }
      }
      if ran || adder.process.isRunning {
        idle = 0
        if !ran { try await Task.sleep(for: .milliseconds(2)) }
      } else {
        idle += 1
      }
    }
    #expect(try await adder.wait() == 0)
    input.fileHandleForWriting.write(Data("stop\n".utf8))
    #expect(try await otherRunner.wait() == 0)
    // Anything the other runner left (none expected): one more serial pass here.
    _ = try await runner.run()
    ids += adder.acknowledgedIds
    #expect(ids.count == 2 * count)

    let ledger = try RunLedger(store.log)
    ledger.expectEachTaskRanOnce(ids)
    for id in ids {
      #expect(
        ledger.tasks[id]?.successes == 1,
        "task \(id): \(ledger.tasks[id].map { "\($0)" } ?? "not in the log")")
      #expect(ledger.tasks[id]?.starts.count == 1, "task \(id)")
    }
    #expect(ledger.tasks.count == 2 * count)
    let ranThere = otherRunner.output.filter { $0.hasPrefix("ran ") }.count
    print(
      "WriterSpinStoreAttack runners: \(ranThere) of \(2 * count) ran in the other process; spins here \(store.log.statistics.writerSpins), there: \(otherRunner.output.first { $0.hasPrefix("spins ") } ?? "?")"
    )
    #expect(store.log.statistics.writerSpins > 0)
  }
}
