import Foundation
import Synchronization
import TestSupport
import Testing

@testable import FerryLog

/// A hostile user's attacks on the writer's poll for its next job (`Configuration.writerSpin`):
/// configuration values at the edges, close racing a poll and many callers, reads that fall back
/// into a polling writer while another process writes, exclusive jobs during a poll, a process
/// killed while its writer polls, and one processor. Every check of what was kept reads the log
/// back, never a counter the code keeps (the poll counters only show that the writer polled).
@Suite(.timeLimit(.minutes(20))) struct WriterSpinRaceTests {
  // MARK: - Hostile windows

  /// Durations at the edges are clamped as documented (≤ 10 ms, negative none) and never trap —
  /// a Duration past Int64.max seconds is valid, and its `components` trap (the policy read them
  /// first, so `.seconds(Int64.max) * 2` crashed the process at open).
  @Test func hostileWindowsAreClampedWithoutATrap() async throws {
    let huge = Duration.seconds(Int64.max) * 2
    let cases: [(Duration, UInt64)] = [
      (.seconds(Int64.max), 10_000_000),
      (huge, 10_000_000),
      (.seconds(Int64.max) + .seconds(Int64.max) + .seconds(Int64.max), 10_000_000),
      (.nanoseconds(Int64.max), 10_000_000),
      (.seconds(1e19), 10_000_000),
      (Duration(secondsComponent: Int64.max, attosecondsComponent: 999_999_999_999_999_999), 10_000_000),
      (.milliseconds(10), 10_000_000),
      (.microseconds(10_001), 10_000_000),
      (.nanoseconds(9_999_999), 9_999_999),
      (.nanoseconds(1), 1),
      // Less than a nanosecond positive: rounds down to no poll at all.
      (Duration(secondsComponent: 0, attosecondsComponent: 1), 0),
      (Duration(secondsComponent: 0, attosecondsComponent: 999_999_999), 0),
      (.zero, 0),
      (Duration(secondsComponent: 0, attosecondsComponent: -1), 0),
      (.nanoseconds(-1), 0),
      (.nanoseconds(Int64.min), 0),
      (.seconds(Int64.min), 0),
      (.seconds(Int64.min) * 2, 0),
      (.seconds(-1e19), 0),
    ]
    #expect(SpinPolicy.usableProcessors() >= 1)
    #expect(SpinPolicy.usableProcessors() <= ProcessInfo.processInfo.activeProcessorCount)
    for (window, expected) in cases {
      #expect(SpinPolicy(window: window, processors: 2).window == expected, "\(window)")
      #expect(SpinPolicy(window: window, processors: 1).window == 0, "\(window)")
      #expect(SpinPolicy(window: window, processors: 0).window == 0, "\(window)")
      #expect(SpinPolicy(window: window, processors: Int.max).window == expected, "\(window)")
    }
    // The same values through the configuration: a store opens, appends and closes with each.
    let processors = SpinPolicy.usableProcessors()
    let store = TemporaryStore()
    defer { store.remove() }
    for (index, (window, expected)) in cases.enumerated() {
      let log = try store.open([CountByType()]) {
        $0.writeAheadSegment = index % 2 == 0
        $0.writerSpin = window
      }
      #expect(log.writer?.spinWindow == (processors > 1 ? expected : 0), "\(window)")
      for i in 0..<12 { _ = try await log.append(NewEvent(type: "w\(index)", payload: payload("\(i)"))) }
      log.close()
    }
    let log = try store.open([CountByType()])
    defer { log.close() }
    let events = try log.events(after: 0, limit: 10_000)
    #expect(events.map(\.sequence) == Array(1...UInt64(cases.count * 12)))
    #expect(try counts(log) == Dictionary(uniqueKeysWithValues: cases.indices.map { ("w\($0)", UInt64(12)) }))
  }

  // MARK: - Close against a polling writer

  /// Sixteen tasks append one event after another (every commit one request of one event when the
  /// writer wins the race, so it polls) until close() — called from another task at an arbitrary
  /// moment — refuses them: every call ends (acknowledged, or `closed`), nothing hangs, and the log
  /// holds exactly the acknowledged events, once each. After close a submit is refused at once.
  @Test(arguments: [false, true]) func closeRacingManyCallersAndAPollLosesAndRepeatsNothing(
    segment: Bool
  ) async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    var acknowledged: [UInt64: String] = [:]
    for round in 0..<6 {
      let log = try store.open([CountByType()]) {
        $0.writeAheadSegment = segment
        $0.writerSpin = .milliseconds(2)
      }
      let results = try await withThrowingTaskGroup(of: ([UInt64: String], (any Error)?).self) { group in
        for caller in 0..<16 {
          group.addTask {
            var mine: [UInt64: String] = [:]
            var i = 0
            while true {
              let text = "r\(round) c\(caller) \(i)"
              do {
                mine[try await log.append(NewEvent(type: "x", payload: payload(text)))] = text
              } catch {
                return (mine, error)
              }
              i += 1
            }
          }
        }
        group.addTask {
          // A single caller alone first (the writer polls), the crowd after.
          try await Task.sleep(for: .milliseconds(5 + 7 * round))
          await Task.detached { log.close() }.value
          return ([:], nil)
        }
        var all: [([UInt64: String], (any Error)?)] = []
        for try await result in group { all.append(result) }
        return all
      }
      for (mine, error) in results {
        for (sequence, text) in mine {
          #expect(
            acknowledged.updateValue(text, forKey: sequence) == nil, "sequence \(sequence) acknowledged twice"
          )
        }
        if let error { #expect(isClosedError(error), "\(error)") }
      }
      #expect(results.filter { $0.1 != nil }.count == 16)
      // After close: a submit is refused, an append and an execute throw `closed`, nothing hangs.
      #expect(log.writer?.submit(.exclusive {}) == false)
      do {
        _ = try await log.append(NewEvent(type: "late", payload: []))
        Issue.record("an append after close was acknowledged")
      } catch {
        #expect(isClosedError(error), "\(error)")
      }
      do {
        _ = try await log.execute { _ in 1 }
        Issue.record("a command after close ran")
      } catch {
        #expect(isClosedError(error), "\(error)")
      }
      log.close()  // a second close returns
    }
    let log = try store.open([CountByType()])
    defer { log.close() }
    let events = try log.events(after: 0, limit: 1_000_000)
    #expect(events.count == acknowledged.count, "the log holds events nobody was told of, or lost some")
    #expect(events.map(\.sequence) == Array(1...UInt64(events.count)))
    for event in events {
      #expect(
        acknowledged[event.sequence] == String(decoding: event.payload, as: UTF8.self), "\(event.sequence)")
    }
    #expect(Set(events.map(\.payload)).count == events.count)
    #expect(try counts(log) == ["x": UInt64(acknowledged.count)])
  }

  // MARK: - Reads and exclusive jobs while the writer polls, another process writing

  /// This process appends in a serial loop (its writer polls) while another process appends in a
  /// serial loop of its own with the poll (without this process's projection: ours falls behind,
  /// and our reads fall back to a catch-up or a turn in our writer), read-only processes read the
  /// head, a thread reads the projection — also from inside another read (refused or served at
  /// once, never a hang) — and from the writer's own thread (a command), and rebuilds and a
  /// compaction that removes nothing are submitted as exclusive jobs. Every acknowledged event is
  /// in the log once, the projection counts them all, and each read's counts only grow.
  @Test func readsNestedReadsAndExclusiveJobsBesideAPollingWriterAndAnotherProcess() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open([CountByType()]) {
      $0.writeAheadSegment = true
      $0.writerSpin = .milliseconds(2)
    }
    defer { log.close() }
    let count = 400
    let other = try SpinWorker(["spin-append", store.path, "\(count)", "2000", "bare"])
    async let heads = withThrowingTaskGroup(of: Int32.self) { group in
      for _ in 0..<3 {
        group.addTask { try await runProduct("ferry-test-worker", ["log-head", store.path]).status }
      }
      var statuses: [Int32] = []
      for try await status in group { statuses.append(status) }
      return statuses
    }

    // The reading thread: plain reads (which fall back when the other process moved the log on),
    // and reads inside reads, until told to stop.
    let stop = Atomic<Bool>(false)
    let readerOutcome = Mutex<
      (
        reads: Int, nested: Int, nestedRefused: Int, errors: [String], lastLocal: UInt64, lastWorker: UInt64,
        regressions: Int
      )
    >(
      (0, 0, 0, [], 0, 0, 0))
    let readerDone = DispatchSemaphore(value: 0)
    Thread.detachNewThread {
      defer { readerDone.signal() }
      while !stop.load(ordering: .relaxed) {
        do {
          let now = try counts(log)
          readerOutcome.withLock { outcome in
            outcome.reads += 1
            let local = now["local", default: 0]
            let worker = now["worker.event", default: 0]
            if local < outcome.lastLocal || worker < outcome.lastWorker { outcome.regressions += 1 }
            outcome.lastLocal = local
            outcome.lastWorker = worker
          }
          do {
            _ = try log.read { _ in try counts(log) }
            readerOutcome.withLock { $0.nested += 1 }
          } catch FerryLogError.projectionNotCurrent {
            readerOutcome.withLock { $0.nestedRefused += 1 }
          }
        } catch {
          readerOutcome.withLock { $0.errors.append("\(error)") }
        }
      }
    }

    var acknowledged: [UInt64: String] = [:]
    var rebuilds = 0
    var commandReads = (served: 0, refused: 0)
    for i in 0..<count {
      let text = "local \(i)"
      acknowledged[try await log.append(NewEvent(type: "local", payload: payload(text)))] = text
      if i % 100 == 50 {
        // An exclusive job submitted right after an append, while the writer polls.
        _ = try await log.rebuild(["countByType"])
        rebuilds += 1
      }
      if i % 100 == 80 {
        _ = try await log.compact(removing: { _ in false })
      }
      if i % 25 == 10 {
        // A read on the writer's own thread: served from the transaction's own view, or refused
        // at once when the projection is behind (it would wait for itself) — never a hang.
        let served = try await log.execute { _ -> Bool in
          do {
            _ = try counts(log)
            return true
          } catch FerryLogError.projectionNotCurrent {
            return false
          }
        }
        if served { commandReads.served += 1 } else { commandReads.refused += 1 }
      }
    }
    let otherStatus = try await other.wait()
    stop.store(true, ordering: .relaxed)
    readerDone.wait()
    #expect(otherStatus == 0)
    #expect(try await heads == [0, 0, 0])
    let otherAcks = other.acks
    #expect(otherAcks.count == count)
    let reader = readerOutcome.withLock { $0 }
    #expect(reader.errors.isEmpty, "\(reader.errors.prefix(3))")
    #expect(reader.regressions == 0)
    #expect(reader.reads > 0)

    let total = 2 * count
    let events = try log.events(after: 0, limit: total + 10)
    #expect(events.map(\.sequence) == Array(1...UInt64(total)))
    let texts = events.map { String(decoding: $0.payload, as: UTF8.self) }
    #expect(Set(texts).count == total)
    for (sequence, text) in acknowledged { #expect(texts[Int(sequence) - 1] == text) }
    for ack in otherAcks { #expect(texts[Int(ack.sequence) - 1] == "worker \(ack.index)") }
    #expect(texts.filter { $0.hasPrefix("local ") } == (0..<count).map { "local \($0)" })
    #expect(texts.filter { $0.hasPrefix("worker ") } == (0..<count).map { "worker \($0)" })
    #expect(try counts(log) == ["local": UInt64(count), "worker.event": UInt64(count)])
    #expect(try log.verify().isHealthy)
    // That the writers did poll (not what was kept): both processes' counters.
    #expect(log.statistics.writerSpins > 0)
    #expect(other.spins.map { $0 > 0 } == true, "\(other.output.suffix(3))")
    print(
      "WriterSpinAttack reads: \(reader.reads) reads, \(reader.nested) nested served, \(reader.nestedRefused) refused,"
        + " \(log.readsRunInWriter) run in the writer; commands' reads \(commandReads); rebuilds \(rebuilds);"
        + " spins here \(log.statistics.writerSpins) (\(log.statistics.writerSpinsCaught) caught), there \(other.spins ?? -1)"
    )
  }

  // MARK: - Killed while polling

  /// A process appending in a serial loop, its writer polling (the counter it prints says so), is
  /// SIGKILLed; the next open recovers the segment. Every event it acknowledged is in the log
  /// once, at the sequence it was acknowledged with; at most the one append in flight is there
  /// unacknowledged; nothing is repeated. Three kills in a row on one store.
  @Test func aProcessKilledWhileItsWriterPollsLosesAndRepeatsNothing() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    var base: UInt64 = 0
    for round in 0..<3 {
      let child = try SpinWorker(["spin-append", store.path, "1000000", round == 0 ? "default" : "1000"])
      // Killed once it has polled, after a number of acks that differs per round.
      let wanted = 150 + 97 * round
      let polled = try await child.waitUntil { acks in
        acks.count >= wanted && (acks.last?.spins ?? 0) > 0 || acks.count >= 20_000
      }
      #expect(
        polled && (child.acks.last?.spins ?? 0) > 0, "the child never polled: \(child.output.suffix(3))")
      child.kill()
      let acks = child.acks
      #expect(acks.count >= wanted)

      let log = try store.open([CountByType()]) { $0.writeAheadSegment = true }
      let events = try log.events(after: base, limit: 2_000_000)
      let texts = events.map { String(decoding: $0.payload, as: UTF8.self) }
      #expect(events.map(\.sequence) == Array((base + 1)..<(base + 1 + UInt64(events.count))))
      // Exactly the acknowledged ones, in order, and at most the next (in flight when killed).
      #expect(
        events.count == acks.count || events.count == acks.count + 1, "\(events.count) for \(acks.count) acks"
      )
      #expect(texts == (0..<events.count).map { "worker \($0)" })
      for ack in acks {
        #expect(ack.sequence == base + UInt64(ack.index) + 1, "ack \(ack)")
      }
      #expect(try counts(log)["worker.event"] == base + UInt64(events.count))
      base += UInt64(events.count)
      #expect(try log.head() == base)
      log.close()
    }
    let log = try store.open([CountByType()])
    defer { log.close() }
    #expect(try counts(log) == ["worker.event": base])
    #expect(try log.verify().isHealthy)
  }

  // MARK: - One processor

  /// Under `taskset -c 0` (one processor by its affinity mask) the writer never polls and the
  /// serial loop completes with every event in the log. Foundation's `activeProcessorCount`
  /// ignores the mask on Linux (it says 2 there on a 2-processor machine), and the writer polled
  /// under `taskset` until it read the mask itself (`SpinPolicy.usableProcessors`).
  @Test func onOneProcessorTheWriterNeverPollsAndWorkCompletes() async throws {
    guard FileManager.default.isExecutableFile(atPath: "/usr/bin/taskset") else { return }
    let store = TemporaryStore()
    defer { store.remove() }
    let (status, output) = try await runCommand(
      "/usr/bin/taskset",
      ["-c", "0", productURL("ferry-test-worker").path, "spin-append", store.path, "300", "5000"])
    #expect(status == 0, "\(output.suffix(300))")
    let lines = output.split(separator: "\n").map(String.init)
    // Foundation's count there is every processor online (it ignores the affinity mask on
    // Linux): the writer counts the mask itself.
    #expect(lines.first?.hasPrefix("processors ") == true)
    print("WriterSpinAttack under taskset -c 0: \(lines.first ?? "")")
    #expect(lines.contains("spins 0 caught 0"), "\(lines.suffix(3))")
    #expect(lines.filter { $0.hasPrefix("ack ") }.count == 300)
    // The same child without the mask polls (the control: the mask is what stops it).
    let store2 = TemporaryStore()
    defer { store2.remove() }
    if SpinPolicy.usableProcessors() > 1 {
      let free = try await runProduct("ferry-test-worker", ["spin-append", store2.path, "300", "5000"])
      #expect(free.status == 0)
      let spins = free.output.split(separator: "\n").first { $0.hasPrefix("spins ") }
      #expect(spins != nil && spins != "spins 0 caught 0", "\(spins ?? "")")
    }
    let log = try store.open([CountByType()])
    defer { log.close() }
    let events = try log.events(after: 0, limit: 1_000)
    #expect(events.map { String(decoding: $0.payload, as: UTF8.self) } == (0..<300).map { "worker \($0)" })
  }
}

