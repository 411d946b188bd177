import Ferry
import FerryLog
import FerryTools
import Foundation
import Synchronization
import TestSupport
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A fresh directory to import beside: the target is `store` inside it, so that the test can see
/// every temporary directory an import leaves next to its target.
struct ImportPlace {
  let parent = FileManager.default.temporaryDirectory.path + "/ferry-import-\(UUID().uuidString.prefix(8))"
  var target: String { parent + "/store" }

  init() throws {
    try FileManager.default.createDirectory(atPath: parent, withIntermediateDirectories: true)
  }

  func remove() { try? FileManager.default.removeItem(atPath: parent) }

  /// What the parent directory holds, sorted.
  func entries() -> [String] {
    ((try? FileManager.default.contentsOfDirectory(atPath: parent)) ?? []).sorted()
  }

  /// The temporary directories (not their lock files) imports left beside the target.
  func stagings() -> [String] {
    entries().filter { $0.hasPrefix(".store.ferry-import-") && !$0.hasSuffix(".lock") }
  }

  /// Whether the target is missing or an empty directory: no store, partial or whole.
  func targetHoldsNothing() -> Bool {
    guard FileManager.default.fileExists(atPath: target) else { return true }
    return ((try? FileManager.default.contentsOfDirectory(atPath: target)) ?? ["?"]).isEmpty
  }
}

/// A child process whose standard input the test feeds bit by bit, and whose output it can wait for.
final class Child {
  let process: Process
  private let input = Pipe()
  private let output = Pipe()
  private let errors = Pipe()
  private let feeding = DispatchGroup()
  private var seen = Data()
  /// What the child has printed so far, as read by ``waitForOutput(_:)``.
  var seenOutput: Data { seen }
  private var inputClosed = false

  init(_ executable: String, _ arguments: [String]) throws {
    signal(SIGPIPE, SIG_IGN)  // writing to a killed child must fail, not end the test
    process = Process()
    process.executableURL = productURL(executable)
    process.arguments = arguments
    process.standardInput = input
    process.standardOutput = output
    process.standardError = errors
    try process.run()
  }

  /// Writes to the child's standard input (blocks while its pipe is full).
  func write(_ text: some StringProtocol) throws {
    try input.fileHandleForWriting.write(contentsOf: Data(text.utf8))
  }

  /// Writes the last of the child's standard input from another thread, then closes it (the end of
  /// the input); ``finish()`` waits for it.
  func feedAndClose(_ text: String) {
    let handle = input.fileHandleForWriting
    inputClosed = true
    feeding.enter()
    Thread.detachNewThread { [feeding] in
      try? handle.write(contentsOf: Data(text.utf8))
      try? handle.close()
      feeding.leave()
    }
  }

  /// Reads the child's standard output until it holds `text` (or ends); whether it does.
  func waitForOutput(_ text: String) -> Bool {
    while !String(decoding: seen, as: UTF8.self).contains(text) {
      let data = output.fileHandleForReading.availableData
      if data.isEmpty { return false }
      seen += data
    }
    return true
  }

  /// Sends SIGKILL to the child if it is still running.
  func killAbruptly() {
    if process.isRunning { _ = kill(process.processIdentifier, SIGKILL) }
  }

  /// Closes standard input and waits for the child to end; what it printed and its status.
  func finish() -> CommandResult {
    feeding.wait()
    if !inputClosed { try? input.fileHandleForWriting.close() }
    let errorHandle = errors.fileHandleForReading
    let stderr = Mutex(Data())
    let group = DispatchGroup()
    group.enter()
    Thread.detachNewThread {
      let data = errorHandle.readAll()
      stderr.withLock { $0 = data }
      group.leave()
    }
    let stdout = seen + output.fileHandleForReading.readAll()
    group.wait()
    process.waitUntilExit()
    return CommandResult(
      status: process.terminationStatus, stdout: String(decoding: stdout, as: UTF8.self),
      stderr: String(decoding: stderr.withLock { $0 }, as: UTF8.self))
  }
}

