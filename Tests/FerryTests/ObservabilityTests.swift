import CoreMetrics
import FerryLog
import FerryTesting
import Foundation
import Logging
import MetricsTestKit
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// One captured log record.
struct LogRecord: Sendable {
  let level: Logger.Level
  let message: String
  let metadata: [String: String]

  subscript(_ key: String) -> String? { metadata[key] }
}

/// A log handler that keeps every record, for a `Logger(label:factory:)` (no global bootstrap, so
/// tests stay independent of each other).
struct CapturingLogHandler: LogHandler {
  final class Sink: Sendable {
    private let records = Mutex<[LogRecord]>([])
    func add(_ record: LogRecord) { records.withLock { $0.append(record) } }
    var all: [LogRecord] { records.withLock { $0 } }
    /// The records about one task.
    func about(_ id: TaskID) -> [LogRecord] { all.filter { $0[FerryLogMetadata.taskId] == "\(id)" } }
  }

  let sink: Sink
  var logLevel: Logger.Level = .trace
  var metadata: Logger.Metadata = [:]
  var metadataProvider: Logger.MetadataProvider?

  subscript(metadataKey key: String) -> Logger.Metadata.Value? {
    get { metadata[key] }
    set { metadata[key] = newValue }
  }

  func log(event: LogEvent) {
    let merged = metadata.merging(event.metadata ?? [:]) { $1 }
    sink.add(
      LogRecord(
        level: event.level, message: event.message.description,
        metadata: merged.mapValues { "\($0)" }))
  }

  /// A logger whose records go to `sink`.
  static func logger(_ sink: Sink, level: Logger.Level = .trace) -> Logger {
    var logger = Logger(label: "ferry") { _ in CapturingLogHandler(sink: sink) }
    logger.logLevel = level
    return logger
  }
}

