import Foundation
import Synchronization
import TestSupport
import Testing

/// The crash worker, run as a child process: its stdout lines, and how it ended.
struct WorkerRun {
  let lines: [String]
  let status: Int32
  let killed: Bool
}

/// Spawns `ferry-crash-worker` (never forks), collects its stdout, and kills it with SIGKILL after
/// `killAfter` (if given and it still runs) or after `limit` in any case.
func runWorker(
  _ arguments: [String], environment: [String: String] = [:], killAfter: Duration?, limit: Duration
)
  async throws -> WorkerRun
{
  let worker = try BesideWorker(arguments, environment: environment)
  let process = worker.process
  let start = ContinuousClock.now
  var killedByUs = false
  while process.isRunning {
    let elapsed = ContinuousClock.now - start
    if let killAfter, elapsed >= killAfter {
      kill(process.processIdentifier, SIGKILL)
      killedByUs = true
      break
    }
    if elapsed >= limit {
      kill(process.processIdentifier, SIGKILL)
      killedByUs = true
      break
    }
    try await Task.sleep(for: .milliseconds(2))
  }
  let lines = worker.finish()
  let status = process.terminationStatus
  let killed = killedByUs || (process.terminationReason == .uncaughtSignal && status == SIGKILL)
  return WorkerRun(lines: lines, status: status, killed: killed)
}

/// A worker process (spawned, never forked) whose stdout is collected: the workload, the checker,
/// or the `runner` beside the workload (another process on the same store), killed when the round
/// ends.
final class BesideWorker: Sendable {
  let process = Process()
  private let collected = Mutex(Data())
  private let finished = DispatchSemaphore(value: 0)

  init(_ arguments: [String], environment: [String: String]) throws {
    process.executableURL = productURL("ferry-crash-worker")
    process.arguments = arguments
    process.environment = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
    let out = Pipe()
    process.standardOutput = out
    process.standardError = FileHandle.nullDevice
    try process.run()
    Thread.detachNewThread { [self] in  // its own thread: it blocks until the worker ends
      let data = out.fileHandleForReading.readAll()
      collected.withLock { $0 = data }
      finished.signal()
    }
  }

  /// Kills it (if it still runs) and returns its lines.
  func kill() -> [String] {
    Foundation.kill(process.processIdentifier, SIGKILL)
    return finish()
  }

  /// Waits for it to exit and returns its lines.
  func finish() -> [String] {
    process.waitUntilExit()
    finished.wait()
    return String(decoding: collected.withLock { $0 }, as: UTF8.self).split(separator: "\n").map(String.init)
  }
}

/// A small, seeded random source for the harness's own choices.
struct HarnessRandom {
  var state: UInt64
  mutating func next() -> UInt64 {
    state &+= 0x9E37_79B9_7F4A_7C15
    var z = state
    z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
    z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
    return z ^ (z >> 31)
  }
  mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
}

