import CFerryFlushCount
@_spi(Engine) @_spi(Experimental) import Ferry
import FerryLog
import Foundation
import GRDB

struct Item: Codable, Sendable { var name: String }
let payloadData = Data(#"{"name":"milk"}"#.utf8)

/// Sizes of one benchmark run.
struct Sizes {
  var sequentialAdds = 10_000
  var concurrentAdds = 100_000
  var callers = 64
  var runLoop = 10_000
  var lookupPending = 100_000
  var lookupBlocked = 10_000
  var lookups = 10_000
  var rebuildEvents = 1_000_000
  var openSizes = [10_000, 100_000, 1_000_000]
  /// Tasks that failed with a retry time that has come, in the due-retries lookup.
  var dueRetries = 10_000
  /// Timed passes over the queue with one runnable task (fewer when `timeBudget` runs out).
  var passes = 50
  /// Seconds a sampled figure may take (after a minimum of samples), so that a slow path stays a
  /// figure and not a hang.
  var timeBudget = 10.0
  var runs = 3

  static let quick = Sizes(
    sequentialAdds: 300, concurrentAdds: 3_200, callers: 64, runLoop: 400, lookupPending: 10_000,
    lookupBlocked: 1_000,
    lookups: 1_000, rebuildEvents: 50_000, openSizes: [1_000, 10_000, 50_000], dueRetries: 1_000,
    passes: 10, timeBudget: 2, runs: 1)
}

/// One figure of the report.
struct Figure: Codable {
  var workload: String
  var metric: String
  var ferry: Double
  var sqlite: Double?
  var floor: Double?
  var unit: String
  var target: String
  var meets: Bool?
  /// What `floor` is, when it is neither the LMDB floor nor a bare scan (say, "none due").
  var baseline: String? = nil
}

/// Ferry's record size for a task add with the benchmark's payload (the floor writes the same size).
func ferryRecordSize() async throws -> Int {
  let path = scratchPath("size")
  defer { remove(path) }
  let store = try await FerryStore.open(at: path)
  defer { store.close() }
  try await store.queue.add(tag: "t", payload: Item(name: "milk"))
  return try store.log.record(at: 1)?.count ?? 64
}

/// How the lines name Ferry's two write paths: the default and the other one.
let defaultIsSegment = FerryStore.Configuration().writeAheadSegment
let defaultPath = defaultIsSegment ? "default: write-ahead segment" : "default: flushed commits"
let otherPath = defaultIsSegment ? "flushed commits (segment off)" : "write-ahead segment (not the default)"

/// The flushes (fsync, fdatasync, msync, O_DSYNC writes) `work` made, in this process.
func flushes(_ work: () async throws -> Void) async rethrows -> Double {
  let before = ferry_flush_count()
  try await work()
  return Double(ferry_flush_count() - before)
}

/// 1. Sequential durable adds, one caller.
func sequentialAdds(_ sizes: Sizes, recordSize: Int) async throws -> [Figure] {
  var ferry: [Double] = []
  var other: [Double] = []
  var sqlite: [Double] = []
  var floor: [Double] = []
  var addShaped: [Double] = []
  var bareFlush: [Double] = []
  var sqliteNormal: [Double] = []
  var flushesPerAdd: (ferry: [Double], other: [Double], sqlite: [Double]) = ([], [], [])
  let n = sizes.sequentialAdds
  for _ in 0..<sizes.runs {
    for isDefault in [true, false] {
      let fp = scratchPath("w1f")
      var configuration = FerryStore.Configuration()
      configuration.writeAheadSegment = isDefault == defaultIsSegment
      let store = try await FerryStore.open(at: fp, configuration: configuration)
      // The first commit of a process with the segment checkpoints: not an add's cost.
      try await store.queue.add(tag: "t", payload: Item(name: "milk"))
      var elapsed = 0.0
      let flushed = try await flushes {
        elapsed = try await seconds {
          for _ in 0..<n { try await store.queue.add(tag: "t", payload: Item(name: "milk")) }
        }
      }
      if isDefault {
        ferry.append(Double(n) / elapsed)
        flushesPerAdd.ferry.append(flushed / Double(n))
      } else {
        other.append(Double(n) / elapsed)
        flushesPerAdd.other.append(flushed / Double(n))
      }
      store.close()
      remove(fp)
    }

    let sp = scratchPath("w1s")
    try FileManager.default.createDirectory(atPath: sp, withIntermediateDirectories: true)
    let peer = try SQLitePeer(path: sp + "/queue.sqlite")
    var elapsed = 0.0
    let flushed = try await flushes {
      elapsed = try await seconds { for _ in 0..<n { try await peer.add(tag: "t", payload: payloadData) } }
    }
    sqlite.append(Double(n) / elapsed)
    flushesPerAdd.sqlite.append(flushed / Double(n))
    try peer.close()
    remove(sp)

    let np = scratchPath("w1n")
    try FileManager.default.createDirectory(atPath: np, withIntermediateDirectories: true)
    let normal = try SQLitePeer(path: np + "/queue.sqlite", durable: false)
    sqliteNormal.append(
      Double(n)
        / (try await seconds { for _ in 0..<n { try await normal.add(tag: "t", payload: payloadData) } }))
    try normal.close()
    remove(np)

    let lp = scratchPath("w1l")
    let bare = try LMDBFloor(path: lp)
    floor.append(Double(n) / (try await seconds { try bare.singleCommits(n, recordSize: recordSize) }))
    bare.close()
    remove(lp)
    let ap = scratchPath("w1a")
    addShaped.append(try LMDBFloor.addShapedCommits(path: ap, count: n, batch: 1, recordSize: recordSize))
    remove(ap)

    // A segment frame of one add: the record and the frame's own header and checksum.
    bareFlush.append(try bareFlushes(path: scratchPath("w1d"), count: n, size: recordSize + 36))
  }
  let f = median(ferry)
  let s = median(sqlite)
  let shaped = median(addShaped)
  return [
    Figure(
      workload: "1 sequential durable adds (\(n), 1 caller)", metric: "adds/s", ferry: f, sqlite: s,
      floor: nil, unit: "/s", target: "≥ 1× SQLite (\(defaultPath))", meets: f >= s),
    Figure(
      workload: "1 LMDB alone, an add's four trees a commit", metric: "adds/s", ferry: f, sqlite: nil,
      floor: shaped, unit: "/s", target: "≥ 0.9× add-shaped floor", meets: f >= 0.9 * shaped,
      baseline: "add-shaped LMDB"),
    Figure(
      workload: "1 the same adds, \(otherPath)", metric: "adds/s", ferry: median(other), sqlite: s,
      floor: nil, unit: "/s", target: "(reported: the other write path)", meets: nil),
    Figure(
      workload: "1 flushes per acknowledged add", metric: "flushes", ferry: median(flushesPerAdd.ferry),
      sqlite: median(flushesPerAdd.sqlite), floor: median(flushesPerAdd.other), unit: "flushes",
      target: "(reported: counted at the C library; 1 for the segment, 2 for LMDB's commit)", meets: nil,
      baseline: otherPath.components(separatedBy: " (").first),
    Figure(
      workload: "1 LMDB alone, one record in one tree a commit", metric: "adds/s", ferry: f, sqlite: nil,
      floor: median(floor), unit: "/s",
      target: "(reported: not what an add writes; its target is retired for the add-shaped line)",
      meets: nil),
    Figure(
      workload: "1 the disk: a bare pwrite + fdatasync", metric: "flushes/s", ferry: f,
      sqlite: s, floor: median(bareFlush), unit: "/s",
      target: "(reported: no one-flush commit beats it)", meets: nil, baseline: "bare flush"),
    Figure(
      workload: "1 SQLite as a GRDB pool leaves it (NORMAL)", metric: "adds/s", ferry: f,
      sqlite: median(sqliteNormal), floor: nil, unit: "/s",
      target:
        "(reported: WAL with synchronous = NORMAL is not flushed per commit; the sqlite column elsewhere is FULL)",
      meets: nil),
  ]
}

/// 2. Many concurrent callers adding.
func concurrentAdds(_ sizes: Sizes, recordSize: Int) async throws -> [Figure] {
  var ferry: [Double] = []
  var sqlite: [Double] = []
  var floor: [Double] = []
  var addShaped: [Double] = []
  var other: [Double] = []
  var batchSizes: [Double] = []
  let perCaller = sizes.concurrentAdds / sizes.callers
  let n = perCaller * sizes.callers
  for _ in 0..<sizes.runs {
    for isDefault in [true, false] {
      let fp = scratchPath("w2f")
      var configuration = FerryStore.Configuration()
      configuration.writeAheadSegment = isDefault == defaultIsSegment
      let store = try await FerryStore.open(at: fp, configuration: configuration)
      let commitsBefore = store.log.statistics.commits
      let rate =
        Double(n)
        / (try await seconds {
          try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<sizes.callers {
              group.addTask {
                for _ in 0..<perCaller { try await store.queue.add(tag: "t", payload: Item(name: "milk")) }
              }
            }
            try await group.waitForAll()
          }
        })
      if isDefault {
        ferry.append(rate)
        batchSizes.append(Double(n) / Double(max(1, store.log.statistics.commits - commitsBefore)))
      } else {
        other.append(rate)
      }
      store.close()
      remove(fp)
    }

    let sp = scratchPath("w2s")
    try FileManager.default.createDirectory(atPath: sp, withIntermediateDirectories: true)
    let peer = try SQLitePeer(path: sp + "/queue.sqlite")
    sqlite.append(
      Double(n)
        / (try await seconds {
          try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<sizes.callers {
              group.addTask { for _ in 0..<perCaller { try await peer.add(tag: "t", payload: payloadData) } }
            }
            try await group.waitForAll()
          }
        }))
    try peer.close()
    remove(sp)

    let lp = scratchPath("w2l")
    let bare = try LMDBFloor(path: lp)
    floor.append(
      Double(n) / (try await seconds { try bare.batches(n, batch: sizes.callers, recordSize: recordSize) }))
    bare.close()
    remove(lp)
    // What Ferry's commits held in this run (its callers split into a half in the commit and a half
    // queued for the next), with an add's four trees.
    let ap = scratchPath("w2a")
    addShaped.append(
      try LMDBFloor.addShapedCommits(
        path: ap, count: n, batch: max(1, Int((batchSizes.last ?? 1).rounded())), recordSize: recordSize))
    remove(ap)
  }
  let f = median(ferry)
  let s = median(sqlite)
  let shaped = median(addShaped)
  return [
    Figure(
      workload: "2 concurrent adds (\(n), \(sizes.callers) callers)", metric: "adds/s", ferry: f, sqlite: s,
      floor: nil, unit: "/s", target: "≥ 10× SQLite (\(defaultPath))", meets: f >= 10 * s),
    Figure(
      workload: "2 LMDB alone, an add's four trees, Ferry's batches", metric: "adds/s", ferry: f, sqlite: nil,
      floor: shaped, unit: "/s",
      target:
        "≥ 0.8× add-shaped floor (\(String(format: "%.1f", median(batchSizes))) adds a commit as Ferry made them)",
      meets: f >= 0.8 * shaped, baseline: "add-shaped LMDB"),
    Figure(
      workload: "2 the same adds, \(otherPath)", metric: "adds/s", ferry: median(other), sqlite: s,
      floor: nil, unit: "/s", target: "(reported: the other write path)", meets: nil),
    Figure(
      workload: "2 LMDB alone, 64 records in one tree a commit", metric: "adds/s", ferry: f, sqlite: nil,
      floor: median(floor), unit: "/s",
      target: "(reported: not what an add writes; its target is retired for the add-shaped line)",
      meets: nil),
  ]
}

