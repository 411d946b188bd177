import CoreMetrics
import FerryLog
import Foundation
import Logging
import Synchronization

// Logging and metrics of the push and pull sides. Nothing here emits anything unless the store was
// opened with a logger (``FerryStore/Configuration/logger``) or a metrics backend is there
// (``FerryStore/Configuration/metricsFactory``, else the `MetricsSystem` the app bootstrapped).
// The DocC article "Logging and metrics" has the table of metrics and metadata keys.

/// The metadata keys of Ferry's log records.
public enum FerryLogMetadata {
  /// A task's id (the sequence of its add).
  public static let taskId = "ferry.task.id"
  /// A task's tag.
  public static let tag = "ferry.task.tag"
  /// A run's attempt number (1 for the first run).
  public static let attempt = "ferry.task.attempt"
  /// A task's group.
  public static let group = "ferry.group"
  /// A sequence number in the log.
  public static let sequence = "ferry.sequence"
  /// A cache key.
  public static let cacheKey = "ferry.cache.key"
  /// When a failed task may run again (Unix milliseconds).
  public static let retryAt = "ferry.retry.at"
  /// A failure's or a recorded error's message, as the handler or the app wrote it.
  public static let message = "ferry.message"
  /// The store's directory.
  public static let store = "ferry.store"
}

/// The most distinct tags that get a metric dimension of their own; the runs of any further tag
/// are counted under the tag `other`, so that a store whose tags are not a bounded set cannot
/// make a metrics backend hold an unbounded number of series.
let maxTagDimensions = 64

/// Logging and metrics of the task queue and its runners (one per store).
final class QueueObserver: Sendable {
  let logger: Logger?
  private let metrics: QueueMetrics?
  private let log: EventLog
  private let clock: @Sendable () -> Int64

  init(log: EventLog, clock: @escaping @Sendable () -> Int64) {
    self.log = log
    self.clock = clock
    logger = log.instruments.logger
    metrics = log.instruments.factory.map { QueueMetrics(factory: $0) }
  }

  /// Whether a metrics backend takes the figures.
  var measures: Bool { metrics != nil }

  /// Whether the store is still open.
  var isOpen: Bool { !log.isClosed }

  // MARK: The app's changes

  /// A task was added (durable).
  func added(_ id: TaskID, tag: String, groupId: String?) {
    metrics?.tagged(tag).added.increment()
    logger?.debug("task added", metadata: Self.task(id, tag: tag, group: groupId))
    refreshGaugesIfDue()
  }

  /// The app recorded an error on a task (``TaskQueue/recordError(_:message:)``).
  func errorRecorded(_ id: TaskID, message: String) {
    metrics?.errorsRecorded.increment()
    logger?.debug(
      "error recorded on task",
      metadata: [FerryLogMetadata.taskId: "\(id)", FerryLogMetadata.message: "\(message)"])
  }

  /// Runs whose owner was gone were interrupted (at open, a pass's start, or a periodic look).
  func interrupted(_ ids: [TaskID]) {
    for id in ids {
      metrics?.interrupted.increment()
      logger?.notice(
        "run of a dead owner interrupted; the task is ready again",
        metadata: [FerryLogMetadata.taskId: "\(id)"])
    }
  }

  /// Every change this process made that observers are told of (``TaskQueue/publish(_:)``). Adds,
  /// runs and recorded errors have their own hooks, with more to say; these are the rest.
  func changed(_ update: TaskUpdate) {
    switch update {
    case .cancelled(let id):
      metrics?.cancelled.increment()
      logger?.debug("task cancelled", metadata: [FerryLogMetadata.taskId: "\(id)"])
    case .errorResolved(let id): logger?.debug("error resolved", metadata: [FerryLogMetadata.taskId: "\(id)"])
    case .revived(let id): logger?.debug("dead task revived", metadata: [FerryLogMetadata.taskId: "\(id)"])
    case .payloadUpdated(let id):
      logger?.debug("task payload updated", metadata: [FerryLogMetadata.taskId: "\(id)"])
    case .cleared: logger?.debug("queue cleared")
    case .paused: logger?.debug("automatic running paused")
    case .resumed: logger?.debug("automatic running resumed")
    case .deferred(let id, let reason):
      logger?.info(
        "run deferred, no attempt spent",
        metadata: [FerryLogMetadata.taskId: "\(id)", FerryLogMetadata.message: "\(reason)"])
    case .expired(let id):
      metrics?.expired.increment()
      logger?.debug(
        "task expired: its deadline passed before it started", metadata: [FerryLogMetadata.taskId: "\(id)"])
    case .current, .added, .running, .succeeded, .failed, .interrupted, .skipped, .errorRecorded: return
    }
    refreshGaugesIfDue()
  }

  // MARK: Runs

