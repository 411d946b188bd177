@_spi(Experimental) import Ferry
import FerryTesting
import Foundation

/// Times `body` `count` times, in microseconds, stopping early once `budget` seconds have gone by
/// (after at least `minimum` samples).
func sampleMicroseconds(
  _ count: Int, budget: Double, minimum: Int = 50, _ body: () throws -> Void
) rethrows
  -> [Double]
{
  var samples: [Double] = []
  let deadline = ContinuousClock.now + .milliseconds(Int64(budget * 1000))
  for _ in 0..<count {
    let start = ContinuousClock.now
    try body()
    let elapsed = ContinuousClock.now - start
    samples.append(Double(elapsed.components.attoseconds) / 1e12 + Double(elapsed.components.seconds) * 1e6)
    if samples.count >= minimum && ContinuousClock.now > deadline { break }
  }
  return samples
}

/// 3. One pass of the runner over a large queue of which exactly one task may run: `lookupBlocked`
/// groups whose head is blocked by a recorded error, the rest of `lookupPending` queued behind those
/// heads, and one ungrouped task with a no-op handler. A new runnable task is added (untimed)
/// between passes, so every pass has exactly one to run. The peer does the same on SQLite: its pass
/// is its run loop (next runnable, complete, until none).
///
/// The three queues (both write paths and SQLite) are filled first, then timed in turns, one pass
/// of each per round in an order that rotates: a flush's latency on a shared host drifts by tens of
/// percent over seconds, and a peer timed a minute after Ferry would be judged on another disk.
func passWithOneRunnable(_ sizes: Sizes) async throws -> [Figure] {
  let pending = sizes.lookupPending
  let blocked = sizes.lookupBlocked
  let behind = pending - blocked - 1

  var stores: [FerryStore] = []
  var paths: [String] = []
  defer {
    for store in stores { store.close() }
    for path in paths { remove(path) }
  }
  var runners: [TaskRunner] = []
  for isDefault in [true, false] {
    let fp = scratchPath("w3p")
    paths.append(fp)
    var configuration = FerryStore.Configuration()
    configuration.writeAheadSegment = isDefault == defaultIsSegment
    let store = try await FerryStore.open(at: fp, configuration: configuration)
    stores.append(store)
    let heads = try await fill(store, blocked) { "b\($0)" }  // one per group: each the head of its group
    try await recordErrors(store, heads)
    _ = try await fill(store, behind) { "b\($0 % blocked)" }
    let runner = TaskRunner(queue: store.queue)
    runner.register(tag: "t") { _ in .succeeded }
    runners.append(runner)
  }
  let sp = scratchPath("w3ps")
  paths.append(sp)
  try FileManager.default.createDirectory(atPath: sp, withIntermediateDirectories: true)
  let peer = try SQLitePeer(path: sp + "/queue.sqlite")
  defer { try? peer.close() }
  try await peer.addMany(blocked) { "b\($0)" }
  try await peer.recordErrors(try peer.firstIDs(blocked), message: "blocked")
  try await peer.addMany(behind) { "b\($0 % blocked)" }

  // Times per queue: 0 the default path, 1 the other path, 2 SQLite.
  var times: [[Double]] = [[], [], []]
  var flushesPerPass: [[Double]] = [[], [], []]
  var entries: [Double] = []
  var ran: [Int] = []
  let deadline = ContinuousClock.now + .milliseconds(Int64(sizes.timeBudget * 3 * 1000))
  for pass in 0..<sizes.passes {
    for turn in 0..<3 {
      let queue = (pass + turn) % 3
      var elapsed = 0.0
      if queue == 2 {
        try await peer.add(tag: "t", payload: payloadData)
        flushesPerPass[2].append(
          try await flushes {
            elapsed = try await seconds {
              while let id = try peer.nextRunnable() { try await peer.complete(id) }
            }
          })
      } else {
        try await stores[queue].queue.add(tag: "t", payload: Item(name: "milk"))
        var report: PassReport?
        flushesPerPass[queue].append(
          try await flushes { elapsed = try await seconds { report = try await runners[queue].run() } })
        entries.append(Double(report?.entries.count ?? 0))
        ran.append(report?.ran ?? 0)
      }
      times[queue].append(elapsed * 1000)
    }
    if pass >= 4 && ContinuousClock.now > deadline { break }
  }
  let (ferry, other, sqlite) = (times[0], times[1], times[2])

  let f = median(ferry)
  let s = median(sqlite)
  let ranNote = Set(ran) == [1] ? "1 ran" : "ran \(ran.min() ?? 0)–\(ran.max() ?? 0), not 1"
  return [
    Figure(
      workload: "3 pass over \(pending) pending with one runnable task", metric: "ms per pass", ferry: f,
      sqlite: s, floor: nil, unit: "ms", target: "≤ SQLite (\(defaultPath))", meets: f <= s),
    Figure(
      workload: "3 the same pass, \(otherPath)", metric: "ms per pass", ferry: median(other),
      sqlite: s, floor: nil, unit: "ms", target: "(reported: the other write path)", meets: nil),
    Figure(
      workload: "3 flushes per pass", metric: "flushes", ferry: median(flushesPerPass[0]),
      sqlite: median(flushesPerPass[2]), floor: median(flushesPerPass[1]), unit: "flushes",
      target: "(reported: a claim and an outcome; the claim's frame rides on the outcome's flush)",
      meets: nil, baseline: otherPath.components(separatedBy: " (").first),
    Figure(
      workload: "3 that pass's report (\(ferry.count + other.count) passes, \(ranNote))",
      metric: "report entries", ferry: median(entries), sqlite: nil, floor: nil, unit: "entries",
      target: "(reported)", meets: nil),
  ]
}