/// Adds `count` tasks quickly (64 callers), spread over `groups` groups (none when 0).
func fill(_ store: FerryStore, _ count: Int, groups: Int = 0) async throws -> [TaskID] {
  try await fill(store, count) { groups > 0 ? "g\($0 % groups)" : nil }
}

/// Adds `count` tasks of `tag` quickly (64 callers); task number `i` goes in group `groupOf(i)`.
/// Returns their ids in order.
func fill(
  _ store: FerryStore, _ count: Int, tag: String = "t", groupOf: @escaping @Sendable (Int) -> String?,
  schedule: @escaping @Sendable (Int) -> TaskSchedule = { _ in .now }
) async throws -> [TaskID] {
  try await withThrowingTaskGroup(of: [TaskID].self) { group in
    let callers = 64
    for caller in 0..<callers {
      group.addTask {
        var ids: [TaskID] = []
        var i = caller
        while i < count {
          ids.append(
            try await store.queue.add(
              tag: tag, payload: Item(name: "milk"), groupId: groupOf(i), options: [.schedule(schedule(i))]))
          i += callers
        }
        return ids
      }
    }
    var all: [TaskID] = []
    for try await ids in group { all += ids }
    return all.sorted()
  }
}

/// Records an error on each of `ids` (64 callers), which blocks them and their groups.
func recordErrors(_ store: FerryStore, _ ids: [TaskID]) async throws {
  try await withThrowingTaskGroup(of: Void.self) { group in
    for chunk in stride(from: 0, to: ids.count, by: 64) {
      let slice = ids[chunk..<min(chunk + 64, ids.count)]
      group.addTask { for id in slice { try await store.queue.recordError(id, message: "blocked") } }
    }
    try await group.waitForAll()
  }
}

