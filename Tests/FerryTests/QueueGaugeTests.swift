import FerryLog
import FerryTesting
import Foundation
import MetricsTestKit
import Synchronization
import TestSupport
import Testing

@testable import Ferry

/// The queue's metrics gauges with more than one store in a process.
@Suite(.timeLimit(.minutes(20))) struct QueueGaugeTests {
  /// Two stores in one process with the app's metrics backend: the queue gauges carry no
  /// dimension that tells the stores apart, so both write one `ferry_queue_depth` series and it
  /// reads whichever store refreshed last (here 1, then 3, then 1 again…), and the counters of
  /// both add up in one series. Fixing it needs a per-store dimension (a configuration field,
  /// the metrics table of the DocC article "Logging and metrics"): not a small change, so it is left described here.
  /// Fixed: each store takes `metricsDimensions` of its own.
  @Test func twoStoresInOneProcessGaugeTheirQueuesInSeparateSeries() async throws {
    let metrics = TestMetrics()
    let first = QueueFixture()
    let second = QueueFixture()
    defer {
      first.remove()
      second.remove()
    }
    let one = try await first.openStore {
      $0.metricsFactory = metrics
      $0.metricsDimensions = [("store", "one")]
    }
    defer { one.close() }
    let two = try await second.openStore {
      $0.metricsFactory = metrics
      $0.metricsDimensions = [("store", "two")]
    }
    defer { two.close() }
    for n in 0..<3 { try await one.queue.add(tag: "t", payload: ["n": n]) }
    try await two.queue.add(tag: "t", payload: ["n": 0])
    _ = try await TaskRunner(queue: one.queue).run()  // reads the gauges at the pass's end
    _ = try await TaskRunner(queue: two.queue).run()

    let depths = metrics.meters.filter { $0.label == "ferry_queue_depth" }
    #expect(depths.count == 2, "one series per store")
    #expect(Set(depths.compactMap { $0.lastValue }) == [3, 1])
    let firstDepth = depths.first { $0.dimensions.contains { $0 == ("store", "one") } }
    #expect(firstDepth?.lastValue == 3)
    #expect(metrics.counters.filter { $0.label == "ferry_tasks_added_total" }.count == 2)
  }
}
