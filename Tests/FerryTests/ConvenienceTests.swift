import FerryLog
import FerryTesting
import Foundation
import Testing

@_spi(Engine) @testable import Ferry

/// The app's own tag type, as Wendy allowed: the log stores the raw value.
enum Work: String, Sendable {
  case saveNote = "save-note"
  case deleteNote = "delete-note"
}

/// What app developers reach for around the queue and the gate (issue 14): typed tags, a gate
/// checked when it is made, and the rest of the public types reading as phrases.
@Suite(.timeLimit(.minutes(20))) struct ConvenienceTests {
  // MARK: Typed tags

  /// Tasks added with an enum tag and with its raw string are one tag: two runners registered by
  /// the enum run each of them exactly once (read from the log), and cancel/pendingTasks by the
  /// enum select the same tasks as by the string.
  @Test func anEnumTagIsItsRawValueForAddRegisterCancelAndReads() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      var saves: [TaskID] = []
      for i in 0..<20 {
        saves.append(
          i % 2 == 0
            ? try await queue.add(tag: Work.saveNote, payload: ["i": i], groupId: "n\(i % 3)")
            : try await queue.add(tag: "save-note", payload: ["i": i]))
      }
      let deletes = [
        try await queue.add(tag: Work.deleteNote, payload: ["i": 1]),
        try await queue.add(tag: "delete-note", payload: ["i": 2]),
      ]
      #expect(try queue.pendingTasks(tag: Work.deleteNote).map(\.id) == deletes)
      #expect(try queue.pendingTasks(tag: Work.saveNote).map(\.id) == saves)
      #expect(try queue.task(deletes[1])?.tag(as: Work.self) == .deleteNote)

      let cancelled = try await queue.cancel(tag: Work.deleteNote)
      #expect(cancelled.cancelled == deletes && cancelled.running.isEmpty)

      let runners = [
        runner(queue) { $0.maxConcurrentTasks = 2 }, runner(queue) { $0.maxConcurrentTasks = 2 },
      ]
      for run in runners {
        run.register(tag: Work.saveNote) { task in
          #expect(task.tag(as: Work.self) == .saveNote)
          return .succeeded
        }
      }
      async let first = runners[0].run()
      async let second = runners[1].run()
      _ = try await (first, second)

      let events = try store.log.forEachTaskEvent()
      var starts: [TaskID: Int] = [:]
      var successes: [TaskID: Int] = [:]
      for (_, event) in events {
        if case .runStarted(let id, _, _, _, _) = event { starts[id, default: 0] += 1 }
        if case .runSucceeded(let id, _) = event { successes[id, default: 0] += 1 }
      }
      #expect(Set(starts.keys) == Set(saves))
      #expect(starts.values.allSatisfy { $0 == 1 } && successes.values.allSatisfy { $0 == 1 })
      #expect(try queue.pendingTasks().isEmpty)
      try expectConsistent(queue)
    }
  }

  /// A tag the app's enum does not know (written by another version of the app) reads as nil,
  /// never a crash, and still runs under its string handler.
  @Test func aTagOutsideTheEnumReadsAsNil() async throws {
    try await withStore { store, _, _ in
      let id = try await store.queue.add(tag: "archive-note", payload: ["i": 1])
      let task = try #require(try store.queue.task(id))
      #expect(task.tag(as: Work.self) == nil)
      #expect(task.tag == "archive-note")
    }
  }

  // MARK: The gate is checked when it is made

  @Test func aGateOnAnUnknownOrEmptyCollectionIsRefusedWhenMade() async throws {
    try await withStore { store, _, _ in
      let plain = TaskRunner(queue: store.queue)
      #expect {
        try PendingTasksGate(runner: plain, collection: "note-changes")
      } throws: { error in
        guard case FerryError.unknownCollection("note-changes") = error else { return false }
        return true
      }
      var configuration = TaskRunner.Configuration()
      configuration.collections["empty"] = []
      configuration.collections["note-changes"] = [Work.saveNote.rawValue]
      let configured = TaskRunner(queue: store.queue, configuration: configuration)
      #expect {
        try PendingTasksGate(runner: configured, collection: "empty")
      } throws: { error in
        guard case FerryError.invalidArgument(let message) = error else { return false }
        return message.contains("no tags")
      }
      let gate = try PendingTasksGate(runner: configured, collection: "note-changes")
      #expect(gate.collection == "note-changes")
    }
  }

  /// A gate whose runner runs another store's queue could never hold back this store's fetches:
  /// the repository refuses it when made (all three kinds), not at its first refresh.
  @Test func aGateOfAnotherStoreIsRefusedByEveryRepositoryKind() async throws {
    try await withStore { store, _, _ in
      try await withStore { other, _, _ in
        var configuration = TaskRunner.Configuration()
        configuration.collections["changes"] = ["save-note"]
        let foreign = try PendingTasksGate(
          runner: TaskRunner(queue: other.queue, configuration: configuration), collection: "changes")
        let source = CacheSource<[String]>(fetch: { ["a"] }, save: { _ in }, load: { nil })
        let refusedAsForeign: (any Error) -> Bool = { error in
          guard case FerryError.invalidArgument(let message) = error else { return false }
          return message.contains("another store")
        }
        #expect(
          performing: {
            try CacheRepository(
              key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: source, requires: foreign)
          }, throws: refusedAsForeign)
        #expect(
          performing: {
            try CacheRequirementsRepository<String, [String]>(
              ledger: store.ledger, maxAge: .seconds(60), key: { "notes-\($0)" }, source: { _ in source },
              requires: foreign)
          }, throws: refusedAsForeign)
        #expect(
          performing: {
            try CachePagingRepository<[String], [String]>(
              key: "feed", ledger: store.ledger, maxAge: .seconds(60),
              source: PagingSource(
                fetchPage: { _ in (["a"], nil) }, save: { _, _ in }, load: { nil }),
              requires: foreign)
          }, throws: refusedAsForeign)
        // The same gate on its own store is fine.
        _ = try CacheRepository(
          key: "notes", ledger: other.ledger, maxAge: .seconds(60), source: source, requires: foreign)
      }
    }
  }

  @Test func aNegativeMaxAgeIsRefusedByTheRequirementsRepository() async throws {
    try await withStore { store, _, _ in
      let source = CacheSource<[String]>(fetch: { [] }, save: { _ in }, load: { nil })
      #expect(throws: FerryError.self) {
        try CacheRequirementsRepository<String, [String]>(
          ledger: store.ledger, maxAge: .seconds(-1), key: { $0 }, source: { _ in source })
      }
    }
  }

  // MARK: The rest of the public types read as phrases

  @Test func reportsResultsAndPullSideEnumsReadAsPhrases() {
    #expect("\(TaskResult.failed("offline"))" == "failed: offline")
    #expect("\(TaskResult.failed("refused", retryable: false))" == "failed for good: refused")
    #expect("\(TaskResult.recordError("log in"))" == "error for the user: log in")
    #expect("\(RunFilter.collection("note-changes"))" == "collection note-changes")
    #expect("\(UniquePolicy.replace)" == "replace the queued tasks")
    #expect("\(CancelReport(cancelled: [1, 2], running: [3]))" == "cancelled 2 (1, 2); still running: 3")
    #expect("\(CancelReport(cancelled: [], running: []))" == "cancelled 0 (none)")
    #expect("\(FetchResult.success(isEmpty: true))" == "success (empty)")
    #expect("\(FetchResult.failure("timeout"))" == "failure: timeout")
    #expect("\(LoadMoreResult.noMorePages)" == "no more pages")
    #expect("\(RefreshError.Stage.save)" == "saving")
    var report = PassReport()
    report.entries = [
      .init(taskId: 1, outcome: .succeeded), .init(taskId: 2, outcome: .failed("x", retryAt: nil)),
      .init(taskId: 3, outcome: .skipped(.noHandler)),
    ]
    #expect("\(report)" == "2 ran (1 succeeded, 1 failed), 1 skipped")
    #expect("\(report.entries[2])" == "task 3: skipped: no handler for its tag")
    for text in ["\(report)", "\(LoadMoreResult.loaded)", "\(RunFilter.task(4))"] {
      #expect(!text.contains("Optional(") && !text.contains("Ferry."), "\(text)")
    }
  }

  /// Tasks, errors, histories and cache records read as phrases, times as ISO dates.
  @Test func tasksHistoriesAndCacheRecordsReadAsPhrases() async throws {
    try await withStore { store, clock, _ in
      let queue = store.queue
      let id = try await queue.add(
        tag: "upload", payload: ["n": 1], groupId: "album", options: [.priority(.high)])
      let run = runner(queue)
      run.register(tag: "upload", retry: RetryPolicy(initialDelay: .seconds(60), jitter: 0)) { _ in
        .failed("offline")
      }
      _ = try await run.run()
      let task = try #require(try queue.task(id))
      let retryAt = clock.milliseconds + 60_000
      #expect(
        "\(task)"
          == "task \(id) (upload, group album, priority high): waiting until \(readableTime(at(retryAt))), "
          + "1 attempt, last failure: offline")
      let history = try queue.history(of: id).map { "\($0.event)" }
      #expect(
        history == [
          "added", "run started (attempt 1)", "failed: offline, retry at \(readableTime(at(retryAt)))",
        ])
      try await store.ledger.recordFetch(key: "notes", outcome: .failure("timeout"))
      let record = try #require(try store.ledger.record("notes"))
      #expect("\(record)".hasPrefix("notes: 1 fetch, never fetched successfully, last failure "))
      #expect("\(record)".hasSuffix(": timeout"))
      for text in ["\(task)", "\(record)", history.joined()] {
        #expect(!text.contains("Optional(") && !text.contains("Ferry.") && !text.contains("1970"), "\(text)")
      }
    }
  }
}