/// 3. The run loop with a no-op handler: serial, and 8 groups in parallel, on both write paths.
func runLoop(_ sizes: Sizes) async throws -> [Figure] {
  var serial: [Double] = []
  var parallel: [Double] = []
  var otherSerial: [Double] = []
  var otherParallel: [Double] = []
  // The default path with the other choice of the writer's poll (`writerSpin`): it polls by
  // default with the segment, not without.
  var otherPoll: [Double] = []
  var sqlite: [Double] = []
  let n = sizes.runLoop
  // SQLite's loop is timed next to Ferry's serial one on the default path, before it in every
  // other run: a flush's latency on a shared host drifts over seconds, and the two lines are read
  // as a ratio.
  enum Slot { case ferry(groups: Int, isDefault: Bool, flipPoll: Bool), sqlite }
  for run in 0..<sizes.runs {
    let pair: [Slot] = [.ferry(groups: 0, isDefault: true, flipPoll: false), .sqlite]
    let slots: [Slot] =
      (run % 2 == 0 ? pair : pair.reversed()) + [
        .ferry(groups: 8, isDefault: true, flipPoll: false),
        .ferry(groups: 0, isDefault: false, flipPoll: false),
        .ferry(groups: 8, isDefault: false, flipPoll: false),
        .ferry(groups: 0, isDefault: true, flipPoll: true),
      ]
    for slot in slots {
      guard case .ferry(let groups, let isDefault, let flipPoll) = slot else {
        let sp = scratchPath("w3s")
        try FileManager.default.createDirectory(atPath: sp, withIntermediateDirectories: true)
        let peer = try SQLitePeer(path: sp + "/queue.sqlite")
        try await peer.addMany(n) { _ in nil }
        sqlite.append(
          Double(n)
            / (try await seconds {
              var next = try peer.nextRunnable()
              while let id = next { next = try await peer.completeAndNext(id) }
            }))
        try peer.close()
        remove(sp)
        continue
      }
      let fp = scratchPath("w3f")
      var storeConfiguration = FerryStore.Configuration()
      storeConfiguration.writeAheadSegment = isDefault == defaultIsSegment
      if flipPoll { storeConfiguration.writerSpin = defaultIsSegment ? .zero : .microseconds(50) }
      let store = try await FerryStore.open(at: fp, configuration: storeConfiguration)
      _ = try await fill(store, n, groups: groups)
      var configuration = TaskRunner.Configuration()
      configuration.maxConcurrentTasks = groups == 0 ? 1 : 8
      let runner = TaskRunner(queue: store.queue, configuration: configuration)
      runner.register(tag: "t") { _ in .succeeded }
      let rate = Double(n) / (try await seconds { _ = try await runner.run() })
      switch (isDefault, groups == 0, flipPoll) {
      case (true, true, false): serial.append(rate)
      case (true, false, _): parallel.append(rate)
      case (false, true, _): otherSerial.append(rate)
      case (false, false, _): otherParallel.append(rate)
      case (true, true, true): otherPoll.append(rate)
      }
      store.close()
      remove(fp)
    }
  }
  let s = median(sqlite)
  let p = median(parallel)
  let f = median(serial)
  return [
    Figure(
      workload: "3 run loop, no-op handler (\(n), serial)", metric: "tasks/s", ferry: f, sqlite: s,
      floor: nil, unit: "/s", target: "≥ 1× SQLite serial (\(defaultPath))", meets: f >= s),
    Figure(
      workload: "3 run loop, no-op handler (\(n), 8 groups × 8)", metric: "tasks/s", ferry: p, sqlite: s,
      floor: nil, unit: "/s", target: "≥ 3× SQLite serial", meets: p >= 3 * s),
    Figure(
      workload: "3 serial, \(otherPath)", metric: "tasks/s", ferry: median(otherSerial), sqlite: s,
      floor: nil, unit: "/s", target: "(reported: the other write path)", meets: nil),
    Figure(
      workload: "3 8 groups × 8, \(otherPath)", metric: "tasks/s", ferry: median(otherParallel),
      sqlite: s, floor: nil, unit: "/s", target: "(reported: the other write path)", meets: nil),
    Figure(
      workload: defaultIsSegment
        ? "3 serial, the writer never polls" : "3 serial, the writer polls 50 µs (writerSpin)",
      metric: "tasks/s", ferry: median(otherPoll), sqlite: s, floor: f, unit: "/s",
      target: "(reported: the writer's poll between commits, on by default with the segment)", meets: nil,
      baseline: "default"),
  ]
}