func isClosedError(_ error: any Error) -> Bool {
  if case FerryLogError.closed = error { return true }
  return false
}

/// A `ferry-test-worker spin-append` child (a ``SegmentRecoveryTests/Worker``, which collects its
/// lines) and what it says: its acks and its polls.
struct SpinWorker {
  struct Ack: Sendable, CustomStringConvertible {
    let sequence: UInt64
    let index: Int
    let spins: Int
    var description: String { "seq \(sequence) #\(index) spins \(spins)" }
  }

  let worker: SegmentRecoveryTests.Worker

  init(_ arguments: [String]) throws { worker = try SegmentRecoveryTests.Worker(arguments) }

  var output: [String] { worker.said }

  /// Its "ack SEQ I SPINS" lines, parsed.
  var acks: [Ack] {
    output.compactMap { line in
      let fields = line.split(separator: " ")
      guard fields.count == 4, fields[0] == "ack", let sequence = UInt64(fields[1]),
        let index = Int(fields[2]),
        let spins = Int(fields[3])
      else { return nil }
      return Ack(sequence: sequence, index: index, spins: spins)
    }
  }

  /// The polls of its "spins S caught C" line, once it printed it.
  var spins: Int? {
    output.first { $0.hasPrefix("spins ") }.flatMap { Int($0.split(separator: " ")[1]) }
  }

  /// Waits until its acks satisfy `condition`, or it ended; false when they never did. No
  /// wall-clock give-up: a worker that hangs is ended by the suite's time limit.
  func waitUntil(_ condition: ([Ack]) -> Bool) async throws -> Bool {
    while true {
      if condition(acks) { return true }
      if !worker.process.isRunning {
        // Ended by itself: what is left of its output arrives at once (not `waitForExit`, whose
        // signal `kill` waits for too, and gets only once).
        try await Task.sleep(for: .milliseconds(100))
        return condition(acks)
      }
      try await Task.sleep(for: .milliseconds(1))
    }
  }

  /// SIGKILLs it and waits until its output ended.
  func kill() { _ = worker.kill() }

  /// Waits for it to exit (polling, then its output read to the end); its status.
  func wait() async throws -> Int32 {
    while worker.process.isRunning { try await Task.sleep(for: .milliseconds(5)) }
    return worker.waitForExit().status
  }
}