/// 4. Next-runnable lookup when many retries are due: `dueRetries` tasks (the lowest ids) failed
/// retryably with a 1 s backoff, then the rest of `lookupPending` were added, ready. Timed first
/// while no retry is due (the store's clock stands still), then with the clock moved past every
/// retry time: the same queue, the same size.
func dueRetryLookups(_ sizes: Sizes) async throws -> [Figure] {
  let pending = sizes.lookupPending
  let retries = min(sizes.dueRetries, pending)
  let clock = ManualClock()
  var configuration = FerryStore.Configuration()
  clock.install(in: &configuration)
  let fp = scratchPath("w4r")
  defer { remove(fp) }
  let store = try await FerryStore.open(at: fp, configuration: configuration)
  defer { store.close() }
  _ = try await fill(store, retries, tag: "r") { _ in nil }
  var runnerConfiguration = TaskRunner.Configuration()
  runnerConfiguration.maxConcurrentTasks = 8
  let runner = TaskRunner(queue: store.queue, configuration: runnerConfiguration)
  runner.register(tag: "r", retry: RetryPolicy(maxAttempts: 5, initialDelay: .seconds(1))) { _ in
    .failed("offline")
  }
  let failed = try await runner.run().failed
  _ = try await fill(store, pending - retries)  // ready, tag "t"

  let noneDue = try sampleMicroseconds(sizes.lookups, budget: sizes.timeBudget / 2) {
    _ = try store.queue.nextRunnable()
  }
  clock.advance(by: .seconds(60))  // every retry time (1 s ± 20 %) has passed
  let due = try sampleMicroseconds(sizes.lookups, budget: sizes.timeBudget / 2) {
    _ = try store.queue.nextRunnable()
  }
  let n = percentile(noneDue, 50)
  let d = percentile(due, 50)
  return [
    Figure(
      workload: "4 next runnable with none due (\(pending) pending)", metric: "p50", ferry: n, sqlite: nil,
      floor: nil, unit: "µs", target: "(reported: \(failed) waiting, not yet due)", meets: nil),
    Figure(
      workload: "4 next runnable with \(failed) due retries", metric: "p50", ferry: d, sqlite: nil, floor: n,
      unit: "µs", target: "p50 within 2× of none due", meets: d <= 2 * n, baseline: "none due"),
  ]
}

/// 4. Next-runnable lookup with `lookupPending` tasks of which a tenth wait for a start time: the
/// delayed ones were added first (the lowest ids, starts spread over the next hours), so a lookup
/// that walked the queue in id order would meet all of them before the first ready task.
func delayedLookups(_ sizes: Sizes) async throws -> [Figure] {
  let pending = sizes.lookupPending
  let delayed = pending / 10
  let fp = scratchPath("w4d")
  defer { remove(fp) }
  let store = try await FerryStore.open(at: fp)
  defer { store.close() }
  let now = Date()
  _ = try await fill(store, delayed, tag: "d", groupOf: { _ in nil }) { i in
    .at(now.addingTimeInterval(3600 + Double(i)))
  }
  _ = try await fill(store, pending - delayed)
  let times = try sampleMicroseconds(sizes.lookups, budget: sizes.timeBudget) {
    _ = try store.queue.nextRunnable()
  }
  let p50 = percentile(times, 50)
  return [
    Figure(
      workload: "4 next runnable (\(pending) pending, \(delayed) delayed)", metric: "p50", ferry: p50,
      sqlite: nil,
      floor: nil, unit: "µs", target: "p50 ≤ 20 µs", meets: p50 <= 20)
  ]
}