  /// A run's claim is durable and its handler is about to be called; returns the time it started
  /// (for ``runEnded(_:startedAt:)``).
  func runStarted(_ run: ClaimedRun) -> UInt64 {
    metrics?.tagged(run.task.tag).started.increment()
    logger?.debug("run started", metadata: Self.run(run))
    return measures ? DispatchTime.now().uptimeNanoseconds : 0
  }

  /// A batched handler is about to be called with `runs` (their claims durable, each also told
  /// to ``runStarted(_:)``).
  func batchStarted(_ runs: [ClaimedRun]) {
    guard let first = runs.first else { return }
    if let metrics {
      let tagged = metrics.tagged(first.task.tag)
      tagged.batches.increment()
      tagged.batchSize.record(runs.count)
    }
    guard let logger else { return }
    var metadata = Self.run(first)
    metadata["ferry.batch.size"] = "\(runs.count)"
    metadata["ferry.batch.tasks"] = "\(runs.map(\.task.id))"
    logger.debug("batch started", metadata: metadata)
  }

  /// A run's handler returned (or was left behind).
  func runEnded(_ run: ClaimedRun, startedAt: UInt64) {
    guard let metrics, startedAt > 0 else { return }
    let now = DispatchTime.now().uptimeNanoseconds
    if now >= startedAt { metrics.tagged(run.task.tag).duration.recordNanoseconds(Int64(now - startedAt)) }
  }

  /// A run's outcome is durable (logged by its own runner).
  func runFinished(_ run: ClaimedRun, events: [TaskEvent]) {
    if let metrics {
      for event in events {
        switch event {
        case .runSucceeded: metrics.tagged(run.task.tag).succeeded.increment()
        case .runFailed(_, _, let retryable, let next):
          let counters = metrics.tagged(run.task.tag)
          (retryable ? counters.failedRetryable : counters.failedPermanent).increment()
          if next == nil { counters.dead.increment() }
        case .errorRecorded: metrics.errorsRecorded.increment()
        case .runInterrupted: metrics.interrupted.increment()
        default: continue
        }
      }
    }
    guard let logger else { return }  // no metadata built for nobody
    var metadata = Self.run(run)
    for event in events {
      switch event {
      case .runSucceeded:
        logger.debug("run succeeded", metadata: metadata)
      case .runFailed(_, let message, let retryable, let next):
        metadata[FerryLogMetadata.message] = "\(message)"
        if let next {
          metadata[FerryLogMetadata.retryAt] = "\(next)"
          logger.notice("run failed; retry scheduled", metadata: metadata)
        } else {
          logger.warning(
            retryable
              ? "run failed and no attempts are left: the task is dead"
              : "run failed for good: the task is dead",
            metadata: metadata)
        }
      case .errorRecorded(_, let message, _):
        metadata[FerryLogMetadata.message] = "\(message)"
        logger.notice("run recorded an error: the task waits until it is resolved", metadata: metadata)
      case .runInterrupted:
        logger.notice("run interrupted; the task is ready again", metadata: metadata)
      default:
        continue
      }
    }
  }

  /// A run passed its time limit: its handler was cancelled and stopped (`abandoned` false), or
  /// ignored the cancellation past the grace period and was left running.
  func timedOut(_ run: ClaimedRun, limitMs: Int64, abandoned: Bool) {
    metrics?.tagged(run.task.tag).timedOut.increment()
    guard let logger else { return }
    var metadata = Self.run(run)
    metadata["ferry.time_limit_ms"] = "\(limitMs)"
    if abandoned {
      logger.warning(
        "run passed its time limit and its handler ignored cancellation: left running, its group goes on",
        metadata: metadata)
    } else {
      logger.notice("run passed its time limit: its handler was cancelled", metadata: metadata)
    }
  }

  /// A pass (or a single task's run) ended; the gauges are read again. Returns `report`.
  @discardableResult
  func passEnded(_ report: PassReport) -> PassReport {
    logger?.debug(
      "pass ended",
      metadata: [
        "ferry.pass.ran": "\(report.ran)", "ferry.pass.succeeded": "\(report.succeeded)",
        "ferry.pass.failed": "\(report.failed)", "ferry.pass.errorsRecorded": "\(report.errorsRecorded)",
        "ferry.pass.skipped": "\(report.skipped)",
      ])
    refreshGauges()
    return report
  }

  // MARK: Gauges

