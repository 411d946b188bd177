import CoreMetrics
import Foundation
import Logging

/// What the event log reports about itself: per-commit trace lines and commit metrics, refusals of
/// damaged stores, failed commits. Nothing at all unless the configuration has a logger, or the
/// metrics factory (``EventLog/Configuration/metricsFactory``, else `MetricsSystem.factory` at open)
/// is something other than swift-metrics' no-op handler.
///
/// Metrics (the DocC article "Logging and metrics" lists every Ferry metric):
/// - `ferry_commit_events`, `ferry_commit_bytes` (recorders): events and record bytes per group commit;
/// - `ferry_commit_duration` (timer): a group commit's write transaction, from its start until durable;
/// - `ferry_commit_sync_duration` (timer): its commit alone — LMDB writing the pages and the fsyncs;
/// - `ferry_commit_failures_total` (counter): write transactions that failed as a whole (disk full, I/O).
package final class LogInstruments: Sendable {
  /// Where log records go; nil logs nothing.
  package let logger: Logger?
  /// The factory the metrics come from, nil when it is the no-op one (then nothing is measured,
  /// not even the time a commit takes).
  package let factory: (any MetricsFactory)?
  let commitEvents: Recorder?
  let commitBytes: Recorder?
  let commitDuration: CoreMetrics.Timer?
  let commitSyncDuration: CoreMetrics.Timer?
  let commitFailures: Counter?

  /// The instruments of a log opened with `configuration`.
  package init(logger: Logger?, metricsFactory: (any MetricsFactory)?, dimensions: [(String, String)] = []) {
    self.logger = logger
    let factory = LogInstruments.effectiveFactory(metricsFactory).map { base -> any MetricsFactory in
      dimensions.isEmpty ? base : DimensionedMetricsFactory(base: base, extra: dimensions)
    }
    self.factory = factory
    if let factory {
      commitEvents = Recorder(label: "ferry_commit_events", factory: factory)
      commitBytes = Recorder(label: "ferry_commit_bytes", factory: factory)
      commitDuration = CoreMetrics.Timer(label: "ferry_commit_duration", factory: factory)
      commitSyncDuration = CoreMetrics.Timer(label: "ferry_commit_sync_duration", factory: factory)
      commitFailures = Counter(label: "ferry_commit_failures_total", factory: factory)
    } else {
      commitEvents = nil
      commitBytes = nil
      commitDuration = nil
      commitSyncDuration = nil
      commitFailures = nil
    }
  }

  /// The factory to use: the one given, else the process's (`MetricsSystem.factory`); nil when
  /// that is swift-metrics' no-op handler, so that nothing is measured for nobody.
  package static func effectiveFactory(_ given: (any MetricsFactory)?) -> (any MetricsFactory)? {
    let factory = given ?? MetricsSystem.factory
    return factory is NOOPMetricsHandler ? nil : factory
  }

  /// Whether commits are timed (a metrics factory is there to take the figures).
  var measures: Bool { factory != nil }

  /// A monotonic time in nanoseconds, for durations.
  static func now() -> UInt64 { DispatchTime.now().uptimeNanoseconds }

  /// One durable group commit: `events` records of `bytes` bytes for `calls` callers, up to `head`;
  /// `started` and `bodyEnded` are ``now()`` at the transaction's start and the end of its body
  /// (0 when not measured).
  func committed(events: Int, bytes: Int, calls: Int, head: UInt64, started: UInt64, bodyEnded: UInt64) {
    if measures {
      let end = Self.now()
      commitEvents?.record(events)
      commitBytes?.record(bytes)
      if started > 0 && end >= started { commitDuration?.recordNanoseconds(Int64(end - started)) }
      if bodyEnded > 0 && end >= bodyEnded { commitSyncDuration?.recordNanoseconds(Int64(end - bodyEnded)) }
    }
    logger?.trace(
      "commit",
      metadata: [
        "ferry.sequence": "\(head)", "ferry.commit.events": "\(events)",
        "ferry.commit.bytes": "\(bytes)", "ferry.commit.calls": "\(calls)",
      ])
  }

  /// A write transaction failed as a whole: every caller in it gets `error`.
  func commitFailed(_ error: any Error, calls: Int) {
    commitFailures?.increment()
    let level: Logger.Level
    switch error as? FerryLogError {
    case .closed, .suspended: level = .debug
    default: level = .error
    }
    logger?.log(
      level: level, "commit failed: \(error)", metadata: ["ferry.commit.calls": "\(calls)"])
  }

  /// One append (of a batch) was refused on its own: the others were written.
  func requestFailed(_ error: any Error) {
    logger?.notice("append refused: \(error)")
  }

  /// The log is open; `replayed` events were folded into projections at open (a rebuild after a
  /// version change, or catching up another process's appends).
  func opened(path: String, created: Bool, replayed: Int, readOnly: Bool) {
    guard let logger else { return }
    let metadata: Logger.Metadata = [
      "ferry.store": "\(path)", "ferry.created": "\(created)", "ferry.readOnly": "\(readOnly)",
    ]
    if replayed > 0 {
      logger.notice(
        "projections rebuilt or caught up at open",
        metadata: metadata.merging(["ferry.events.replayed": "\(replayed)"]) { $1 })
    }
    logger.debug("event log opened", metadata: metadata)
  }

  /// The log let go of the store (``EventLog/suspend()``).
  func suspended(path: String) {
    logger?.info("event log suspended: no lock held", metadata: ["ferry.store": "\(path)"])
  }

  /// The log opened the store again after a suspension.
  func resumed(path: String, replayed: Int) {
    logger?.info(
      "event log resumed", metadata: ["ferry.store": "\(path)", "ferry.events.replayed": "\(replayed)"])
  }

  /// An open refused: damage, lost commits and unreadable records at error, the rest at notice.
  static func refused(_ error: FerryLogError, path: String, logger: Logger?) {
    guard let logger else { return }
    let level: Logger.Level
    switch error {
    case .damagedStore, .lostCommits, .corruptRecord, .sequenceGap, .unsupportedRecordFormat: level = .error
    case .diskFull, .quotaExceeded, .ioError, .unsupportedLMDB: level = .error
    case .alreadyOpen, .noSuchStore: level = .debug
    default: level = .notice
    }
    logger.log(level: level, "store refused at open: \(error)", metadata: ["ferry.store": "\(path)"])
  }
}