/// An export of a store where `tasks` tasks (tag "exported") were added and the first `cancelled`
/// of them cancelled before the rest were added, as `ferry export` wrote it: early in the log, its
/// task events name low task ids, the ones an app's first tasks get in a new store.
func exportOfTasks(_ tasks: Int, cancelled: Int = 0) async throws -> String {
  let source = DemoStore()
  defer { source.remove() }
  let store = try await FerryStore.open(at: source.path)
  func add(_ range: Range<Int>) async throws -> [TaskID] {
    try await withThrowingTaskGroup(of: [TaskID].self) { group in
      for caller in 0..<32 {
        group.addTask {
          var ids: [TaskID] = []
          for i in stride(from: range.lowerBound + caller, to: range.upperBound, by: 32) {
            ids.append(try await store.queue.add(tag: "exported", payload: ["n": i], dataId: "x-\(i)"))
          }
          return ids
        }
      }
      return try await group.reduce(into: []) { $0 += $1 }
    }
  }
  do {
    for id in try await add(0..<cancelled) { try await store.queue.cancel(id) }
    _ = try await add(cancelled..<tasks)
  } catch {
    store.close()
    throw error
  }
  store.close()
  let exported = try ferry(["export", source.path])
  #expect(exported.status == 0)
  return exported.stdout
}

/// How long (in seconds) `ferry import` of `export` takes here, start to end, into a new directory.
func timeOfImport(_ export: String) throws -> Double {
  let place = try ImportPlace()
  defer { place.remove() }
  let start = Date()
  let imported = try ferry(["import", place.target], input: export)
  #expect(imported.status == 0, "\(imported.stderr)")
  return Date().timeIntervalSince(start)
}

/// Waits until `condition` holds; returns whether it did. Its ten minutes are a hang guard far
/// above a loaded run (this blocking wait is beyond the time limit's reach).
func eventually(_ condition: () throws -> Bool) rethrows -> Bool {
  let deadline = Date().addingTimeInterval(600)
  while Date() < deadline {
    if try condition() { return true }
    usleep(5_000)
  }
  return try condition()
}