/// 3. The run loop with a batched no-op handler (16 tasks a call) against single runs: one claim
/// commit and one outcome commit serve 16 tasks.
func batchedRunLoop(_ sizes: Sizes) async throws -> [Figure] {
  var single: [Double] = []
  var batched: [Double] = []
  let n = sizes.runLoop
  for _ in 0..<sizes.runs {
    for batch in [false, true] {
      let fp = scratchPath("w3b")
      let store = try await FerryStore.open(at: fp)
      _ = try await fill(store, n)
      let runner = TaskRunner(queue: store.queue)
      if batch {
        runner.register(tag: "t", batchSize: 16) { tasks in
          Dictionary(uniqueKeysWithValues: tasks.map { ($0.id, TaskResult.succeeded) })
        }
      } else {
        runner.register(tag: "t") { _ in .succeeded }
      }
      let rate = Double(n) / (try await seconds { _ = try await runner.run() })
      if batch { batched.append(rate) } else { single.append(rate) }
      store.close()
      remove(fp)
    }
  }
  return [
    Figure(
      workload: "3 run loop, batches of 16 (\(n), serial)", metric: "tasks/s", ferry: median(batched),
      sqlite: nil,
      floor: median(single), unit: "/s", target: "(reported: against single runs)", meets: nil,
      baseline: "single runs")
  ]
}

