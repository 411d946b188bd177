import Foundation
import Logging
import MetricsTestKit
import Synchronization
import Testing

@testable import FerryLog

/// The event log's own logging and metrics (LogMetrics.swift), without the Ferry layer.
@Suite struct LogInstrumentsTests {
  /// Keeps every record's level, message and metadata.
  struct Capture: LogHandler {
    final class Sink: Sendable {
      let records = Mutex<[(Logger.Level, String, [String: String])]>([])
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
      let values = (event.metadata ?? [:]).mapValues { "\($0)" }
      sink.records.withLock { $0.append((event.level, event.message.description, values)) }
    }
  }

  @Test func aRebuildAtOpenIsANotice() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open([CountByType(version: 1)])
    for i in 0..<5 { _ = try await log.append(NewEvent(type: "t", payload: [UInt8(i)])) }
    log.close()
    let sink = Capture.Sink()
    let reopened = try store.open([CountByType(version: 2)]) { configuration in
      configuration.logger = Logger(label: "ferry") { _ in Capture(sink: sink) }
    }
    defer { reopened.close() }
    #expect(reopened.eventsReplayedAtOpen == 5)
    let records = sink.records.withLock { $0 }
    let rebuilt = try #require(records.first { $0.1 == "projections rebuilt or caught up at open" })
    #expect(rebuilt.0 == .notice)
    #expect(rebuilt.2["ferry.events.replayed"] == "5")
    #expect(rebuilt.2["ferry.store"] == store.path)
  }

  /// 64 concurrent appenders: one recording per group commit, adding up to every event and every
  /// stored record byte.
  @Test func commitMetricsAddUpToTheLog() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let metrics = TestMetrics()
    let log = try store.open { $0.metricsFactory = metrics }
    defer { log.close() }
    try await withThrowingTaskGroup(of: Void.self) { group in
      for i in 0..<64 {
        group.addTask {
          _ = try await log.append(NewEvent(type: "t", payload: Array(repeating: 7, count: i)))
        }
      }
      try await group.waitForAll()
    }
    let statistics = log.statistics
    let events = try metrics.expectRecorder("ferry_commit_events").values
    #expect(events.count == statistics.commits)
    #expect(events.reduce(0, +) == 64)
    var bytes = 0
    for sequence in 1...64 { bytes += try #require(try log.record(at: UInt64(sequence))).count }
    #expect(try metrics.expectRecorder("ferry_commit_bytes").values.reduce(0, +) == Double(bytes))
    #expect(try metrics.expectTimer("ferry_commit_duration").values.count == statistics.commits)
    #expect(try metrics.expectTimer("ferry_commit_sync_duration").values.count == statistics.commits)
    #expect(try metrics.expectCounter("ferry_commit_failures_total").totalValue == 0)
  }
}