/// The queued tasks of the store at `path`, by id, as `ferry inspect --json` reads them.
func queuedTasks(_ path: String) throws -> [TaskID: InspectReport.Task] {
  let inspected = try ferry(["inspect", path, "--json"])
  #expect(inspected.status == 0, "\(inspected.stderr)")
  let report = try JSONDecoder().decode(InspectReport.self, from: Data(inspected.stdout.utf8))
  return Dictionary(report.tasks.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
}

/// The event lines of an export (without its header, which counts them).
func eventLines(_ export: String) -> [Substring] { Array(export.split(separator: "\n").dropFirst()) }

/// The bytes of every file under a directory, by relative path (a directory's are empty).
func contents(of directory: String) throws -> [String: Data] {
  var result: [String: Data] = [:]
  for name in FileManager.default.subpaths(atPath: directory) ?? [] {
    var isDirectory: ObjCBool = false
    let path = directory + "/" + name
    guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else { continue }
    result[name] = isDirectory.boolValue ? Data() : try Data(contentsOf: URL(fileURLWithPath: path))
  }
  return result
}

@Suite(.timeLimit(.minutes(20)), .serialized) struct ImportTests {
  @Test func aNonEmptyTargetIsRefusedBeforeAnythingIsWritten() async throws {
    let place = try ImportPlace()
    defer { place.remove() }
    let export = try ferry(["export", try await demoStore(in: place.parent + "/source")]).stdout
    try FileManager.default.removeItem(atPath: place.parent + "/source")

    // A store with events of its own.
    _ = try await runDemo(path: place.target, seed: 2, output: Output(line: { _ in }))
    let before = try contents(of: place.target)
    #expect(before["data.mdb"] != nil)
    let refused = try ferry(["import", place.target], input: export)
    #expect(refused.status == ExitStatus.badInput.rawValue)
    #expect(refused.stderr.contains("is not empty"))
    #expect(refused.stderr.split(separator: "\n").count == 1)
    #expect(try contents(of: place.target) == before, "every file of the store byte-identical")
    #expect(place.entries() == ["store"], "nothing written beside it either")

    // Any other non-empty directory, and a file.
    try FileManager.default.removeItem(atPath: place.target)
    try FileManager.default.createDirectory(atPath: place.target, withIntermediateDirectories: false)
    #expect(FileManager.default.createFile(atPath: place.target + "/notes.txt", contents: Data("hi".utf8)))
    #expect(try ferry(["import", place.target], input: export).status == ExitStatus.badInput.rawValue)
    #expect(try contents(of: place.target) == ["notes.txt": Data("hi".utf8)])
    try FileManager.default.removeItem(atPath: place.target)
    #expect(FileManager.default.createFile(atPath: place.target, contents: Data("file".utf8)))
    let file = try ferry(["import", place.target], input: export)
    #expect(file.status == ExitStatus.notAStore.rawValue)
    #expect(try Data(contentsOf: URL(fileURLWithPath: place.target)) == Data("file".utf8))
    #expect(place.entries() == ["store"])

    // Bad input or a truncated export leaves no store.
    try FileManager.default.removeItem(atPath: place.target)
    #expect(try ferry(["import", place.target], input: "not json\n").status == ExitStatus.badInput.rawValue)
    let truncated = export.split(separator: "\n").dropLast(3).joined(separator: "\n") + "\n"
    let short = try ferry(["import", place.target], input: truncated)
    #expect(short.status == ExitStatus.badInput.rawValue)
    #expect(short.stderr.contains("promised 33 events"))
    #expect(place.entries() == [], "no target and no temporary directory")

    // An empty directory is taken, and gets the whole log.
    try FileManager.default.createDirectory(atPath: place.target, withIntermediateDirectories: false)
    let imported = try ferry(["import", place.target], input: export)
    #expect(imported.status == 0, "\(imported.stderr)")
    #expect(imported.stdout.contains("imported 33 events"))
    #expect(try ferry(["verify", place.target]).status == 0)
    #expect(try ferry(["export", place.target]).stdout == export)
    #expect(place.entries() == ["store"])
  }

  /// An app adds 200 tasks to the target while an import into it runs. Whatever the timing, every
  /// task whose add returned is still queued, unchanged: either the import refused (the app's store
  /// was there first) or the app's tasks came after the imported log.
  @Test func anAppAddingTasksDuringAnImportLosesNone() async throws {
    let export = try await exportOfTasks(3000, cancelled: 400)
    let exportedEvents = eventLines(export)
    let header = String(export.split(separator: "\n")[0])
    #expect(exportedEvents.count == 3400)
    let importTime = try timeOfImport(export)
    var outcomes: [String] = []
    for round in 0..<8 {
      let place = try ImportPlace()
      defer { place.remove() }
      let importer = try Child("ferry", ["import", place.target])
      let worker: Child
      switch round {
      case 0, 1:
        // The app opens the store while the import is half-way through ...
        let half = exportedEvents.count / 2
        try importer.write(header + "\n" + exportedEvents[..<half].joined(separator: "\n") + "\n")
        #expect(eventually { !place.stagings().isEmpty })
        worker = try Child("ferry-test-worker", ["add-tasks", place.target, "200"])
        // ... and has added all its tasks (round 0) or its first (round 1, still adding) when the
        // import reads the rest.
        #expect(worker.waitForOutput(round == 0 ? " 199\n" : "ack "))
        importer.feedAndClose(exportedEvents[half...].joined(separator: "\n") + "\n")
      default:
        // Both run at once, the app starting later each round: from as the import starts to after
        // it has finished.
        importer.feedAndClose(export)
        usleep(UInt32(importTime * [0, 0.3, 0.6, 0.9, 1.2, 1.6][round - 2] * 1_000_000))
        worker = try Child("ferry-test-worker", ["add-tasks", place.target, "200"])
      }
      let imported = importer.finish()
      let added = worker.finish()
      let acks: [(id: TaskID, n: Int)] = added.stdout.split(separator: "\n").compactMap { line in
        let parts = line.split(separator: " ")
        guard parts.count == 3, parts[0] == "ack", let id = TaskID(String(parts[1])), let n = Int(parts[2])
        else {
          return nil
        }
        return (id, n)
      }

      #expect([0, 3].contains(added.status), "worker: \(added.stderr)")
      if added.status == 0 { #expect(acks.count == 200) }
      #expect(
        [0, ExitStatus.unavailable.rawValue, ExitStatus.badInput.rawValue].contains(imported.status),
        "import: \(imported.stderr)")
      if round <= 1 {
        #expect(imported.status == ExitStatus.unavailable.rawValue, "the app's store was there first")
        #expect(imported.stderr.contains("another process created a store"))
      }
      #expect(place.entries() == ["store"], "no temporary directory left: \(place.entries())")
      let verified = try ferry(["verify", place.target])
      #expect(verified.status == 0, "\(verified.stdout)")

      // Every acknowledged add is a queued task, the app's own.
      let tasks = try queuedTasks(place.target)
      let lost = acks.filter { tasks[$0.id]?.tag != "app" || tasks[$0.id]?.dataId != "app-\($0.n)" }
      #expect(lost.isEmpty, "round \(round): \(lost.count) acknowledged tasks lost or overwritten")

      let stored = eventLines(try ferry(["export", place.target]).stdout)
      if imported.status == 0 {
        // The import came first: its whole log, then the app's tasks after it.
        #expect(Array(stored.prefix(exportedEvents.count)) == exportedEvents)
        #expect(stored.count == exportedEvents.count + acks.count)
        #expect(tasks.count == 2600 + acks.count)
        outcomes.append("imported, then the app added \(acks.count)")
      } else {
        // The app came first: its store alone, nothing imported into it.
        #expect(stored.count == acks.count)
        #expect(tasks.count == acks.count)
        outcomes.append("import refused (\(imported.status)), the app added \(acks.count)")
      }
    }
    print(
      "import race (a clean import takes \(Int(importTime * 1000)) ms): \(outcomes.joined(separator: "; "))")
  }

  /// `ferry import` killed part-way leaves no store at the target; the next import removes the
  /// temporary directory and imports everything.
  @Test func aKilledImportLeavesNothingAndTheNextImportSucceeds() async throws {
    let export = try await exportOfTasks(5000)
    let lines = export.split(separator: "\n")
    for targetExists in [false, true] {
      let place = try ImportPlace()
      defer { place.remove() }
      if targetExists {
        try FileManager.default.createDirectory(atPath: place.target, withIntermediateDirectories: false)
      }
      let importer = try Child("ferry", ["import", place.target])
      // The header and 2500 events: the first 2000 are written to the new store, then it waits.
      try importer.write(lines[...2500].joined(separator: "\n") + "\n")
      #expect(eventually { !place.stagings().isEmpty })
      let staging = place.parent + "/" + (place.stagings().first ?? "")
      #expect(
        try eventually { try ferry(["stats", staging]).stdout.contains("events: 2000") },
        "the killed import had written part of the log")
      importer.killAbruptly()
      let killed = importer.finish()
      #expect(killed.status == SIGKILL)  // Process reports the signal for a killed child

      #expect(place.targetHoldsNothing(), "no partial store at the target")
      #expect(place.stagings().count == 1, "only the killed import's temporary directory beside it")

      let again = try ferry(["import", place.target], input: export)
      #expect(again.status == 0, "\(again.stderr)")
      #expect(again.stdout.contains("removed 1 temporary directories"))
      #expect(again.stdout.contains("imported 5000 events"))
      #expect(place.entries() == ["store"], "the stale temporary directory is gone: \(place.entries())")
      let verified = try ferry(["verify", place.target])
      #expect(verified.status == 0)
      #expect(verified.stdout.contains("verified 5000 of 5000 records"))
      #expect(try ferry(["export", place.target]).stdout == export)
    }

    // Killed at arbitrary moments: nothing or everything, never part.
    let importTime = try timeOfImport(export)
    var outcomes: [String] = []
    for fraction in [0.1, 0.3, 0.5, 0.7, 0.85, 1.0, 1.2, 1.5] {
      let place = try ImportPlace()
      defer { place.remove() }
      let importer = try Child("ferry", ["import", place.target])
      importer.feedAndClose(export)
      usleep(UInt32(importTime * fraction * 1_000_000))
      importer.killAbruptly()
      let result = importer.finish()
      if place.targetHoldsNothing() {
        #expect(result.status != 0)
        let again = try ferry(["import", place.target], input: export)
        #expect(again.status == 0, "\(again.stderr)")
        outcomes.append("nothing")
      } else {
        outcomes.append(result.status == 0 ? "everything (finished)" : "everything (killed after the rename)")
      }
      #expect(try ferry(["verify", place.target]).status == 0)
      #expect(try ferry(["export", place.target]).stdout == export)
      // (Killed between the rename and the unlink of its lock file, an import leaves that empty file.)
      #expect(place.entries().filter { !$0.hasSuffix(".lock") } == ["store"], "\(place.entries())")
    }
    print(
      "imports killed at 10% to 150% of a clean import's \(Int(importTime * 1000)) ms left: "
        + outcomes.joined(separator: ", "))
  }

  /// A running import's temporary directory is not stale: a second import into the same target
  /// leaves it alone, and the first then finds the target taken.
  @Test func aRunningImportIsNotTakenForAKilledOne() async throws {
    let place = try ImportPlace()
    defer { place.remove() }
    let export = try ferry(["export", try await demoStore(in: place.parent + "/source")]).stdout
    try FileManager.default.removeItem(atPath: place.parent + "/source")
    let lines = export.split(separator: "\n")
    let first = try Child("ferry", ["import", place.target])
    try first.write(lines[...10].joined(separator: "\n") + "\n")
    #expect(eventually { !place.stagings().isEmpty })
    let running = place.stagings()

    let second = try ferry(["import", place.target], input: export)
    #expect(second.status == 0, "\(second.stderr)")
    #expect(!second.stdout.contains("removed"))
    #expect(place.stagings() == running, "the running import's directory is still there")

    try first.write(lines[11...].joined(separator: "\n") + "\n")
    let finished = first.finish()
    #expect(finished.status == ExitStatus.unavailable.rawValue)
    #expect(finished.stderr.contains("another process created a store"))
    #expect(place.entries() == ["store"])
    #expect(try ferry(["export", place.target]).stdout == export)
  }
}

