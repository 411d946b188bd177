import FerryLog
import Foundation
import Synchronization
import Testing

@_spi(Engine) @testable import Ferry

/// `add`'s options: each element reaches the stored task, two that set the same option resolve
/// last-wins, and the rules between options are still enforced.
@Suite(.timeLimit(.minutes(5))) struct TaskOptionsTests {
  enum Work: String { case upload }

  @Test func noOptionsIsTheDefaultTask() async throws {
    #expect(TaskOptions() == [])
    try await withStore { store, _, _ in
      let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
      let task = try #require(try store.queue.task(id))
      #expect(!task.manual)
      #expect(task.priority == .normal)
      #expect(task.deadline == nil)
      #expect(task.startAt == nil)
      #expect(task.status == .ready)
    }
  }

  @Test func manualKeepsTheTaskOutOfPasses() async throws {
    try await withStore { store, _, _ in
      let id = try await store.queue.add(tag: "t", payload: Item(name: "a"), options: [.manual])
      #expect(try store.queue.task(id)?.manual == true)
      let runner = TaskRunner(queue: store.queue)
      runner.register(tag: "t") { _ in .succeeded }
      #expect(try await runner.run().entries.isEmpty)
      #expect(try await runner.run(.task(id)).outcome(of: id) == .succeeded)
    }
  }

  @Test func uniqueKeepsOrReplacesTheTwin() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let first = try await queue.add(tag: "t", payload: Item(name: "a"), dataId: "d")
      let kept = try await queue.add(
        tag: "t", payload: Item(name: "b"), dataId: "d", options: [.unique(.keep)])
      #expect(kept == first)
      let replacing = try await queue.add(
        tag: "t", payload: Item(name: "c"), dataId: "d", options: [.unique(.replace)])
      #expect(replacing > first)
      #expect(try queue.pendingTasks().map(\.id) == [replacing])
      // A unique policy compares by data id: without one it is refused.
      await #expect(throws: FerryError.self) {
        try await queue.add(tag: "t", payload: Item(name: "x"), options: [.unique(.keep)])
      }
    }
  }

  @Test func priorityOrdersThePass() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let low = try await queue.add(tag: "t", payload: Item(name: "low"), options: [.priority(.low)])
      let normal = try await queue.add(tag: "t", payload: Item(name: "normal"))
      let high = try await queue.add(tag: "t", payload: Item(name: "high"), options: [.priority(.high)])
      #expect(try queue.task(high)?.priority == .high)
      let order = Mutex<[TaskID]>([])
      let runner = TaskRunner(queue: queue)
      runner.register(tag: "t") { task in
        order.withLock { $0.append(task.id) }
        return .succeeded
      }
      _ = try await runner.run()
      #expect(order.withLock { $0 } == [high, normal, low])
    }
  }

  @Test func deadlineIsStoredToTheMillisecond() async throws {
    try await withStore { store, _, fixture in
      let deadline = at(fixture.time + 60_000)
      let id = try await store.queue.add(tag: "t", payload: Item(name: "a"), options: [.deadline(deadline)])
      #expect(try store.queue.task(id)?.deadline == deadline)
    }
  }

  @Test func scheduleDelaysTheFirstRun() async throws {
    try await withStore { store, _, fixture in
      let id = try await store.queue.add(
        tag: "t", payload: Item(name: "a"), options: [.schedule(.after(.seconds(5)))])
      #expect(try store.queue.task(id)?.status == .scheduled(at: at(fixture.time + 5000)))
    }
  }

  @Test func optionsCombineAndTheTypedTagTakesThem() async throws {
    try await withStore { store, _, fixture in
      let deadline = at(fixture.time + 60_000)
      let id = try await store.queue.add(
        tag: Work.upload, payload: Item(name: "a"),
        options: [.manual, .priority(.high), .deadline(deadline), .schedule(.at(at(fixture.time + 1000)))])
      let task = try #require(try store.queue.task(id))
      #expect(task.tag == "upload")
      #expect(task.manual)
      #expect(task.priority == .high)
      #expect(task.deadline == deadline)
      #expect(task.startAt == at(fixture.time + 1000))
    }
  }

  /// Two elements that set the same option: the last wins, as assigning the property twice would.
  @Test func theLastOfTwoElementsForOneOptionWins() async throws {
    let options: TaskOptions = [
      .priority(.low), .unique(.keep), .priority(.high), .unique(.append), .schedule(.after(.seconds(9))),
      .schedule(.now),
    ]
    #expect(options == TaskOptions(priority: .high))
    var built = TaskOptions([.priority(.low)] + [.priority(.high)])
    #expect(built.priority == .high)
    built.priority = .low
    #expect(built == [.priority(.low)])
    try await withStore { store, _, _ in
      let id = try await store.queue.add(
        tag: "t", payload: Item(name: "a"), options: [.priority(.low), .priority(.high)])
      #expect(try store.queue.task(id)?.priority == .high)
    }
  }

  @Test func optionsThatCannotGoTogetherAreRefused() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      let every = TaskOption.schedule(.every(.seconds(60)))
      let refused: [TaskOptions] = [[every, .manual], [every, .deadline(at(fixture.time + 600_000))]]
      for options in refused {
        await #expect(throws: FerryError.self) {
          try await queue.add(tag: "t", payload: Item(name: "x"), options: options)
        }
      }
      // A deadline at or before the start: the task could never run.
      await #expect(throws: FerryError.self) {
        try await queue.add(
          tag: "t", payload: Item(name: "x"),
          options: [.schedule(.after(.seconds(10))), .deadline(at(fixture.time + 5000))])
      }
      let left = try queue.pendingTasks()
      #expect(left.isEmpty)
    }
  }
}
