@_spi(Engine) import Ferry
import FerryLog
import FerryTools
import Foundation
import TestSupport
import Testing

/// `ferry inspect` prints statuses in the API's words (``TaskStatus``'s description), not the
/// JSON's keys or the enum's case names; `--json` keeps the keys.
@Suite(.timeLimit(.minutes(20))) struct InspectWordsTests {
  @Test func theTableUsesTheStatusWordsOfTheAPI() async throws {
    let demo = DemoStore()
    defer { demo.remove() }
    let store = try await FerryStore.open(at: demo.path)
    defer { store.close() }
    let queue = store.queue
    let blocked = try await queue.add(tag: "t", payload: ["n": 1], groupId: "g")
    let behind = try await queue.add(tag: "t", payload: ["n": 2], groupId: "g")
    let dead = try await queue.add(tag: "dies", payload: ["n": 3])
    let ready = try await queue.add(tag: "later", payload: ["n": 4])
    try await queue.recordError(blocked, message: "fix it")
    let runner = TaskRunner(queue: queue)
    runner.register(tag: "dies") { _ in .failed("no", retryable: false) }
    _ = try await runner.run(.task(dead))
    let snapshot = try store.log.read { try FerryStore.snapshot(of: $0) }
    let report = InspectReport(snapshot, now: 0, maxAgeMs: 60_000)
    let lines = report.lines()
    func line(of id: TaskID) -> String { lines.first { $0.hasPrefix("  \(id) ") } ?? "" }
    for task in snapshot.tasks {
      #expect(line(of: task.id).contains(task.status.description), "\(lines.joined(separator: "\n"))")
    }
    #expect(line(of: blocked).contains("blocked by an error"))
    #expect(line(of: behind).contains("waiting for its group (behind task \(blocked))"))
    #expect(!lines.joined().contains("waitingForGroup"))
    #expect(line(of: ready).contains("ready"))
    // The JSON keeps its stable keys, and they read back as the same statuses.
    #expect(report.tasks.map(\.status) == ["blocked", "waitingForGroup", "dead", "ready"])
    #expect(report.tasks.map(\.taskStatus) == snapshot.tasks.map(\.status))
  }
}