extension ImportTests {
  /// The export of a compacted store holds only the events left: import refuses it, and says the
  /// store was compacted and how to move one, rather than only "sequence 37, expected 1".
  @Test func anExportOfACompactedStoreIsRefusedWithTheReason() async throws {
    let source = DemoStore()
    let copy = DemoStore()
    defer {
      source.remove()
      copy.remove()
    }
    _ = try await demoStore(in: source.path)
    let compacted = try ferry(["compact", source.path, "--retention", "0"])
    #expect(compacted.status == 0, "\(compacted.stderr)")
    let exported = try ferry(["export", source.path])
    #expect(exported.status == 0, "\(exported.stderr)")
    let imported = try ferry(["import", copy.path], input: exported.stdout)
    #expect(imported.status == 8, "\(imported.stdout) \(imported.stderr)")
    #expect(imported.stderr.contains("was compacted (events 1–"), "\(imported.stderr)")
    #expect(imported.stderr.contains("an import takes a whole log only"), "\(imported.stderr)")
    #expect(!FileManager.default.fileExists(atPath: copy.path + "/data.mdb"))
  }
}

/// Runs the demo into `path` (33 events) and returns the path.
func demoStore(in path: String) async throws -> String {
  _ = try await runDemo(path: path, seed: 7, output: Output(line: { _ in }))
  return path
}