@Suite(.timeLimit(.minutes(20))) struct CrashTests {
  /// Kills the workload hundreds of times — at random moments and at every labelled crash point,
  /// sometimes a second time during recovery — and checks every invariant after each kill.
  @Test func nothingAcknowledgedIsLostAcrossHundredsOfKills() async throws {
    let environment = ProcessInfo.processInfo.environment
    let target = environment["FERRY_CRASH_KILLS"].flatMap(Int.init) ?? 200
    let seed =
      environment["FERRY_CRASH_SEED"].flatMap(UInt64.init) ?? UInt64(Date().timeIntervalSince1970 * 1000)
    var random = HarnessRandom(state: seed)
    let base = FileManager.default.temporaryDirectory.path + "/ferry-crash-\(seed)"
    defer { try? FileManager.default.removeItem(atPath: base) }
    // The stores use the write-ahead segment, the default, and its own points are armed too
    // (Specs/one-sync-commit.md §8); FERRY_WRITE_AHEAD_SEGMENT=0 (inherited by every worker)
    // runs them on flushed commits.
    let segment = environment["FERRY_WRITE_AHEAD_SEGMENT"] != "0"
    var points = ["append.beforeCommit", "append.afterCommit", "handler", "rebuild.chunk", "compaction"]
    if segment {
      points += [
        "segment.frameFlushed", "segment.frameFlushed", "segment.checkpointSynced",
        "segment.checkpointWritten",
        "segment.replay",
      ]
    }
    print(
      "crash: seed \(seed) (FERRY_CRASH_SEED=\(seed) replays this run), \(target) kills"
        + (segment ? ", write-ahead segment" : ", flushed commits"))

    var kills = 0
    var runners = 0
    var acknowledged = 0
    var lost = 0
    var violations: [String] = []
    var store = ""
    var acks: [String] = []
    var roundsLeft = 0
    var storeNumber = 0
    while kills < target {
      if roundsLeft == 0 {
        storeNumber += 1
        store = base + "/store-\(storeNumber)"
        acks = []
        roundsLeft = 1 + random.below(6)
      }
      roundsLeft -= 1
      let workSeed = random.next() % 1_000_000
      var workerEnvironment: [String: String] = [:]
      var killAfter: Duration?
      let mode = random.below(10)
      if acks.isEmpty && mode == 0 {
        workerEnvironment["FERRY_CRASH_POINT"] = "create.beforeMeta"
      } else if mode < 5 {
        killAfter = .milliseconds(15 + random.below(150))
      } else {
        workerEnvironment["FERRY_CRASH_POINT"] = points[random.below(points.count)]
        workerEnvironment["FERRY_CRASH_AFTER"] = "\(1 + random.below(25))"
      }
      // Most rounds have a second process running passes on the same store beside the workload;
      // it may die at its own crash point, and is killed when the round ends.
      var beside: BesideWorker?
      if !acks.isEmpty && random.below(3) != 0 {
        var besideEnvironment: [String: String] = [:]
        if random.below(3) == 0 {
          besideEnvironment["FERRY_CRASH_POINT"] = "handler"
          besideEnvironment["FERRY_CRASH_AFTER"] = "\(1 + random.below(10))"
        }
        beside = try BesideWorker(
          ["runner", store, "\(random.next() % 1_000_000)"], environment: besideEnvironment)
        runners += 1
      }
      let run = try await runWorker(
        ["workload", store, "\(workSeed)"], environment: workerEnvironment, killAfter: killAfter,
        limit: .seconds(3))
      if run.killed { kills += 1 }
      let besideLines = beside?.kill() ?? []
      // Both processes acknowledge what they see committed; an event is acknowledged once.
      let newAcks = Array(
        Set(run.lines.filter { $0.hasPrefix("ack ") } + besideLines.filter { $0.hasPrefix("ack ") }))
      acks += newAcks
      acknowledged += newAcks.count
      let ackFile = base + "/acks-\(storeNumber).txt"
      try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
      try acks.joined(separator: "\n").write(toFile: ackFile, atomically: true, encoding: .utf8)

      // Sometimes a second kill, during recovery (it only fires when a run was in flight, or —
      // with the segment — while frames are replayed).
      if random.below(6) == 0 {
        let point = segment && random.below(2) == 0 ? "segment.replay" : "recovery"
        let recovery = try await runWorker(
          ["check", store, ackFile], environment: ["FERRY_CRASH_POINT": point], killAfter: nil,
          limit: .seconds(60))
        if recovery.killed { kills += 1 }
      }
      let check = try await runWorker(["check", store, ackFile], killAfter: nil, limit: .seconds(60))
      if check.killed {
        violations.append("store \(storeNumber), worker seed \(workSeed): reopening hung for 60 s")
      }
      let lostHere = check.lines.first { $0.hasPrefix("lost ") }.flatMap { Int($0.dropFirst(5)) } ?? 0
      let found = check.lines.filter { $0.hasPrefix("violation: ") }
      lost += lostHere
      if !found.isEmpty || lostHere > 0 || (check.status != 0 && !check.killed) {
        let keep =
          FileManager.default.temporaryDirectory.path + "/ferry-crash-failures/\(seed)-\(storeNumber)"
        try? FileManager.default.createDirectory(atPath: keep, withIntermediateDirectories: true)
        try? FileManager.default.removeItem(atPath: keep)
        try? FileManager.default.copyItem(atPath: store, toPath: keep)
        violations += found.map { "store \(storeNumber) (kept at \(keep)), worker seed \(workSeed): \($0)" }
        if found.isEmpty {
          violations.append("store \(storeNumber): check exited \(check.status) (kept at \(keep))")
        }
      }
    }
    print(
      (segment ? "crash (write-ahead segment): " : "crash: ")
        + "\(kills) kills, \(acknowledged) acknowledged events, \(lost) lost, \(violations.count) invariant violations"
        + " (\(runners) rounds with a second runner process)"
    )
    for violation in violations.prefix(20) { print("crash: \(violation)") }
    #expect(lost == 0)
    #expect(violations.isEmpty, "seed \(seed): \(violations.prefix(5))")
    #expect(kills >= target)
  }
}