  /// Reads the queue's size, running and ready counts and its oldest task, and sets the gauges.
  /// O(1): three entry counts LMDB keeps and the first row of `tasks` (the lowest id is the
  /// oldest add), in one short read transaction. Serialized, so that the last reader sets last.
  func refreshGauges() {
    guard let metrics else { return }
    metrics.gaugeLock.withLock { last in
      let now = clock()
      guard
        let (depth, running, ready, oldest) = try? log.read({ view in
          let queue = QueueTables(try view.tables(of: TaskQueueProjection.projectionName))
          var first: TaskID?
          try queue.tables.scan("tasks", from: nil) { key, _ in
            first = TaskID(bigEndianBytes: key)
            return false
          }
          let addedAt = try first.flatMap { try queue.row($0)?.addedAt }
          return (
            try queue.tables.count("tasks"), try queue.tables.count("running"),
            try queue.tables.count("ready"),
            addedAt
          )
        })
      else { return }
      metrics.depth.set(depth)
      metrics.running.set(running)
      metrics.ready.set(ready)
      metrics.oldestAge.set(oldest.map { max(0, Double(now &- $0) / 1000) } ?? 0)
      last = DispatchTime.now().uptimeNanoseconds
    }
  }

  /// ``refreshGauges()`` when the last refresh is older than the interval (so that a burst of
  /// changes costs one read, not one per change).
  func refreshGaugesIfDue() {
    guard let metrics else { return }
    let last = metrics.gaugeLock.withLock { $0 }
    if DispatchTime.now().uptimeNanoseconds &- last >= metrics.intervalNanoseconds.load(ordering: .relaxed) {
      refreshGauges()
    }
  }

  /// The shortest time between two refreshes for changes (``FerryStore/Configuration/gaugeInterval``).
  func setGaugeInterval(_ interval: Duration) {
    metrics?.intervalNanoseconds.store(UInt64(max(0, interval.nanoseconds)), ordering: .relaxed)
  }

  // MARK: Metadata

  static func task(_ id: TaskID, tag: String, group: String?) -> Logger.Metadata {
    var metadata: Logger.Metadata = [FerryLogMetadata.taskId: "\(id)", FerryLogMetadata.tag: "\(tag)"]
    if let group { metadata[FerryLogMetadata.group] = "\(group)" }
    return metadata
  }

  static func run(_ run: ClaimedRun) -> Logger.Metadata {
    var metadata = task(run.task.id, tag: run.task.tag, group: run.task.groupId)
    metadata[FerryLogMetadata.attempt] = "\(run.claim.attempt)"
    metadata["ferry.runner"] = "\(run.claim.runner)"
    return metadata
  }
}

/// The queue's metrics, made from one factory.
final class QueueMetrics: Sendable {
  /// The counters of one tag.
  final class Tagged: Sendable {
    let added, started, succeeded, failedRetryable, failedPermanent, dead, timedOut, batches: Counter
    let duration: CoreMetrics.Timer
    /// Tasks per batch handler call.
    let batchSize: Recorder

    init(tag: String, factory: any MetricsFactory) {
      let tagged = [("tag", tag)]
      added = Counter(label: "ferry_tasks_added_total", dimensions: tagged, factory: factory)
      started = Counter(label: "ferry_runs_started_total", dimensions: tagged, factory: factory)
      succeeded = Counter(label: "ferry_runs_succeeded_total", dimensions: tagged, factory: factory)
      failedRetryable = Counter(
        label: "ferry_runs_failed_total", dimensions: tagged + [("retryable", "true")], factory: factory)
      failedPermanent = Counter(
        label: "ferry_runs_failed_total", dimensions: tagged + [("retryable", "false")], factory: factory)
      dead = Counter(label: "ferry_tasks_dead_total", dimensions: tagged, factory: factory)
      timedOut = Counter(label: "ferry_runs_timed_out_total", dimensions: tagged, factory: factory)
      duration = CoreMetrics.Timer(label: "ferry_run_duration", dimensions: tagged, factory: factory)
      batches = Counter(label: "ferry_batches_started_total", dimensions: tagged, factory: factory)
      batchSize = Recorder(label: "ferry_batch_size", dimensions: tagged, factory: factory)
    }
  }

  let factory: any MetricsFactory
  let cancelled, expired, errorsRecorded, interrupted: Counter
  let depth, running, ready, oldestAge: Meter
  private let tags = Mutex<[String: Tagged]>([:])
  /// The time of the last gauge refresh (uptime nanoseconds); held while refreshing.
  let gaugeLock = Mutex<UInt64>(0)
  let intervalNanoseconds = Atomic<UInt64>(5_000_000_000)

  init(factory: any MetricsFactory) {
    self.factory = factory
    cancelled = Counter(label: "ferry_tasks_cancelled_total", factory: factory)
    expired = Counter(label: "ferry_tasks_expired_total", factory: factory)
    errorsRecorded = Counter(label: "ferry_errors_recorded_total", factory: factory)
    interrupted = Counter(label: "ferry_runs_interrupted_total", factory: factory)
    depth = Meter(label: "ferry_queue_depth", factory: factory)
    running = Meter(label: "ferry_queue_running", factory: factory)
    ready = Meter(label: "ferry_queue_ready", factory: factory)
    oldestAge = Meter(label: "ferry_queue_oldest_pending_age_seconds", factory: factory)
  }

