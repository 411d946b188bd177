import Foundation
import Testing

@testable import FerryLog

/// The writer's poll for its next job before it sleeps (`Configuration.writerSpin`): when it polls,
/// that it never loses or repeats an append while it does — with concurrent callers, another
/// process writing and one reading — and that a closing log stops it.
@Suite(.timeLimit(.minutes(20))) struct WriterSpinTests {
  // MARK: - The policy

  @Test func theWindowIsClampedAndNeverPollsOnOneProcessor() {
    #expect(SpinPolicy(window: .microseconds(50), processors: 2).window == 50_000)
    #expect(SpinPolicy(window: .zero, processors: 8).window == 0)
    #expect(SpinPolicy(window: .microseconds(50), processors: 1).window == 0)
    #expect(SpinPolicy(window: .nanoseconds(-5), processors: 8).window == 0)
    #expect(SpinPolicy(window: .seconds(-1), processors: 8).window == 0)
    // Any window of a second or more, the largest included, is 10 ms: no arithmetic to overflow.
    #expect(SpinPolicy(window: .seconds(Int64.max), processors: 8).window == 10_000_000)
    #expect(SpinPolicy(window: .milliseconds(999), processors: 8).window == 10_000_000)
    #expect(SpinPolicy(window: .milliseconds(3), processors: 8).window == 3_000_000)
  }

  @Test func itPollsOnlyForACallerAloneAndWithoutPause() {
    var policy = SpinPolicy(window: .microseconds(50), processors: 2)
    #expect(!policy.shouldSpin)  // nothing has come yet
    for _ in 0..<(SpinPolicy.singlesNeeded - 1) {
      policy.committed(requests: 1, events: 1)
      policy.waited(30_000)
      #expect(!policy.shouldSpin)  // not yet eight commits of one request
    }
    policy.committed(requests: 1, events: 1)
    #expect(policy.shouldSpin)
    policy.waited(200_000)
    #expect(policy.shouldSpin)
    policy.waited(200_001)
    #expect(!policy.shouldSpin)  // appends came further apart: sleep
    policy.waited(10_000)
    #expect(policy.shouldSpin)
    // A commit of two requests: several callers, whose appends should gather while the writer
    // sleeps; eight single commits in a row again before it polls.
    policy.committed(requests: 2, events: 2)
    #expect(!policy.shouldSpin)
    for _ in 0..<SpinPolicy.singlesNeeded { policy.committed(requests: 1, events: 2) }
    #expect(policy.shouldSpin)  // a runner's finish and claim: two events
    // One request of three events (a runner's lanes sharing a command): more to gather.
    policy.committed(requests: 1, events: 3)
    #expect(!policy.shouldSpin)
    for _ in 0..<(SpinPolicy.singlesNeeded - 1) { policy.committed(requests: 1, events: 1) }
    #expect(!policy.shouldSpin)
    policy.committed(requests: 1, events: 1)
    #expect(policy.shouldSpin)
    var never = SpinPolicy(window: .zero, processors: 2)
    for _ in 0..<10 { never.committed(requests: 1, events: 1) }
    never.waited(0)
    #expect(!never.shouldSpin)
  }

  // MARK: - The writer

  /// The default: polling in a store with a write-ahead segment (the default store), none
  /// without; a window given is used in both.
  @Test func byDefaultOnlyAStoreWithASegmentPolls() async throws {
    let processors = SpinPolicy.usableProcessors()
    let store = TemporaryStore()
    defer { store.remove() }
    var log = try store.open([CountByType()]) { $0.writeAheadSegment = false }
    #expect(log.writer?.spinWindow == 0)
    for i in 0..<100 { _ = try await log.append(NewEvent(type: "a", payload: payload("\(i)"))) }
    #expect(log.statistics.writerSpins == 0)
    log.close()
    log = try store.open([CountByType()])
    #expect(log.segment != nil)
    #expect(log.writer?.spinWindow == (processors > 1 ? 50_000 : 0))
    log.close()
    log = try store.open([CountByType()]) {
      $0.writeAheadSegment = true
      $0.writerSpin = .zero
    }
    #expect(log.segment != nil)
    #expect(log.writer?.spinWindow == 0)
    log.close()
    log = try store.open([CountByType()]) {
      $0.writeAheadSegment = false
      $0.writerSpin = .microseconds(20)
    }
    defer { log.close() }
    #expect(log.segment == nil)
    #expect(log.writer?.spinWindow == (processors > 1 ? 20_000 : 0))
    #expect(try counts(log) == ["a": 100])
  }

  @Test func aZeroWindowNeverPolls() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open([CountByType()]) { $0.writerSpin = .zero }
    defer { log.close() }
    for i in 0..<200 { _ = try await log.append(NewEvent(type: "a", payload: payload("\(i)"))) }
    #expect(log.statistics.writerSpins == 0)
    #expect(log.statistics.writerSpinsCaught == 0)
    #expect(try counts(log) == ["a": 200])
  }

  /// One caller appending one event after another: the writer polls between them (a window of
  /// 5 ms, so that a loaded machine's gaps still fall within four windows), catches most appends
  /// while polling, and every event is in the log once, in order.
  @Test func aCallerAppendingInALoopIsCaughtWhileTheWriterPolls() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open([CountByType()]) { $0.writerSpin = .milliseconds(5) }
    defer { log.close() }
    for i in 0..<300 { _ = try await log.append(NewEvent(type: "a", payload: payload("\(i)"))) }
    let statistics = log.statistics
    #expect(statistics.writerSpins > 0)
    #expect(statistics.writerSpinsCaught > 0)
    #expect(statistics.writerSpinsCaught <= statistics.writerSpins)
    #expect(
      try log.events(after: 0, limit: 1_000).map { String(decoding: $0.payload, as: UTF8.self) }
        == (0..<300).map { "\($0)" })
  }

  /// After a pause longer than four windows the writer sleeps at once: a store that is written now
  /// and then never polls.
  @Test func anIdleWritersNextWaitDoesNotPoll() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open([CountByType()]) { $0.writerSpin = .milliseconds(5) }
    defer { log.close() }
    for i in 0..<50 { _ = try await log.append(NewEvent(type: "a", payload: payload("\(i)"))) }
    // The writer may poll once after the last of those (5 ms), then sleeps: 300 ms later its
    // last wait is far longer than four windows.
    try await Task.sleep(for: .milliseconds(300))
    let before = log.statistics.writerSpins
    for i in 0..<3 {
      _ = try await log.append(NewEvent(type: "b", payload: payload("\(i)")))
      try await Task.sleep(for: .milliseconds(300))
    }
    #expect(log.statistics.writerSpins == before)
    #expect(try counts(log) == ["a": 50, "b": 3])
  }

  /// Concurrent callers in this process, another process appending to the same store and a third
  /// reading its head, all at once, with both writers polling: every acknowledged event is in the
  /// log exactly once (read from the log, not from a counter), the sequences have no gap, and each
  /// caller's events are in its own order.
  @Test func concurrentCallersAndAnotherProcessLoseAndRepeatNothing() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open([CountByType()]) { $0.writerSpin = .microseconds(200) }
    defer { log.close() }
    _ = try await log.append(NewEvent(type: "start", payload: []))

    async let other = runProduct("ferry-test-worker", ["append", store.path, "300"])
    async let reader = runProduct("ferry-test-worker", ["log-head", store.path])
    let callers = 8
    let each = 150
    let acknowledged = try await withThrowingTaskGroup(of: [UInt64: String].self) { group in
      for caller in 0..<callers {
        group.addTask {
          var mine: [UInt64: String] = [:]
          for i in 0..<each {
            let text = "caller \(caller) \(i)"
            mine[try await log.append(NewEvent(type: "local", payload: payload(text)))] = text
          }
          return mine
        }
      }
      var all: [UInt64: String] = [:]
      for try await mine in group { all.merge(mine) { first, _ in first } }
      return all
    }
    let (otherStatus, otherOutput) = try await other
    let (readerStatus, _) = try await reader
    #expect(otherStatus == 0)
    #expect(readerStatus == 0)
    let otherAcks = otherOutput.split(separator: "\n").filter { $0.hasPrefix("ack ") }
    #expect(otherAcks.count == 300)

    let total = 1 + callers * each + 300
    let events = try log.events(after: 0, limit: total + 10)
    #expect(events.count == total)
    #expect(events.map(\.sequence) == Array(1...UInt64(total)))
    let texts = events.map { String(decoding: $0.payload, as: UTF8.self) }
    #expect(Set(texts.filter { $0.hasPrefix("caller ") }).count == callers * each)
    #expect(Set(texts.filter { $0.hasPrefix("worker ") }).count == 300)
    for (sequence, text) in acknowledged {
      #expect(texts[Int(sequence) - 1] == text, "acknowledged \(sequence) is \(texts[Int(sequence) - 1])")
    }
    for caller in 0..<callers {
      let order = texts.filter { $0.hasPrefix("caller \(caller) ") }
      #expect(order == (0..<each).map { "caller \(caller) \($0)" })
    }
    let workerOrder = texts.filter { $0.hasPrefix("worker ") }
    #expect(workerOrder == (0..<300).map { "worker \($0)" })
    #expect(try counts(log) == ["start": 1, "local": UInt64(callers * each), "worker.event": 300])
  }

  /// Closing right after an append, while the writer is likely polling, returns (the suite's time
  /// limit would catch a hang) and loses nothing acknowledged.
  @Test func closingWhileTheWriterPollsLosesNothing() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    for round in 0..<40 {
      let log = try store.open([CountByType()]) { $0.writerSpin = .milliseconds(10) }
      for i in 0..<3 { _ = try await log.append(NewEvent(type: "r\(round % 2)", payload: payload("\(i)"))) }
      log.close()
    }
    let log = try store.open([CountByType()])
    defer { log.close() }
    #expect(try log.head() == 120)
    #expect(try counts(log) == ["r0": 60, "r1": 60])
  }
}
