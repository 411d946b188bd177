@_spi(Engine) @_spi(Experimental) import Ferry
import FerryLog
import FerryTesting
import Foundation
import Synchronization

/// The seeded random workload the crash tests kill again and again: adds (groups, manual, unique
/// policies), passes whose handlers succeed, fail or record errors, resolves, cancels, clears,
/// cache fetches and rebuilds — and, right after each event is durable, an `ack` line:
/// `ack <sequence> <type> <crc32c of the stored record>`.
///
/// It runs until killed, or for `operations` operations.
public func runCrashWorkload(
  path: String, seed: UInt64, operations: Int? = nil, ack: @escaping @Sendable (String) -> Void
)
  async throws
{
  let (store, clock) = try await openCrashStore(path, rebuildChunkSize: 16)
  defer { store.close() }
  startRandomWriteback(path)
  let acker = try Acker(store, ack: ack)
  defer { acker.task?.cancel() }

  let random = Mutex(SeededRandom(seed: seed))
  let roll: @Sendable () -> Double = { random.withLock { $0.unit() } }
  func pick<T>(_ items: [T]) -> T { items[Int(roll() * Double(items.count)) % items.count] }

  let runner = crashRunner(store, roll: roll, maxConcurrentTasks: 1)
  for tag in ["a", "b", "c"] {
    runner.register(tag: tag) { task in
      CrashPoint.reach("handler")
      let dice = roll()
      if dice < 0.6 { return .succeeded }
      if dice < 0.85 { return .failed("flaky") }
      if dice < 0.95 { return .recordError("user must fix \(task.id)") }
      return .failed("rejected", retryable: false)
    }
  }

  var done = 0
  while operations.map({ done < $0 }) ?? true {
    done += 1
    clock.advance(by: .milliseconds(Int64(50 + roll() * 400)))
    let choice = roll()
    if choice < 0.38 {
      let unique = roll() < 0.15 ? pick([UniquePolicy.keep, .replace]) : .append
      try await store.queue.add(
        tag: pick(["a", "b", "c"]), payload: ["n": done],
        dataId: unique == .append ? nil : pick(["d1", "d2", "d3"]),
        groupId: pick([nil, "g1", "g2", "g3", "g4"]),
        options: TaskOptions(manual: roll() < 0.05, unique: unique))
    } else if choice < 0.62 {
      _ = try await runner.run()
    } else if choice < 0.72 {
      if let blocked = try store.queue.errors().first { try await store.queue.resolveError(blocked.taskId) }
    } else if choice < 0.79 {
      let pending = try store.queue.pendingTasks()
      if !pending.isEmpty { try? await store.queue.cancel(pick(pending).id) }
    } else if choice < 0.81 {
      try await store.queue.clear()
    } else if choice < 0.93 {
      let outcome: FetchResult = roll() < 0.8 ? .success(isEmpty: roll() < 0.2) : .failure("503")
      try await store.ledger.recordFetch(key: pick(["k1", "k2", "k3", "k4"]), outcome: outcome)
    } else if choice < 0.94 {
      _ = try await store.log.rebuild()
    } else if choice < 0.96 {
      _ = try await store.compact(retention: .milliseconds(Int64(roll() * 5000)))
    } else {
      if let dead = try store.queue.pendingTasks().first(where: { $0.status == .dead }) {
        try await store.queue.revive(dead.id)
      }
    }
  }
  // Let the acker catch up before a clean end (to what is durable: a last claim may not be).
  let head = EventLog.acknowledgedHead(in: store.log.path) ?? 0
  while acker.acked.withLock({ $0 }) < head { await Task.yield() }
}

/// The crash tests' second runner: another process on the same store that only runs passes (with
/// the workload's handlers) until killed, acknowledging what it sees committed like the workload.
public func runCrashRunner(path: String, seed: UInt64, ack: @escaping @Sendable (String) -> Void) async throws
{
  let (store, clock) = try await openCrashStore(path, rebuildChunkSize: nil)
  defer { store.close() }
  // Appends by the workload's process cannot wake this one: poll for them.
  let acker = try Acker(store, pollInterval: .milliseconds(5), ack: ack)
  defer { acker.task?.cancel() }
  let random = Mutex(SeededRandom(seed: seed))
  let roll: @Sendable () -> Double = { random.withLock { $0.unit() } }
  let runner = crashRunner(store, roll: roll, maxConcurrentTasks: 2)
  for tag in ["a", "b", "c"] {
    runner.register(tag: tag) { task in
      CrashPoint.reach("handler")
      try? await Task.sleep(for: .milliseconds(Int64(roll() * 3)))
      let dice = roll()
      if dice < 0.7 { return .succeeded }
      if dice < 0.9 { return .failed("flaky") }
      return .recordError("user must fix \(task.id)")
    }
  }
  while true {
    clock.advance(by: .milliseconds(Int64(50 + roll() * 400)))
    let report: PassReport
    do {
      report = try await runner.run()
    } catch .notCurrent {
      // Reads now catch a projection up themselves while the workload's process rebuilds it in
      // chunks (EventLog.read); this stays as a guard for a rebuild at another version, which
      // the workload never does.
      try await Task.sleep(for: .milliseconds(5))
      continue
    } catch {
      throw error
    }
    if report.entries.isEmpty { try await Task.sleep(for: .milliseconds(2)) }
  }
}