  /// The counters of `tag` (of `other` past ``maxTagDimensions`` distinct tags), made once.
  func tagged(_ tag: String) -> Tagged {
    tags.withLock { tags in
      if let known = tags[tag] { return known }
      let name = tags.count < maxTagDimensions ? tag : "other"
      if let other = tags[name] { return other }
      let made = Tagged(tag: name, factory: factory)
      tags[name] = made
      return made
    }
  }
}

/// Logging and metrics of the cache ledger.
final class CacheObserver: Sendable {
  let logger: Logger?
  private let fetches: (success: Counter, empty: Counter, failure: Counter)?

  init(log: EventLog) {
    logger = log.instruments.logger
    fetches = log.instruments.factory.map { factory in
      (
        Counter(label: "ferry_cache_fetches_total", dimensions: [("outcome", "success")], factory: factory),
        Counter(label: "ferry_cache_fetches_total", dimensions: [("outcome", "empty")], factory: factory),
        Counter(label: "ferry_cache_fetches_total", dimensions: [("outcome", "failure")], factory: factory)
      )
    }
  }

  /// A fetch of `key` was recorded (durable).
  func fetched(_ key: String, _ outcome: FetchResult, at: Int64) {
    switch outcome {
    case .success(let isEmpty): (isEmpty ? fetches?.empty : fetches?.success)?.increment()
    case .failure: fetches?.failure.increment()
    }
    guard let logger else { return }
    var metadata: Logger.Metadata = [FerryLogMetadata.cacheKey: "\(key)", "ferry.fetch.at": "\(at)"]
    switch outcome {
    case .success(let isEmpty):
      logger.debug(
        isEmpty ? "cache fetch recorded: empty" : "cache fetch recorded: success", metadata: metadata)
    case .failure(let message):
      metadata[FerryLogMetadata.message] = "\(message)"
      logger.debug("cache fetch recorded: failure", metadata: metadata)
    }
  }
}

extension FerryStore {
  /// Logs the open and, while metrics are on, reads the queue gauges now and every `gaugeInterval`.
  func startObserving(gaugeInterval: Duration) {
    let observer = queue.observer
    observer.logger?.info(
      "store opened",
      metadata: [
        FerryLogMetadata.store: "\(log.path)", FerryLogMetadata.sequence: "\((try? log.head()) ?? 0)",
        "ferry.created": "\(log.wasCreated)", "ferry.interrupted": "\(queue.interruptedAtOpen.count)",
      ])
    startGaugeTimer(gaugeInterval: gaugeInterval)
  }

  /// Reads the queue gauges now and every `gaugeInterval`, while metrics are on.
  func startGaugeTimer(gaugeInterval: Duration) {
    let observer = queue.observer
    guard observer.measures else { return }
    observer.setGaugeInterval(gaugeInterval)
    observer.refreshGauges()
    let period = max(gaugeInterval, .milliseconds(10))
    let timer = Task { [weak observer] in
      while !Task.isCancelled {
        try? await Task.sleep(for: period)
        // Ends with the store: closed through `FerryStore.close()` (which cancels it) or through
        // its queue alone (`TaskQueue.open` hands out only the queue).
        guard let observer, !Task.isCancelled, observer.isOpen else { return }
        observer.refreshGauges()
      }
    }
    gaugeTimer.withLock { $0 = timer }
  }

  /// Stops the gauge readings (the timer does not read a suspended store).
  func stopGaugeTimer() {
    gaugeTimer.withLock { timer in
      timer?.cancel()
      timer = nil
    }
  }

  /// Stops the gauge readings and logs the close.
  func stopObserving() {
    stopGaugeTimer()
    if !log.isClosed {
      queue.observer.logger?.info("store closed", metadata: [FerryLogMetadata.store: "\(log.path)"])
    }
  }

  /// Logs a compaction.
  func compacted(_ report: FerryLog.CompactionReport) {
    if !report.heldBackBy.isEmpty {
      queue.observer.logger?.warning(
        "log compaction removed nothing: projections of another version behind the head",
        metadata: [
          FerryLogMetadata.sequence: "\(report.snapshotSequence)",
          "ferry.compaction.heldBackBy": "\(report.heldBackBy.joined(separator: ", "))",
        ])
    }
    queue.observer.logger?.info(
      "log compacted",
      metadata: [
        FerryLogMetadata.sequence: "\(report.snapshotSequence)",
        "ferry.compaction.removed": "\(report.removed)",
        "ferry.compaction.removedBytes": "\(report.removedBytes)",
        "ferry.compaction.remaining": "\(report.remaining)",
      ])
  }
}
