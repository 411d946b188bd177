import FerryLog
import FerryTesting
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// A hostile user of start times: the farthest starts Ferry accepts, the longest interval, a
/// start long past, and a clock set back — none may trap, run a task before its start, or keep
/// automatic running from the work that is due.
@Suite(.timeLimit(.minutes(20))) struct ScheduleEdgeTests {
  /// On the system clock (real sleeps): automatic running waits for starts thousands and
  /// millions of years away without trapping, and runs what is due meanwhile.
  @Test func theFarthestStartsAndTheLongestIntervalDoNotStopAutomaticRunning() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    defer { store.close() }
    let queue = store.queue
    let farthest = try await queue.add(
      tag: "t", payload: Item(name: "far"), options: [.schedule(.at(Date(timeIntervalSince1970: 9.2e15)))])
    let future = try await queue.add(
      tag: "t", payload: Item(name: "future"), options: [.schedule(.at(.distantFuture))])
    let past = try await queue.add(
      tag: "t", payload: Item(name: "past"), options: [.schedule(.at(.distantPast))])
    let longest = Duration.milliseconds(Int64.max / 2 - 1)
    let series = try await queue.add(
      tag: "t", payload: Item(name: "series"), options: [.schedule(.every(longest))])
    #expect(
      try queue.task(past)?.status
        == .scheduled(at: Date(unixMilliseconds: Date.distantPast.unixMilliseconds)))
    let ran = Mutex<[TaskID]>([])
    let run = runner(queue)
    run.register(tag: "t") { task in
      ran.withLock { $0.append(task.id) }
      return .succeeded
    }
    run.startAutomaticRunning()
    defer { run.stop() }
    try await pollUntil { (try? repeatingAdds(queue.log).count) == 2 && (try? queue.task(past)) == nil }
    #expect(ran.withLock { $0 } == [past, series])
    let repetition = try #require(try queue.pendingTasks().first { $0.repeatInterval == longest })
    #expect(repetition.id > series)
    #expect(repetition.startAt.map { $0 > Date.distantFuture } == true)
    // The automatic loop now sleeps toward the nearest of three far starts: it still wakes for new work.
    let now = try await queue.add(tag: "t", payload: Item(name: "now"))
    try await pollUntil { ran.withLock { $0.contains(now) } && (try? queue.task(now)) == nil }
    #expect(Set(try queue.pendingTasks().map(\.id)) == [farthest, future, repetition.id])
    #expect(try queue.nextDueDate() == Date(unixMilliseconds: Date.distantFuture.unixMilliseconds))
    try expectConsistent(queue)
  }

  /// The store's clock set back an hour after a success: the repetition still waits for the
  /// start stored in its add (read back from the log), and not a millisecond less.
  @Test func aClockSetBackDoesNotRunARepetitionBeforeItsStart() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      let run = runner(queue)
      run.register(tag: "sync") { _ in .succeeded }
      try await queue.add(
        tag: "sync", payload: Item(name: "inbox"), options: [.schedule(.every(.seconds(60)))])
      let done = fixture.time
      #expect(try await run.run().succeeded == 1)
      let next = try #require(try queue.pendingTasks().first)
      fixture.time = done - 3_600_000
      #expect(try await run.run().entries.isEmpty)
      #expect(try queue.nextDueDate() == at(done + 60_000))
      fixture.time = done + 59_999
      #expect(try await run.run().entries.isEmpty)
      fixture.time = done + 60_000
      #expect(try await run.run().outcome(of: next.id) == .succeeded)
      #expect(try startTimes(queue.log, of: next.id) == [done + 60_000])
      #expect(try repeatingAdds(queue.log).map(\.startAt) == [nil, done + 60_000, done + 120_000])
    }
  }
}
