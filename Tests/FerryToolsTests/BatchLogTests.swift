import Ferry
import Foundation
import Testing

/// `ferry log` shows which runs a batched handler took in one call: each `task.runStarted` of a
/// batch names the batch's first task (`task.runStarted` version 3).
@Suite(.timeLimit(.minutes(20))) struct BatchLogTests {
  @Test func theLogNamesEachRunsBatch() async throws {
    let path = FileManager.default.temporaryDirectory.path + "/ferry-batch-log-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: path) }
    var ids: [TaskID] = []
    do {
      let store = try await FerryStore.open(at: path)
      defer { store.close() }
      for n in 0..<5 { ids.append(try await store.queue.add(tag: "change", payload: ["n": n])) }
      let single = try await store.queue.add(tag: "other", payload: ["n": 9])
      let runner = TaskRunner(queue: store.queue)
      runner.register(tag: "change", batchSize: 3) { tasks in
        Dictionary(uniqueKeysWithValues: tasks.map { ($0.id, TaskResult.succeeded) })
      }
      runner.register(tag: "other") { _ in .succeeded }
      let report = try await runner.run()
      #expect(report.batches.map(\.taskIds) == [Array(ids[0..<3]), Array(ids[3..<5])])
      #expect(report.outcome(of: single) == .succeeded)
    }
    let log = try ferry(["log", path])
    #expect(log.status == 0, "\(log.stderr)")
    let starts = log.stdout.split(separator: "\n").filter { $0.contains("run started") }
    #expect(starts.count == 6)
    #expect(
      starts.filter { $0.contains("task \(ids[0]) run started") && $0.contains("first of a batch") }.count
        == 1)
    for id in ids[1..<3] {
      #expect(
        starts.contains {
          $0.contains("task \(id) run started") && $0.contains("in the batch of task \(ids[0])")
        })
    }
    #expect(starts.contains { $0.contains("task \(ids[3]) run started") && $0.contains("first of a batch") })
    #expect(
      starts.contains {
        $0.contains("task \(ids[4]) run started") && $0.contains("in the batch of task \(ids[3])")
      })
    #expect(starts.filter { $0.contains("batch") }.count == 5, "the run of its own names no batch")
  }
}