@Suite(.timeLimit(.minutes(20))) struct ObservabilityTests {
  // MARK: Logging

  @Test func logsNameTaskIdsTagsAndAttemptsAtTheRightLevelsAndNeverPayloads() async throws {
    let logs = CapturingLogHandler.Sink()
    try await withStore({ $0.logger = CapturingLogHandler.logger(logs) }) { store, clock, _ in
      let queue = store.queue
      let secret = "payload-secret-7f3a"
      let flaky = try await queue.add(tag: "upload", payload: Item(name: secret), groupId: "album")
      let rejected = try await queue.add(tag: "reject", payload: Item(name: secret))
      let cancelled = try await queue.add(tag: "upload", payload: Item(name: secret), options: [.manual])
      try await queue.cancel(cancelled)
      let run = runner(queue)
      run.register(tag: "upload", retry: RetryPolicy(initialDelay: .seconds(1), jitter: 0)) { task in
        task.attempt == 1 ? .failed("offline") : .succeeded
      }
      run.register(tag: "reject") { _ in .failed("the server refuses it", retryable: false) }
      _ = try await run.run()
      clock.advance(by: .seconds(1))
      #expect(try await run.run().outcome(of: flaky) == .succeeded)

      // The flaky task: added, run 1 failed with a retry (notice), run 2 succeeded.
      let aboutFlaky = logs.about(flaky).map { ($0.message, $0.level, $0[FerryLogMetadata.attempt]) }
      #expect(
        aboutFlaky.map(\.0) == [
          "task added", "run started", "run failed; retry scheduled", "run started", "run succeeded",
        ])
      #expect(aboutFlaky.map(\.1) == [.debug, .debug, .notice, .debug, .debug])
      #expect(aboutFlaky.map(\.2) == [nil, "1", "1", "2", "2"])
      for record in logs.about(flaky) {
        #expect(record[FerryLogMetadata.tag] == "upload")
        #expect(record[FerryLogMetadata.group] == "album")
      }
      let failure = try #require(logs.about(flaky).first { $0.level == .notice })
      #expect(failure[FerryLogMetadata.message] == "offline")
      #expect(failure[FerryLogMetadata.retryAt] != nil)

      // The rejected task is dead: a warning with its tag and attempt.
      let dead = try #require(logs.about(rejected).last)
      #expect(dead.level == .warning)
      #expect(dead.message == "run failed for good: the task is dead")
      #expect(dead[FerryLogMetadata.tag] == "reject")
      #expect(dead[FerryLogMetadata.attempt] == "1")
      #expect(dead[FerryLogMetadata.message] == "the server refuses it")

      // The cancel, at debug.
      #expect(logs.about(cancelled).map(\.message) == ["task added", "task cancelled"])
      #expect(logs.about(cancelled).map(\.level) == [.debug, .debug])

      // Every commit at trace, with the head it reached: as many as the log has events.
      let commits = logs.all.filter { $0.message == "commit" }
      #expect(commits.allSatisfy { $0.level == .trace })
      #expect(
        commits.compactMap { $0["ferry.commit.events"].flatMap(Int.init) }.reduce(0, +)
          == Int(try store.log.head()))
      #expect(commits.last?[FerryLogMetadata.sequence] == "\(try store.log.head())")

      // The open, at info; and no payload anywhere.
      #expect(logs.all.first { $0.message == "store opened" }?.level == .info)
      for record in logs.all {
        #expect(!record.message.contains(secret))
        #expect(!record.metadata.values.contains { $0.contains(secret) })
      }
    }
    #expect(logs.all.last?.message == "store closed")
  }

  @Test func theDefaultConfigurationEmitsNothingAndTheAppsBackendTurnsMetricsOn() async throws {
    try await withStore { store, _, _ in
      #expect(store.log.instruments.logger == nil)
      #expect(store.log.instruments.factory == nil)  // swift-metrics' no-op: nothing measured
      #expect(!store.queue.observer.measures)
      #expect(store.queue.observer.logger == nil)
      #expect(store.ledger.observer.logger == nil)
    }
    // A backend the app bootstrapped (here bound to this task only, like `MetricsSystem.bootstrap`
    // for the process) is what the default configuration reports to.
    let metrics = TestMetrics()
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await withMetricsFactory(metrics) { try await fixture.openStore() }
    defer { store.close() }
    _ = try await store.queue.add(tag: "t", payload: Item(name: "a"))
    #expect(try metrics.expectCounter("ferry_tasks_added_total", [("tag", "t")]).totalValue == 1)
    #expect(try metrics.expectMeter("ferry_queue_depth").lastValue == 0)  // read at open
  }

  @Test func aHandlerLeftRunningPastItsTimeLimitIsAWarning() async throws {
    let logs = CapturingLogHandler.Sink()
    let metrics = TestMetrics()
    try await withStore({
      $0.logger = CapturingLogHandler.logger(logs, level: .notice)
      $0.metricsFactory = metrics
    }) { store, clock, _ in
      let queue = store.queue
      let hung = try await queue.add(tag: "hang", payload: Item(name: "a"))
      let started = Journal()
      let release = Gate()
      let run = runner(queue) { $0.timeLimitGrace = .seconds(5) }
      run.register(
        tag: "hang", retry: RetryPolicy(initialDelay: .seconds(1), jitter: 0), timeLimit: .seconds(10)
      ) {
        _ in
        started.note("started")
        await release.wait()  // ignores its cancellation
        return .succeeded
      }
      async let pass = run.run()
      try await waitUntil { started.all == ["started"] }
      await clock.waitForSleepers()
      clock.advance(by: .seconds(10))
      await clock.waitForSleepers()
      clock.advance(by: .seconds(5))
      _ = try await pass
      release.open()
      let levels = logs.about(hung).map { "\($0.level): \($0.message)" }
      #expect(
        levels == [
          "warning: run passed its time limit and its handler ignored cancellation: left running, its group goes on",
          "notice: run failed; retry scheduled",
        ])
      #expect(logs.about(hung).first?["ferry.time_limit_ms"] == "10000")
      #expect(try metrics.expectCounter("ferry_runs_timed_out_total", [("tag", "hang")]).totalValue == 1)
      #expect(logs.all.allSatisfy { $0.level >= .notice })  // the logger's level filters
    }
  }

  @Test func aStoreMissingAcknowledgedCommitsIsRefusedWithAnError() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let copy = fixture.path + ".old-data"
    defer { try? FileManager.default.removeItem(atPath: copy) }
    var store = try await fixture.openStore()
    _ = try await store.queue.add(tag: "t", payload: Item(name: "a"))
    store.close()
    try FileManager.default.copyItem(atPath: fixture.path + "/data.mdb", toPath: copy)
    store = try await fixture.openStore()
    for name in ["b", "c", "d"] { _ = try await store.queue.add(tag: "t", payload: Item(name: name)) }
    store.close()
    try FileManager.default.removeItem(atPath: fixture.path + "/data.mdb")
    try FileManager.default.copyItem(atPath: copy, toPath: fixture.path + "/data.mdb")

    let logs = CapturingLogHandler.Sink()
    await #expect(throws: FerryError.self) {
      _ = try await fixture.openStore { $0.logger = CapturingLogHandler.logger(logs) }
    }
    let refusal = try #require(logs.all.first)
    #expect(refusal.level == .error)
    #expect(refusal.message.hasPrefix("store refused at open: "))
    #expect(refusal[FerryLogMetadata.store] == fixture.path)
  }

  @Test func runsInterruptedByACrashAreANoticeAtOpen() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    // A run whose owner is gone: a claim without an owner (as logged before owners existed).
    var store = try await fixture.openStore()
    let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
    _ = try await store.log.append(TaskEvent.runStarted(id, attempt: 1, owner: "", runner: 0).newEvent)
    store.close()
    let logs = CapturingLogHandler.Sink()
    store = try await fixture.openStore { $0.logger = CapturingLogHandler.logger(logs, level: .info) }
    defer { store.close() }
    #expect(store.queue.interruptedAtOpen == [id])
    #expect(
      logs.all.map { "\($0.level): \($0.message)" } == [
        "notice: run of a dead owner interrupted; the task is ready again", "info: store opened",
      ])
    #expect(logs.all.first?[FerryLogMetadata.taskId] == "\(id)")
    #expect(logs.all.last?["ferry.interrupted"] == "1")
  }

  // MARK: Metrics

  /// Two runners on one queue, two lanes each, with failures, a dead task, a recorded error and a
  /// cancel: every counter equals what the log holds, and the gauges what the queue holds.
  @Test func countersEqualTheLogAndGaugesTheQueueWithTwoRunners() async throws {
    let metrics = TestMetrics()
    try await withStore({
      $0.metricsFactory = metrics
      $0.gaugeInterval = .seconds(3600)  // only the open and the passes' ends read the gauges
    }) { store, clock, _ in
      let queue = store.queue
      var ids: [TaskID] = []
      for i in 0..<24 {
        let tag = ["a", "b", "c"][i % 3]
        ids.append(
          try await queue.add(tag: tag, payload: Item(name: "\(i)"), groupId: i % 4 == 0 ? "g\(i % 8)" : nil))
      }
      let cancelled = ids[5]
      try await queue.cancel(cancelled)
      let blocked = try await queue.add(tag: "a", payload: Item(name: "blocked"), options: [.manual])
      try await queue.recordError(blocked, message: "by the app")
      let handler: @Sendable (RunningTask) async throws -> TaskResult = { task in
        let n = Int(try task.payload(as: Item.self).name) ?? 0
        switch n % 6 {
        case 1 where task.attempt == 1: return .failed("once")
        case 2: return .failed("never", retryable: false)
        case 4 where task.attempt < 3: return .failed("twice")
        case 3 where n == 9: return .recordError("fix it")
        default: return .succeeded
        }
      }
      let first = runner(queue) { $0.maxConcurrentTasks = 2 }
      let second = runner(queue) { $0.maxConcurrentTasks = 2 }
      for run in [first, second] {
        run.register(
          tag: "a", retry: RetryPolicy(maxAttempts: 3, initialDelay: .seconds(1), jitter: 0), handler: handler
        )
        run.register(
          tag: "b", retry: RetryPolicy(maxAttempts: 2, initialDelay: .seconds(1), jitter: 0), handler: handler
        )
        run.register(
          tag: "c", retry: RetryPolicy(maxAttempts: 3, initialDelay: .seconds(1), jitter: 0), handler: handler
        )
      }
      for round in 0..<4 {
        if round > 0 { clock.advance(by: .seconds(10)) }  // every retry comes due
        async let one = first.run()
        async let two = second.run()
        _ = try await (one, two)
      }
      try await queue.waitUntilIdle()

      let expected = try countsInTheLog(store.log)
      #expect((expected["ferry_runs_started_total|a"] ?? 0) > 0)
      #expect((expected["ferry_tasks_dead_total|b"] ?? 0) > 0)
      #expect((expected["ferry_runs_failed_total|b|true"] ?? 0) > 0)
      #expect((expected["ferry_tasks_dead_total|c"] ?? 0) > 0)  // retryable: false
      #expect((expected["ferry_runs_failed_total|c|false"] ?? 0) > 0)
      #expect(expected["ferry_errors_recorded_total"] == 2)
      #expect(expected["ferry_tasks_cancelled_total"] == 1)

      let measured = countersByKey(metrics)
      #expect(measured == expected)

      // Gauges: what the queue holds after the last pass.
      let pending = try queue.pendingTasks()
      #expect(try metrics.expectMeter("ferry_queue_depth").lastValue == Double(pending.count))
      #expect(try metrics.expectMeter("ferry_queue_running").lastValue == 0)
      let oldest = try #require(pending.first)
      #expect(
        try metrics.expectMeter("ferry_queue_oldest_pending_age_seconds").lastValue
          == Double(clock.milliseconds - oldest.addedAtMs) / 1000)
      let ready = try store.log.read { view in try view.tables(of: "taskQueue").count("ready") }
      #expect(try metrics.expectMeter("ferry_queue_ready").lastValue == Double(ready))

      // Commits: one recording per group commit, adding up to every event and record byte in the log.
      let statistics = store.log.statistics
      let events = try metrics.expectRecorder("ferry_commit_events").values
      #expect(events.count == statistics.commits)
      #expect(events.reduce(0, +) == Double(try store.log.head()))
      var bytes = 0
      for sequence in 1...(try store.log.head()) { bytes += try store.log.record(at: sequence)?.count ?? 0 }
      #expect(try metrics.expectRecorder("ferry_commit_bytes").values.reduce(0, +) == Double(bytes))
      #expect(try metrics.expectTimer("ferry_commit_duration").values.count == statistics.commits)
      #expect(try metrics.expectTimer("ferry_commit_sync_duration").values.count == statistics.commits)
      let durations = metrics.timers(label: "ferry_run_duration").reduce(0) { $0 + $1.values.count }
      #expect(
        Int64(durations)
          == expected.filter { $0.key.hasPrefix("ferry_runs_started_total") }.values.reduce(0, +))
    }
  }

  @Test func cacheFetchesAreCountedByOutcomeAndLoggedWithTheirKey() async throws {
    let metrics = TestMetrics()
    let logs = CapturingLogHandler.Sink()
    try await withStore({
      $0.metricsFactory = metrics
      $0.logger = CapturingLogHandler.logger(logs, level: .debug)
    }) { store, _, _ in
      try await store.ledger.recordFetch(key: "notes", outcome: .success(isEmpty: false))
      try await store.ledger.recordFetch(key: "notes", outcome: .failure("offline"))
      try await store.ledger.recordFetch(key: "feed", outcome: .failure("timeout"))
      try await store.ledger.recordFetch(key: "feed", outcome: .success(isEmpty: true))
      #expect(
        try metrics.expectCounter("ferry_cache_fetches_total", [("outcome", "success")]).totalValue == 1)
      #expect(
        try metrics.expectCounter("ferry_cache_fetches_total", [("outcome", "failure")]).totalValue == 2)
      #expect(try metrics.expectCounter("ferry_cache_fetches_total", [("outcome", "empty")]).totalValue == 1)
      let fetches = logs.all.filter { $0.message.hasPrefix("cache fetch recorded") }
      #expect(fetches.map { $0[FerryLogMetadata.cacheKey] } == ["notes", "notes", "feed", "feed"])
      #expect(fetches.map(\.level) == [.debug, .debug, .debug, .debug])
      #expect(fetches[1][FerryLogMetadata.message] == "offline")
    }
  }

  @Test func tagsPastTheLimitShareOneSeries() async throws {
    let metrics = TestMetrics()
    try await withStore({ $0.metricsFactory = metrics }) { store, _, _ in
      for i in 0..<(maxTagDimensions + 5) {
        _ = try await store.queue.add(tag: "tag-\(i)", payload: Item(name: "x"))
      }
      let series = metrics.counters(label: "ferry_tasks_added_total")
      #expect(series.count == maxTagDimensions + 1)
      #expect(try metrics.expectCounter("ferry_tasks_added_total", [("tag", "other")]).totalValue == 5)
    }
  }
}