/// A metrics factory that adds fixed dimensions to every metric made through it — how two stores
/// in one process keep their series apart (``EventLog/Configuration/metricsDimensions``).
struct DimensionedMetricsFactory: MetricsFactory {
  let base: any MetricsFactory
  let extra: [(String, String)]

  func makeCounter(label: String, dimensions: [(String, String)]) -> any CounterHandler {
    base.makeCounter(label: label, dimensions: dimensions + extra)
  }
  func makeFloatingPointCounter(
    label: String, dimensions: [(String, String)]
  ) -> any FloatingPointCounterHandler {
    base.makeFloatingPointCounter(label: label, dimensions: dimensions + extra)
  }
  func makeMeter(label: String, dimensions: [(String, String)]) -> any MeterHandler {
    base.makeMeter(label: label, dimensions: dimensions + extra)
  }
  func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any RecorderHandler {
    base.makeRecorder(label: label, dimensions: dimensions + extra, aggregate: aggregate)
  }
  func makeTimer(label: String, dimensions: [(String, String)]) -> any TimerHandler {
    base.makeTimer(label: label, dimensions: dimensions + extra)
  }
  func destroyCounter(_ handler: any CounterHandler) { base.destroyCounter(handler) }
  func destroyFloatingPointCounter(_ handler: any FloatingPointCounterHandler) {
    base.destroyFloatingPointCounter(handler)
  }
  func destroyMeter(_ handler: any MeterHandler) { base.destroyMeter(handler) }
  func destroyRecorder(_ handler: any RecorderHandler) { base.destroyRecorder(handler) }
  func destroyTimer(_ handler: any TimerHandler) { base.destroyTimer(handler) }
}
