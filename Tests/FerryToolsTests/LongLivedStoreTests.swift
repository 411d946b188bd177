@_spi(Engine) @_spi(Experimental) import Ferry
import FerryLog
import FerryTesting
import FerryTools
import Foundation
import Synchronization
import TestSupport
import Testing

/// A store that lives for months in an app: cycle after cycle of adds, runs, failures, recorded
/// errors, cache fetches and compactions (in place, and `--copy` between sessions), reopened now
/// and then, with and without the write-ahead segment. The live data is bounded, so the log and the
/// files must be too, and every check (verify, rebuild, time travel to the head, history) must
/// hold after hundreds of compactions.
enum LongLived {
  static func size(_ path: String) -> Int {
    (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.intValue ?? 0
  }

  static func configuration(_ clock: ManualClock, segment: Bool) -> FerryStore.Configuration {
    var configuration = FerryStore.Configuration()
    clock.install(in: &configuration)
    configuration.writeAheadSegment = segment
    return configuration
  }

  static func runner(_ store: FerryStore) -> TaskRunner {
    let runner = TaskRunner(queue: store.queue)
    runner.register(tag: "ok") { _ in .succeeded }
    runner.register(tag: "flaky", retry: RetryPolicy(maxAttempts: 5, initialDelay: .seconds(1), jitter: 0)) {
      task in
      task.attempt == 1 ? .failed("try again", retryable: true) : .succeeded
    }
    runner.register(tag: "stuck") { task in task.attempt == 1 ? .recordError("fix me") : .succeeded }
    runner.register(tag: "dead") { _ in .failed("refused", retryable: false) }
    return runner
  }

  /// One cycle of an app's life: work added, a pass, errors resolved, dead tasks cancelled,
  /// fetches recorded, time moving on.
  static func cycle(_ store: FerryStore, _ runner: TaskRunner, _ clock: ManualClock, _ i: Int) async throws {
    let queue = store.queue
    for error in try queue.errors() { try await queue.resolveError(error.taskId) }
    for task in try queue.pendingTasks() where task.status == .dead { try await queue.cancel(task.id) }
    // Groups and data ids come and go (a conversation, a photo): each is new.
    _ = try await queue.add(tag: "ok", payload: ["i": i], groupId: "g\(i)")
    _ = try await queue.add(
      tag: "ok", payload: ["i": i], dataId: "u\(i)", groupId: "g\(i)", options: [.unique(.keep)])
    _ = try await queue.add(tag: "ok", payload: ["i": i], dataId: "d\(i % 4)", options: [.unique(.replace)])
    _ = try await queue.add(tag: "ok", payload: ["i": i], dataId: "d\(i)", options: [.unique(.replace)])
    _ = try await queue.add(tag: "flaky", payload: ["i": i])
    _ = try await queue.add(tag: "stuck", payload: ["i": i], groupId: i % 2 == 0 ? "s" : "s\(i)")
    _ = try await queue.add(tag: "dead", payload: ["i": i])
    if i % 5 == 0 { _ = try await queue.add(tag: "ok", payload: ["i": i], options: [.manual]) }
    _ = try await runner.run()
    clock.advance(by: .seconds(2))
    _ = try await runner.run()
    try await store.ledger.recordFetch(key: "k\(i % 6)", outcome: .success(isEmpty: false))
    try await store.ledger.recordFetch(key: "k\((i + 1) % 6)", outcome: .failure("503"))
    try await store.ledger.setPaging(key: "k\(i % 6)", next: [UInt8(i % 256)], morePagesAvailable: i % 2 == 0)
    if i % 7 == 0 { try await store.ledger.forget("k\((i + 3) % 6)") }
    // A key fetched once and forgotten later (a screen visited once).
    try await store.ledger.recordFetch(key: "once\(i)", outcome: .success(isEmpty: true))
    if i >= 3 { try await store.ledger.forget("once\(i - 3)") }
    // Manual tasks are cancelled a while later (they would stay for ever otherwise).
    let head = try store.log.head()
    for task in try queue.pendingTasks() where task.manual && task.id.rawValue + 100 < head {
      try await queue.cancel(task.id)
    }
    clock.advance(by: .seconds(600))
  }

  /// Every history of a pending task, by task id.
  static func histories(_ store: FerryStore) throws -> [TaskID: [TaskHistoryEntry]] {
    var result: [TaskID: [TaskHistoryEntry]] = [:]
    for task in try store.queue.pendingTasks() { result[task.id] = try store.queue.history(of: task.id) }
    return result
  }
}

@Suite(.timeLimit(.minutes(20)), .serialized) struct LongLivedStoreTests {
  @Test(arguments: [false, true]) func hundredsOfCompactionCyclesStayBoundedAndWhole(
    segment: Bool
  ) async throws {
    let path = FileManager.default.temporaryDirectory.path + "/ferry-long-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: path) }
    let clock = ManualClock(date: Date(timeIntervalSince1970: 1_700_000_000))
    let cycles = ProcessInfo.processInfo.environment["FERRY_LONG_CYCLES"].flatMap(Int.init) ?? 100
    var store = try await FerryStore.open(
      at: path, configuration: LongLived.configuration(clock, segment: segment))
    var runner = LongLived.runner(store)
    var figures: [String] = []
    var largestRemaining = 0
    var dataAtWarmup = 0
    var largestData = 0
    var largestSegment = 0
    for i in 0..<cycles {
      try await LongLived.cycle(store, runner, clock, i)
      let before = try store.log.read { try FerryStore.snapshot(of: $0) }
      let histories = try LongLived.histories(store)
      let report = try await store.compact(retention: i % 2 == 0 ? .zero : .seconds(1800))
      // A compaction changes no state and no live task's history.
      #expect(try store.log.read { try FerryStore.snapshot(of: $0) } == before, "cycle \(i)")
      #expect(try LongLived.histories(store) == histories, "cycle \(i)")
      largestRemaining = max(largestRemaining, report.remaining)
      let data = LongLived.size(path + "/data.mdb")
      largestData = max(largestData, data)
      largestSegment = max(largestSegment, LongLived.size(path + "/ferry-segment"))
      if i == 50 { dataAtWarmup = largestData }
      if i % 25 == 24 {
        let verify = try store.log.verify()
        #expect(verify.isHealthy, "cycle \(i): \(verify.problems)")
        #expect(try store.log.withProjections(asOf: nil) { try FerryStore.snapshot(of: $0) } == before)
        figures.append(
          "cycle \(i): head \(try store.log.head()) remaining \(report.remaining) data \(data) "
            + "segment \(LongLived.size(path + "/ferry-segment")) pending \(before.tasks.count)")
        store.close()
        if i % 50 == 49 {
          // Between sessions, the operator gives the space back.
          try await compact(path: path, retentionMs: 0, copy: true, output: Output(line: { _ in }))
          figures.append("  after --copy: data \(LongLived.size(path + "/data.mdb"))")
        }
        store = try await FerryStore.open(
          at: path, configuration: LongLived.configuration(clock, segment: segment))
        runner = LongLived.runner(store)
        let owners = (try? FileManager.default.contentsOfDirectory(atPath: path + "/owners")) ?? []
        #expect(owners.count <= 2, "owner tokens left after \(i / 25 + 1) sessions: \(owners.count)")
        #expect(try store.log.read { try FerryStore.snapshot(of: $0) } == before, "reopened at cycle \(i)")
      }
    }
    defer { store.close() }
    // Rebuilding from the snapshots plus the tail gives exactly the live rows.
    let live = try store.log.read { try FerryStore.snapshot(of: $0) }
    let liveHistories = try LongLived.histories(store)
    _ = try await store.log.rebuild()
    #expect(try store.log.read { try FerryStore.snapshot(of: $0) } == live)
    #expect(try LongLived.histories(store) == liveHistories)
    let verify = try store.log.verify()
    #expect(verify.isHealthy, "\(verify.problems)")
    var types: [String: Int] = [:]
    try store.log.forEachEvent { types[$0.type, default: 0] += 1 }
    print("remaining by type: \(types.sorted { $0.key < $1.key })")
    print("long-lived (segment \(segment)):\n" + figures.joined(separator: "\n"))
    print(
      "largest remaining \(largestRemaining), data at warm-up \(dataAtWarmup), largest data \(largestData), largest segment \(largestSegment)"
    )
    // The live data is bounded (a few dozen tasks, six cache keys): so are the log and the file.
    #expect(largestRemaining < 400)
    #expect(largestData <= 2 * max(dataAtWarmup, 1))
  }
}