/// Whether the crash stores use the write-ahead segment, the default (`Specs/one-sync-commit.md`):
/// `FERRY_WRITE_AHEAD_SEGMENT=0` runs the kill and power-loss campaigns on flushed commits instead.
public let crashStoresUseSegment: Bool =
  ProcessInfo.processInfo.environment["FERRY_WRITE_AHEAD_SEGMENT"] != "0"

/// Opens a crash-test store on a simulated clock that continues from the last event, so retries
/// keep coming due across restarts.
private func openCrashStore(_ path: String, rebuildChunkSize: Int?) async throws -> (FerryStore, ManualClock)
{
  let clock = ManualClock(date: Date(unixMilliseconds: 1_768_467_600_000))
  var configuration = FerryStore.Configuration()
  clock.install(in: &configuration)
  if let rebuildChunkSize { configuration.rebuildChunkSize = rebuildChunkSize }
  configuration.initialMapSize = 64 << 10
  configuration.writeAheadSegment = crashStoresUseSegment
  let store = try await FerryStore.open(at: path, configuration: configuration)
  do {
    if let last = try store.log.event(at: try store.log.head()) {
      clock.set(max(clock.date, Date(unixMilliseconds: last.timestamp + 1)))
    }
  } catch {
    store.close()
    throw error
  }
  return (store, clock)
}

/// Acknowledges every event once it is durable: a tail that wakes right after each commit, and
/// waits for the store's head mark (raised after each flushed commit, by any process) to reach the
/// event — a runner's claim with the write-ahead segment is visible before it is flushed.
private final class Acker: Sendable {
  /// The last sequence acknowledged.
  let acked: Mutex<UInt64>
  private let started = Mutex<Task<Void, any Error>?>(nil)

  init(_ store: FerryStore, pollInterval: Duration? = nil, ack: @escaping @Sendable (String) -> Void) throws {
    let start = try store.log.head()
    acked = Mutex(start)
    let task = Task { [self] in
      let path = store.log.path
      for try await event in store.log.tail(after: start, pollInterval: pollInterval) {
        while (EventLog.acknowledgedHead(in: path) ?? 0) < event.sequence {
          try await Task.sleep(for: .milliseconds(1))
        }
        guard let record = try store.log.record(at: event.sequence) else { continue }
        ack("ack \(event.sequence) \(event.type) \(String(CRC32C.checksum(record), radix: 16))")
        acked.withLock { $0 = event.sequence }
      }
    }
    started.withLock { $0 = task }
  }

  var task: Task<Void, any Error>? { started.withLock { $0 } }
}

/// With `FERRY_RANDOM_WRITEBACK=1` (Linux): a thread that keeps pushing pieces of `data.mdb` and
/// `ferry-segment` out of the page cache in no particular order — the meta pages often, other
/// pages at random — as a kernel's writeback may, so that a power cut (Tools/power-loss.sh) finds
/// the file in states no flush ordered: a meta page on disk whose tree is not, for one. Only
/// unflushed writes are affected; what was flushed is on disk either way.
func startRandomWriteback(_ path: String) {
  #if os(Linux)
    guard ProcessInfo.processInfo.environment["FERRY_RANDOM_WRITEBACK"] == "1" else { return }
    let thread = Thread {
      var random = SeededRandom(seed: UInt64(getpid()))
      while true {
        for name in ["data.mdb", "ferry-segment"] {
          let fd = open(path + "/" + name, O_RDONLY | O_CLOEXEC)
          guard fd >= 0 else { continue }
          var info = stat()
          let size = fstat(fd, &info) == 0 ? Int(info.st_size) : 0
          let pages = max(1, size / 4096)
          if random.unit() < 0.4 {
            _ = posix_fadvise(fd, 0, 2 * 65536, POSIX_FADV_DONTNEED)  // both meta pages, any page size
          } else {
            let first = Int(random.unit() * Double(pages))
            _ = posix_fadvise(
              fd, off_t(first * 4096), off_t((1 + Int(random.unit() * 16)) * 4096), POSIX_FADV_DONTNEED)
          }
          close(fd)
        }
        usleep(UInt32(500 + random.unit() * 2500))
      }
    }
    thread.start()
  #endif
}

/// A runner with the crash workloads' retry policy, drawing its jitter from the seeded `roll`.
func crashRunner(
  _ store: FerryStore, roll: @escaping @Sendable () -> Double, maxConcurrentTasks: Int
)
  -> TaskRunner
{
  var configuration = TaskRunner.Configuration()
  configuration.random = { roll() }
  configuration.maxConcurrentTasks = maxConcurrentTasks
  configuration.defaultRetry = RetryPolicy(
    maxAttempts: 4, initialDelay: .milliseconds(500), multiplier: 2, jitter: 0.2)
  return TaskRunner(queue: store.queue, configuration: configuration)
}