/// What Ferry's counters must say for a log: each counter's label (with `|tag` and `|retryable`
/// where the metric has those dimensions) and the number of events that count for it.
func countsInTheLog(_ log: EventLog) throws -> [String: Int64] {
  var tags: [TaskID: String] = [:]
  var expected: [String: Int64] = [:]
  func count(_ label: String, _ tag: String? = nil, retryable: Bool? = nil) {
    var key = label
    if let tag { key += "|\(tag)" }
    if let retryable { key += "|\(retryable)" }
    expected[key, default: 0] += 1
  }
  try log.forEachEvent { logged in
    guard TaskEvent.typeSet.contains(logged.type) else { return }
    switch try TaskEvent(logged) {
    case .added(let tag, _, _, _, _, _, _, _, _):
      tags[TaskID(rawValue: logged.sequence)] = tag
      count("ferry_tasks_added_total", tag)
    case .runStarted(let id, _, _, _, _): count("ferry_runs_started_total", tags[id])
    case .runSucceeded(let id, _): count("ferry_runs_succeeded_total", tags[id])
    case .runFailed(let id, _, let retryable, let next):
      count("ferry_runs_failed_total", tags[id], retryable: retryable)
      if next == nil { count("ferry_tasks_dead_total", tags[id]) }
    case .errorRecorded: count("ferry_errors_recorded_total")
    case .cancelled: count("ferry_tasks_cancelled_total")
    case .runInterrupted: count("ferry_runs_interrupted_total")
    default: break
    }
  }
  return expected
}

/// Every counter with a value, keyed like ``countsInTheLog(_:)``.
func countersByKey(_ metrics: TestMetrics) -> [String: Int64] {
  var measured: [String: Int64] = [:]
  for counter in metrics.counters where counter.totalValue > 0 {
    var key = counter.label
    if let tag = counter.dimensions.first(where: { $0.0 == "tag" })?.1 { key += "|\(tag)" }
    if let retryable = counter.dimensions.first(where: { $0.0 == "retryable" })?.1 { key += "|\(retryable)" }
    measured[key, default: 0] += counter.totalValue
  }
  return measured
}
