import Ferry
import FerryTools
import Foundation
import Testing

/// A task's start time and repeat interval are in its `task.added`: an exported log imported
/// elsewhere holds the same schedule, and `ferry inspect` shows it.
@Suite(.timeLimit(.minutes(3))) struct ScheduleExportTests {
  @Test func anImportedStoreKeepsStartsAndIntervalsAndInspectShowsThem() async throws {
    let place = try ImportPlace()
    defer { place.remove() }
    let source = place.parent + "/source"
    let start = Date().addingTimeInterval(3 * 3600)
    let startMs = Int64((start.timeIntervalSince1970 * 1000).rounded(.up))
    let (reminder, sync): (UInt64, UInt64)
    do {
      let store = try await FerryStore.open(at: source)
      defer { store.close() }
      reminder = try await store.queue.add(tag: "remind", payload: ["text": "call"], schedule: .at(start))
      sync = try await store.queue.add(
        tag: "sync-inbox", payload: ["box": "inbox"], dataId: "inbox", unique: .keep,
        schedule: .every(.seconds(900), startingAt: start))
    }
    let log = try ferry(["log", source])
    #expect(log.status == 0)
    #expect(log.stdout.contains("task \(reminder) added: tag remind, starts "))
    #expect(log.stdout.contains("repeats every 900 s"))
    let export = try ferry(["export", source])
    #expect(export.status == 0, "\(export.stderr)")
    let imported = try ferry(["import", place.target], input: export.stdout)
    #expect(imported.status == 0, "\(imported.stderr)")

    let store = try await FerryStore.open(at: place.target)
    let tasks = try store.queue.pendingTasks()
    store.close()
    #expect(tasks.map(\.id) == [reminder, sync])
    #expect(tasks.allSatisfy { $0.status == .scheduled(at: Date(timeIntervalSince1970: Double(startMs) / 1000)) })
    #expect(tasks.map(\.repeatInterval) == [nil, .seconds(900)])

    let inspect = try ferry(["inspect", place.target])
    #expect(inspect.status == 0)
    #expect(inspect.stdout.contains("scheduled for"))
    #expect(inspect.stdout.contains("repeats every 15m 0s"))
    #expect(inspect.stdout.contains("2 scheduled, 1 repeating"))
    let json = try ferry(["inspect", "--json", place.target])
    #expect(json.stdout.contains("\"status\":\"scheduled\""))
    #expect(json.stdout.contains("\"repeatEveryMs\":900000"))
    #expect(json.stdout.contains("\"eligibleAt\":\(startMs)"))
  }
}