/// 4. Next-runnable lookup with many pending tasks, some blocked.
func lookups(_ sizes: Sizes) async throws -> [Figure] {
  let fp = scratchPath("w4f")
  defer { remove(fp) }
  let store = try await FerryStore.open(at: fp)
  defer { store.close() }
  let blocked = sizes.lookupBlocked
  // The first `blocked` tasks: pairs in their own group, each head blocked by a recorded error.
  var heads: [TaskID] = []
  for i in 0..<(blocked / 2) {
    heads.append(try await store.queue.add(tag: "t", payload: Item(name: "blocked"), groupId: "b\(i)"))
    _ = try await store.queue.add(tag: "t", payload: Item(name: "behind"), groupId: "b\(i)")
  }
  try await recordErrors(store, heads)
  _ = try await fill(store, sizes.lookupPending - blocked)
  var ferry: [Double] = []
  for _ in 0..<sizes.lookups {
    let start = ContinuousClock.now
    _ = try store.queue.nextRunnable()
    let elapsed = ContinuousClock.now - start
    ferry.append(Double(elapsed.components.attoseconds) / 1e12 + Double(elapsed.components.seconds) * 1e6)
  }

  let sp = scratchPath("w4s")
  defer { remove(sp) }
  try FileManager.default.createDirectory(atPath: sp, withIntermediateDirectories: true)
  let peer = try SQLitePeer(path: sp + "/queue.sqlite")
  try await peer.addMany(blocked) { "b\($0 / 2)" }
  for id in try peer.firstIDs(blocked) where id % 2 == 1 {
    try await peer.recordError(id, message: "blocked")
  }
  try await peer.addMany(sizes.lookupPending - blocked) { _ in nil }
  var sqlite: [Double] = []
  for _ in 0..<sizes.lookups {
    let start = ContinuousClock.now
    _ = try peer.nextRunnable()
    let elapsed = ContinuousClock.now - start
    sqlite.append(Double(elapsed.components.attoseconds) / 1e12 + Double(elapsed.components.seconds) * 1e6)
  }
  try peer.close()
  let label = "4 next runnable (\(sizes.lookupPending) pending, \(blocked) blocked)"
  let p50 = percentile(ferry, 50)
  let p99 = percentile(ferry, 99)
  return [
    Figure(
      workload: label, metric: "p50", ferry: p50, sqlite: percentile(sqlite, 50), floor: nil, unit: "µs",
      target: "p50 ≤ 20 µs", meets: p50 <= 20),
    Figure(
      workload: label, metric: "p99", ferry: p99, sqlite: percentile(sqlite, 99), floor: nil, unit: "µs",
      target: "p99 ≤ 100 µs", meets: p99 <= 100),
  ]
}

