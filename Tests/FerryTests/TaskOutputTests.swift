import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// A handler's success may leave an output that later tasks read: the id a server gave a note
/// created offline reaches the edits queued behind its create.
@Suite(.timeLimit(.minutes(20))) struct TaskOutputTests {
  struct Created: Codable, Equatable { var serverId: String }
  struct Edit: Codable { var createTask: TaskID; var text: String }

  @Test func anEditQueuedBehindAnOfflineCreateIsSentUnderTheServersId() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let queue = store.queue
    // Offline: the create and two edits of the same note are queued in its group.
    let create = try await queue.add(
      tag: "create", payload: Item(name: "note"), dataId: "local-1", groupId: "local-1")
    for text in ["one", "two"] {
      try await queue.add(tag: "edit", payload: Edit(createTask: create, text: text), groupId: "local-1")
    }
    let sent = Mutex<[String]>([])
    let run = runner(queue)
    run.register(tag: "create") { _ in .succeeded(output: try TaskOutput(Created(serverId: "srv-42"))) }
    run.register(tag: "edit") { task in
      let edit = try task.payload(as: Edit.self)
      guard let output = try queue.output(of: edit.createTask) else { return .recordError("no server id") }
      let id = try output.decode(as: Created.self).serverId
      sent.withLock { $0.append("\(id):\(edit.text)") }
      return .succeeded
    }
    #expect(try await run.run().succeeded == 3)
    #expect(sent.withLock { $0 } == ["srv-42:one", "srv-42:two"])
    #expect(try queue.output(dataId: "local-1")?.decode(as: Created.self) == Created(serverId: "srv-42"))
    #expect(try queue.output(dataId: "local-1", tag: "edit") == nil)
    #expect(try queue.output(dataId: "local-2") == nil)
    try expectConsistent(queue)
  }

  @Test func outputsSurviveReopenCompactionAndRebuild() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var ids: [TaskID] = []
    do {
      let store = try await fixture.openStore()
      defer { store.close() }
      for n in 0..<20 {
        ids.append(try await store.queue.add(tag: "create", payload: Item(name: "\(n)"), dataId: "n\(n)"))
      }
      let run = runner(store.queue) { $0.maxConcurrentTasks = 4 }
      run.register(tag: "create") { task in
        .succeeded(output: try TaskOutput(Created(serverId: "s\(task.id)")))
      }
      #expect(try await run.run().succeeded == 20)
      // A task of another note still queued while the log is compacted.
      try await store.queue.add(tag: "other", payload: Item(name: "x"))
      fixture.time += 3_600_000
      _ = try await store.compact(retention: .zero)
      _ = try await store.log.rebuild()
    }
    let store = try await fixture.openStore()
    defer { store.close() }
    for id in ids {
      #expect(try store.queue.output(of: id)?.decode(as: Created.self) == Created(serverId: "s\(id)"))
    }
    let report = try store.log.verify()
    #expect(report.isHealthy, "\(report.problems)")
  }

  @Test func anOutputTooLargeOrNotJSONIsRefusedBeforeAnythingIsLogged() throws {
    #expect(throws: FerryError.self) {
      try TaskOutput(bytes: [UInt8](repeating: 0x20, count: TaskOutput.maxSize + 1))
    }
    #expect(throws: FerryError.self) { try TaskOutput(Double.nan) }
    #expect(try TaskOutput("x").decode(as: String.self) == "x")
    #expect(throws: FerryError.self) { try TaskOutput("x").decode(as: Int.self) }
  }

  @Test func aSuccessFromAnotherProcessIsReadHereWithItsOutput() async throws {
    // The success event carries the output: a second open (read-only, as another process's CLI
    // would) reads it from the same log.
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let id = try await store.queue.add(tag: "create", payload: Item(name: "n"), dataId: "d")
    let run = runner(store.queue)
    run.register(tag: "create") { _ in
      .succeeded(output: try TaskOutput(["etag": "W/1"]), invalidating: ["notes"])
    }
    _ = try await run.run()
    let history = try store.queue.history(of: id).map(\.event)
    #expect(history.last == .runSucceeded)
    let events = try store.log.events(after: 0, limit: 100)
    let success = try #require(events.first { $0.type == "task.runSucceeded" })
    #expect(success.schemaVersion == 2)
    guard case .runSucceeded(id, let details) = try TaskEvent(success) else {
      Issue.record("not a success")
      return
    }
    #expect(details.invalidates == ["notes"])
    #expect(
      details.output.map { try? JSONDecoder().decode([String: String].self, from: Data($0)) } == [
        "etag": "W/1"
      ])
  }

  @Test func compactionKeepsAnOutputsEventsWhileAQueuedTaskMayReadIt() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let queue = store.queue
    let readBy = try await queue.add(
      tag: "create", payload: Item(name: "a"), dataId: "local-a", groupId: "local-a")
    let alone = try await queue.add(
      tag: "create", payload: Item(name: "b"), dataId: "local-b", groupId: "local-b")
    let run = runner(queue)
    run.register(tag: "create") { task in .succeeded(output: try TaskOutput(Created(serverId: "s\(task.id)")))
    }
    #expect(try await run.run().succeeded == 2)
    // An edit of note a is queued (offline, say); nothing is queued for note b.
    try await queue.add(tag: "edit", payload: Edit(createTask: readBy, text: "x"), groupId: "local-a")
    fixture.time += 3_600_000
    _ = try await store.compact(retention: .zero)
    let successes = try store.log.events(after: 0, limit: 100).compactMap { event -> TaskID? in
      guard event.type == "task.runSucceeded", case .runSucceeded(let id, _) = try TaskEvent(event) else {
        return nil
      }
      return id
    }
    // A rebuild from the log alone (no snapshot) still finds the output an edit may read.
    #expect(successes == [readBy])
    #expect(try queue.output(of: alone) != nil, "the snapshot keeps the row itself")
    let report = try store.log.verify()
    #expect(report.isHealthy, "\(report.problems)")
  }
}
