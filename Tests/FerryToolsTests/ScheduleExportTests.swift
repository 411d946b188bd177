import Ferry
import FerryTools
import Foundation
import Testing

/// A task's start time and repeat interval are in its `task.added`: an exported log imported
/// elsewhere holds the same schedule, and `ferry inspect` shows it.
@Suite(.timeLimit(.minutes(20))) struct ScheduleExportTests {
  @Test func anImportedStoreKeepsStartsAndIntervalsAndInspectShowsThem() async throws {
    let place = try ImportPlace()
    defer { place.remove() }
    let source = place.parent + "/source"
    let start = Date().addingTimeInterval(3 * 3600)
    let startMs = Int64((start.timeIntervalSince1970 * 1000).rounded(.up))
    let (reminder, sync): (TaskID, TaskID)
    do {
      let store = try await FerryStore.open(at: source)
      defer { store.close() }
      reminder = try await store.queue.add(
        tag: "remind", payload: ["text": "call"], options: [.schedule(.at(start))])
      sync = try await store.queue.add(
        tag: "sync-inbox", payload: ["box": "inbox"], dataId: "inbox",
        options: [.unique(.keep), .schedule(.every(.seconds(900), startingAt: start))])
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
    #expect(
      tasks.allSatisfy { $0.status == .scheduled(at: Date(timeIntervalSince1970: Double(startMs) / 1000)) })
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

/// `ferry inspect`, `ferry log` and an export of a store whose starts are at the ends of what
/// Ferry stores: the tools print them and exit 0, and the import keeps them.
@Suite(.timeLimit(.minutes(20))) struct ScheduleExtremesToolTests {
  @Test func theToolsPrintTheFarthestAndEarliestStarts() async throws {
    let place = try ImportPlace()
    defer { place.remove() }
    let source = place.parent + "/source"
    do {
      let store = try await FerryStore.open(at: source)
      defer { store.close() }
      try await store.queue.add(
        tag: "far", payload: ["n": 1], options: [.schedule(.at(Date(timeIntervalSince1970: 9.2e15)))])
      try await store.queue.add(tag: "future", payload: ["n": 2], options: [.schedule(.at(.distantFuture))])
      try await store.queue.add(tag: "past", payload: ["n": 3], options: [.schedule(.at(.distantPast))])
      try await store.queue.add(
        tag: "longest", payload: ["n": 4],
        options: [.schedule(.every(.milliseconds(Int64.max / 2 - 1), startingAt: .distantFuture))])
    }
    for arguments in [["inspect", source], ["inspect", "--json", source], ["log", source]] {
      let result = try ferry(arguments)
      #expect(result.status == 0, "\(arguments): \(result.stderr)")
      #expect(!result.stdout.isEmpty)
    }
    let export = try ferry(["export", source])
    #expect(export.status == 0, "\(export.stderr)")
    let imported = try ferry(["import", place.target], input: export.stdout)
    #expect(imported.status == 0, "\(imported.stderr)")
    let before = try await FerryStore.open(at: source)
    let expected = try before.queue.pendingTasks()
    before.close()
    let after = try await FerryStore.open(at: place.target)
    defer { after.close() }
    #expect(try after.queue.pendingTasks() == expected)
  }
}
