import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// The sync contract with company: two runner processes and this one on one store, notes created
/// offline and edited behind their creates, runners SIGKILLed after the server applied a create
/// and before its outcome was logged. Read back from the log and from what the handlers said.
@Suite(.timeLimit(.minutes(20))) struct SyncCompanyTests {
  @Test func killedRunnersRetryUnderTheSameKeyAndEditsReachTheServersId() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    defer { store.close() }
    var creates: [TaskID] = []
    var edits: [TaskID: TaskID] = [:]  // edit → its create
    func note(_ n: Int) async throws {
      let create = try await store.queue.add(
        tag: "create", payload: ["kind": n % 8 == 3 ? "crash" : "ok"], dataId: "local-\(n)",
        groupId: "local-\(n)")
      creates.append(create)
      for text in ["a", "b"] {
        let edit = try await store.queue.add(
          tag: "edit", payload: ["create": "\(create)", "text": text], groupId: "local-\(n)")
        edits[edit] = create
      }
    }
    for n in 0..<40 { try await note(n) }
    // Two runner processes at a time; one killed by a create is replaced (at most 16 in all).
    var children = [
      try Child("ferry-test-worker", ["sync-run", fixture.path]),
      try Child("ferry-test-worker", ["sync-run", fixture.path, "3"]),
    ]
    var live = children
    // More notes while the runners work, from this process.
    _ = try await children[0].waitForLine(startingWith: "key ")
    for n in 40..<60 { try await note(n) }
    while !live.isEmpty {
      let child = live.removeFirst()
      let status = try await child.wait()
      let killed = status == SIGKILL && child.process.terminationReason == .uncaughtSignal
      #expect(status == 0 || killed, "a runner process ended otherwise: \(status) \(child.output.suffix(3))")
      if killed, children.count < 16, try !store.queue.pendingTasks().isEmpty {
        let next = try Child(
          "ferry-test-worker", ["sync-run", fixture.path, children.count % 2 == 0 ? "1" : "3"])
        children.append(next)
        live.append(next)
      }
    }
    // Whatever the killed runners left, this process finishes: a dead owner's run is interrupted
    // and runs again, under the same key.
    let lines = Mutex<[String]>([])
    let runner = TaskRunner(queue: store.queue)
    runner.register(tag: "create") { task in
      lines.withLock { $0.append("key \(task.id) \(task.attempt) \(task.idempotencyKey)") }
      return .succeeded(output: try TaskOutput("srv-\(task.id)"), invalidating: ["notes"])
    }
    runner.register(tag: "edit") { task in
      guard let create = TaskID(try task.payload(as: [String: String].self)["create"] ?? ""),
        let output = try store.queue.output(of: create)
      else { return .recordError("no server id") }
      let serverId = try output.decode(as: String.self)
      lines.withLock { $0.append("edit \(task.id) \(serverId) \(task.idempotencyKey)") }
      return .succeeded
    }
    for _ in 0..<10 where try !store.queue.pendingTasks().isEmpty { _ = try await runner.run() }
    #expect(try store.queue.pendingTasks().isEmpty)

    let said = children.flatMap(\.output) + lines.withLock { $0 }
    // Every task succeeded exactly once (the log), however many processes ran it.
    var successes: [TaskID: Int] = [:]
    for event in try store.log.events(after: 0, limit: 100_000) where event.type == "task.runSucceeded" {
      if case .runSucceeded(let id, _) = try TaskEvent(event) { successes[id, default: 0] += 1 }
    }
    for id in creates + Array(edits.keys) {
      #expect(successes[id] == 1, "task \(id): \(successes[id] ?? 0) successes")
    }
    // A create's key is the same on every attempt, in every process; no two tasks share one.
    var keys: [TaskID: Set<String>] = [:]
    for line in said where line.hasPrefix("key ") {
      let parts = line.split(separator: " ")
      guard parts.count == 4, let id = TaskID(parts[1]) else { continue }
      keys[id, default: []].insert(String(parts[3]))
    }
    #expect(keys.count == creates.count)
    #expect(keys.values.allSatisfy { $0.count == 1 }, "\(keys.filter { $0.value.count > 1 })")
    let crashed = creates.filter { id in said.filter { $0.hasPrefix("key \(id) ") }.count > 1 }
    #expect(!crashed.isEmpty, "no runner was killed after the server applied a create")
    // Every edit reached the server under its create's server id.
    var editKeys = Set<String>()
    for line in said where line.hasPrefix("edit ") {
      let parts = line.split(separator: " ")
      guard parts.count == 4, let id = TaskID(parts[1]), let create = edits[id] else { continue }
      #expect(parts[2] == "srv-\(create)", "edit \(id) under \(parts[2])")
      editKeys.insert(String(parts[3]))
    }
    #expect(editKeys.count == edits.count)
    #expect(editKeys.isDisjoint(with: keys.values.flatMap { $0 }))
    #expect(try store.ledger.record("notes")?.isInvalidated == true)
    print(
      "sync company: \(creates.count) creates, \(edits.count) edits; runs said by the runner processes "
        + "\(children.map { $0.output.count }), by this one \(lines.withLock { $0.count }); "
        + "\(crashed.count) creates retried after a kill, each under its first key")
    let report = try store.log.verify()
    #expect(report.isHealthy, "\(report.problems)")
  }
}

/// Connectivity flapping while automatic running works: nothing starts while offline, a run the
/// network dropped under is deferred, and every task succeeds exactly once, no attempt spent.
@Suite(.timeLimit(.minutes(20))) struct ConnectivityFlappingTests {
  @Test func aFlappingNetworkNeverSpendsAnAttemptNorRunsATaskTwice() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let network = ManualConnectivity(online: true)
    let run = runner(store.queue) {
      $0.connectivity = network
      $0.maxConcurrentTasks = 4
    }
    run.register(tag: "save") { _ in
      await Task.yield()
      // The request "fails" when the network went away under it.
      return network.isOnline ? .succeeded : .failed("The network connection was lost.")
    }
    var ids: [TaskID] = []
    for n in 0..<200 {
      ids.append(try await store.queue.add(tag: "save", payload: Item(name: "\(n)"), groupId: "g\(n % 7)"))
    }
    run.startAutomaticRunning()
    defer { run.stop() }
    var flips = 0
    while try !store.queue.pendingTasks().isEmpty, flips < 20_000 {
      network.set(online: flips % 2 == 1)
      flips += 1
      await Task.yield()
    }
    network.set(online: true)
    try await pollUntil { (try? store.queue.pendingTasks().isEmpty) == true }
    var succeeded: [TaskID: Int] = [:]
    var failed = 0
    var deferred = 0
    for event in try store.log.events(after: 0, limit: 1_000_000) {
      switch event.type {
      case "task.runDeferred": deferred += 1
      case "task.runSucceeded":
        if case .runSucceeded(let id, _) = try TaskEvent(event) { succeeded[id, default: 0] += 1 }
      case "task.runFailed": failed += 1
      default: break
      }
    }
    #expect(failed == 0, "a failure while the network flapped was counted as an attempt")
    print(
      "connectivity flapping: \(flips) flips, \(deferred) runs deferred, \(ids.count) tasks each succeeded once"
    )
    #expect(ids.allSatisfy { succeeded[$0] == 1 })
    let report = try store.log.verify()
    #expect(report.isHealthy, "\(report.problems)")
  }
}