/// Writes a log of `count` task-add events (schema version 3, as Ferry writes them now:
/// `Specs/task-events.md`) in big batches.
func buildLog(_ path: String, events count: Int) async throws {
  let store = try await FerryStore.open(at: path)
  defer { store.close() }
  var written = 0
  while written < count {
    let batch = min(10_000, count - written)
    let events = (0..<batch).map { i -> NewEvent in
      var writer = PayloadWriter()
      writer.write("t")
      writer.write(bytes: Array(payloadData))
      writer.write(String?.none)
      writer.write((written + i) % 10 == 0 ? "g\((written + i) % 100)" : String?.none)
      writer.write(false)
      writer.write(UInt8(0))
      writer.write(UInt8(0))  // priority: normal
      writer.write(Int64?.none)  // no deadline
      writer.write(Int64?.none)  // no start time
      writer.write(Int64?.none)  // no interval
      return NewEvent(type: "task.added", schemaVersion: 3, payload: writer.bytes)
    }
    _ = try await store.log.append(events)
    written += batch
  }
}

/// 5–7. Rebuild of every projection from a large log, open time as the log grows, peak memory.
func rebuildAndOpen(_ sizes: Sizes) async throws -> [Figure] {
  var figures: [Figure] = []
  let path = scratchPath("w5")
  defer { remove(path) }
  try await buildLog(path, events: sizes.rebuildEvents)
  let n = sizes.rebuildEvents
  let scanRate = Double(n) / (try await seconds { _ = try LMDBFloor.scan(path: path) })
  let store = try await FerryStore.open(at: path)
  // What the workloads before this one freed, glibc keeps in its arenas (the run loop's lanes
  // leave some 50 MiB there, all of it free: `malloc_trim` gives it back). Returned first, so
  // the figure is what the rebuild itself holds at its peak, not the free lists of earlier work.
  returnFreedHeap()
  resetPeakMemory()
  let before = peakMemory()
  let sampler = AnonymousMemorySampler()
  let rebuildRate = Double(n) / (try await seconds { _ = try await store.log.rebuild() })
  let peakAnonymous = sampler.stop()
  let peak = peakMemory()
  store.close()
  figures.append(
    Figure(
      workload: "5 rebuild of all projections (\(n) events)", metric: "events/s", ferry: rebuildRate,
      sqlite: nil,
      floor: scanRate, unit: "/s", target: "≥ 1M/s and within 3× of a bare scan",
      meets: rebuildRate >= 1_000_000 && rebuildRate * 3 >= scanRate))
  figures.append(
    Figure(
      workload: "7 peak heap (anonymous RSS) in that rebuild", metric: "RssAnon",
      ferry: Double(peakAnonymous) / 1_048_576, sqlite: nil, floor: nil, unit: "MiB", target: "≤ 64 MB",
      meets: Double(peakAnonymous) <= 64 * 1_000_000))
  figures.append(
    Figure(
      workload: "7 peak RSS with the mapped file (VmHWM)", metric: "RSS", ferry: Double(peak) / 1_048_576,
      sqlite: nil, floor: Double(before) / 1_048_576, unit: "MiB", target: "(reported: file pages are cache)",
      meets: nil))

  for size in sizes.openSizes {
    let openPath = size == n ? path : scratchPath("w6")
    if size != n { try await buildLog(openPath, events: size) }
    var times: [Double] = []
    for _ in 0..<5 {
      var opened: FerryStore?
      times.append(try await seconds { opened = try await FerryStore.open(at: openPath) } * 1000)
      opened?.close()
    }
    if size != n { remove(openPath) }
    let t = median(times)
    figures.append(
      Figure(
        workload: "6 open a store of \(size) events", metric: "open", ferry: t, sqlite: nil, floor: nil,
        unit: "ms",
        target: "≤ 10 ms, flat", meets: t <= 10))
  }
  return figures
}
