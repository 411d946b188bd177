import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// A child process of this package (a worker or the `ferry` tool), its output read line by line.
final class Child: Sendable {
  let process: Process
  private let lines = Mutex<[String]>([])
  private let ended = Mutex(false)

  init(
    _ product: String, _ arguments: [String], stdin: FileHandle? = nil, environment: [String: String] = [:]
  ) throws {
    signal(SIGPIPE, SIG_IGN)  // a write to a child that died must fail, not kill the test process
    process = Process()
    process.executableURL = productURL(product)
    process.arguments = arguments
    if !environment.isEmpty {
      process.environment = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
    }
    let pipe = Pipe()
    process.standardOutput = pipe
    process.standardError = FileHandle.nullDevice
    if let stdin { process.standardInput = stdin }
    try process.run()
    let reader = pipe.fileHandleForReading
    Thread.detachNewThread { [self] in
      var partial = ""
      while true {
        let data = reader.availableData
        if data.isEmpty { break }
        partial += String(decoding: data, as: UTF8.self)
        while let newline = partial.firstIndex(of: "\n") {
          let line = String(partial[..<newline])
          partial = String(partial[partial.index(after: newline)...])
          self.lines.withLock { $0.append(line) }
        }
      }
      // Reaped here, on this thread of its own, and only here: Foundation releases a process's
      // descriptors only through `waitUntilExit()` (callers that only polled `isRunning` left one
      // open per child, hundreds across a run), and `waitUntilExit()` must not run on two threads
      // at once (it sets and clears the process's run-loop state without a lock).
      self.process.waitUntilExit()
      self.ended.withLock { $0 = true }
    }
  }

  var output: [String] { lines.withLock { $0 } }
  /// The task ids of its "ack ID …" lines (the workers' acknowledged adds), in order.
  var acknowledgedIds: [TaskID] {
    output.filter { $0.hasPrefix("ack ") }.compactMap {
      $0.split(separator: " ").dropFirst().first.flatMap { TaskID($0) }
    }
  }
  var pid: Int32 { process.processIdentifier }

  /// Waits for a line that starts with `prefix` and returns it; throws once the child has ended
  /// without one. No wall-clock give-up: a child a loaded machine slows still answers, and one
  /// that hangs is ended by the test's time limit.
  func waitForLine(startingWith prefix: String) async throws -> String {
    while true {
      if let line = output.first(where: { $0.hasPrefix(prefix) }) { return line }
      if ended.withLock({ $0 }) && !process.isRunning {
        // The reader has taken all the child wrote: look once more before giving up.
        if let line = output.first(where: { $0.hasPrefix(prefix) }) { return line }
        break
      }
      try await Task.sleep(for: .milliseconds(5))
    }
    throw FerryError.invalidArgument("no line starting with '\(prefix)' from the child: \(output.suffix(5))")
  }

  /// A worker that adds a task to the store at `path` and hangs in its handler: the live run of
  /// another process. Returns once the handler runs, with the task's id.
  static func hangingRun(in path: String) async throws -> (Child, TaskID) {
    let child = try Child("ferry-test-worker", ["run-and-hang", path])
    let line = try await child.waitForLine(startingWith: "running ")
    guard let id = TaskID(line.dropFirst("running ".count)) else {
      child.kill()
      throw FerryError.invalidArgument("the worker said '\(line)'")
    }
    return (child, id)
  }

  /// SIGKILLs it and waits (up to a minute) until it has exited — not for the end of its output
  /// (a grandchild may hold that open) and not by `waitUntilExit()` (its output's reader reaps it).
  func kill() {
    Foundation.kill(process.processIdentifier, SIGKILL)
    let deadline = ContinuousClock.now + .seconds(60)
    while process.isRunning && ContinuousClock.now < deadline { usleep(1_000) }
  }

  /// Waits for the child to exit (a child that hangs is ended by the test's time limit), then for
  /// its reader to take the rest of its output (up to a minute more, a hang guard: a grandchild may
  /// hold the pipe open), and returns its status. Without the second wait a caller could read `output`
  /// before the child's last line arrived (seen in CI: a `ferry recover --json` that exited 0 had
  /// no line yet).
  func wait() async throws -> Int32 {
    while process.isRunning {
      try await Task.sleep(for: .milliseconds(10))
    }
    let drained = ContinuousClock.now + .seconds(60)
    while !ended.withLock({ $0 }) && ContinuousClock.now < drained {
      try await Task.sleep(for: .milliseconds(5))
    }
    return process.terminationStatus
  }
}

/// What the log says about each task's runs (`Specs/crash-model.md`, "no double run without a
/// dead owner"): read from the events, never from counters the code under test keeps.
struct RunLedger {
  struct Runs {
    var starts: [String] = []  // owner of each run, in order
    var finishes = 0
    var successes = 0
    var interruptions: [String] = []  // owner of each interrupted run
  }

  var tasks: [TaskID: Runs] = [:]
  var violations: [String] = []

  init(_ log: EventLog, deadOwners: (String) -> Bool = { _ in false }) throws {
    var open: [TaskID: String] = [:]
    try log.forEachEvent { event in
      guard TaskEvent.typeSet.contains(event.type) else { return }
      switch try TaskEvent(event) {
      case .added:
        tasks[TaskID(rawValue: event.sequence)] = Runs()
      case .runStarted(let id, _, let owner, _, _):
        if let other = open[id] {
          violations.append("task \(id) claimed at \(event.sequence) while \(other)'s run was under way")
        }
        open[id] = owner
        tasks[id, default: Runs()].starts.append(owner)
      case .runSucceeded(let id, _), .runFailed(let id, _, _, _), .errorRecorded(let id, _, true):
        guard open.removeValue(forKey: id) != nil else {
          violations.append("task \(id) finished at \(event.sequence) with no run under way")
          return
        }
        tasks[id, default: Runs()].finishes += 1
        if event.type == "task.runSucceeded" { tasks[id, default: Runs()].successes += 1 }
      case .runInterrupted(let id):
        guard let owner = open.removeValue(forKey: id) else {
          violations.append("task \(id) interrupted at \(event.sequence) with no run under way")
          return
        }
        if !deadOwners(owner) {
          violations.append("task \(id): the run of live owner \(owner) was interrupted at \(event.sequence)")
        }
        tasks[id, default: Runs()].interruptions.append(owner)
      default:
        break
      }
    }
    for (id, runs) in tasks where runs.successes > 1 {
      violations.append("task \(id) succeeded \(runs.successes) times")
    }
  }

  /// Every run ended exactly once; a task ran at most once, except that a run whose owner died
  /// was run at most once more; a task that never ran is still queued (behind a blocked head).
  func expectEachTaskRanOnce(
    _ ids: [TaskID], queued: Set<TaskID> = [], sourceLocation: SourceLocation = #_sourceLocation
  ) {
    #expect(violations.isEmpty, "\(violations.prefix(5))", sourceLocation: sourceLocation)
    for id in ids {
      let runs = tasks[id] ?? Runs()
      #expect(runs.finishes <= 1, "task \(id): \(runs)", sourceLocation: sourceLocation)
      #expect(
        runs.starts.count == runs.finishes + runs.interruptions.count, "task \(id): \(runs)",
        sourceLocation: sourceLocation)
      #expect(runs.interruptions.count <= 1, "task \(id): \(runs)", sourceLocation: sourceLocation)
      if runs.finishes == 0 {
        #expect(
          queued.contains(id), "task \(id) never ran and is gone: \(runs)", sourceLocation: sourceLocation)
      }
    }
  }
}

/// The owner ids a process with this pid logs (`<pid hex>-<random>`).
func ownerPrefix(_ pid: Int32) -> String { String(UInt32(bitPattern: pid), radix: 16) + "-" }

@Suite(.timeLimit(.minutes(20))) struct OwnershipTests {
  /// Adds `count` "job" tasks whose kinds follow `kind(i)`, in groups of ten for a third of them.
  func addJobs(_ queue: TaskQueue, _ count: Int, kind: (Int) -> String) async throws -> [TaskID] {
    var ids: [TaskID] = []
    for i in 0..<count {
      ids.append(
        try await queue.add(
          tag: "job", payload: ["kind": kind(i), "n": "\(i)"], groupId: i % 3 == 0 ? "g\(i % 30)" : nil))
    }
    return ids
  }

  static func kind(_ i: Int) -> String { i % 10 == 3 ? "fail" : i % 10 == 7 ? "error" : "ok" }

  @Test func twoRunnersInOneProcessRunEachTaskOnce() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let ids = try await addJobs(queue, 1000, kind: Self.kind)
    var wide = TaskRunner.Configuration()
    wide.maxConcurrentTasks = 4
    let runners = [TaskRunner(queue: queue), TaskRunner(queue: queue, configuration: wide)]
    for runner in runners {
      runner.register(tag: "job") { task in
        try? await Task.sleep(for: .milliseconds(1))
        switch try task.payload(as: [String: String].self)["kind"] {
        case "fail": return .failed("refused", retryable: false)
        case "error": return .recordError("fix it")
        default: return .succeeded
        }
      }
    }
    try await withThrowingTaskGroup(of: Void.self) { group in
      for runner in runners {
        group.addTask {
          var idle = 0
          while idle < 3 {
            let report = try await runner.run()
            idle = try report.entries.isEmpty && queue.nextRunnable() == nil ? idle + 1 : 0
          }
        }
      }
      try await group.waitForAll()
    }
    let ledger = try RunLedger(queue.log)
    let pending = try queue.pendingTasks()
    ledger.expectEachTaskRanOnce(ids, queued: Set(pending.map(\.id)))
    #expect(ledger.tasks.values.filter { $0.finishes == 1 }.count > 500)
    // What is left could not run: dead, blocked, or behind a dead or blocked head.
    #expect(try queue.nextRunnable() == nil)
    #expect(try queue.log.verify().isHealthy)
  }

  @Test func twoRunnerProcessesRunEachTaskOnceAndTakeOverADeadOnesRun() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var ids: [TaskID] = []
    do {
      let queue = try await TaskQueue.open(at: fixture.path)
      defer { queue.close() }
      ids = try await addJobs(queue, 1000) { i in i == 400 ? "crash" : Self.kind(i) }
    }
    let children = [
      try Child("ferry-test-worker", ["run-tasks", fixture.path]),
      try Child("ferry-test-worker", ["run-tasks", fixture.path, "3"]),
    ]
    var crashed: Set<String> = []
    for child in children {
      let status = try await child.wait()
      if child.process.terminationReason == .uncaughtSignal {
        #expect(status == SIGKILL)
        crashed.insert(ownerPrefix(child.pid))
      } else {
        #expect(status == 0, "worker output: \(child.output.suffix(3))")
      }
    }
    #expect(crashed.count == 1, "exactly one worker met the crashing task")
    // The survivor may have finished before it saw the owner die: a pass here takes the run over.
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let runner = TaskRunner(queue: queue)
    runner.register(tag: "job") { _ in .succeeded }
    _ = try await runner.run()
    let ledger = try RunLedger(queue.log) { owner in crashed.contains { owner.hasPrefix($0) } }
    ledger.expectEachTaskRanOnce(ids, queued: Set(try queue.pendingTasks().map(\.id)))
    let crashTask = ids[400]
    let history = try queue.history(of: crashTask)
    #expect(ledger.tasks[crashTask]?.interruptions.count == 1, "\(history)")
    #expect(ledger.tasks[crashTask]?.successes == 1)
    // Both processes ran tasks.
    let owners = Set(ledger.tasks.values.flatMap(\.starts).compactMap { $0.split(separator: "-").first })
    #expect(owners.count >= 2, "owners: \(owners)")
    #expect(try queue.log.verify().isHealthy)
  }

  @Test func opensCompactionAndImportFromOtherProcessesLeaveALiveRunAlone() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let (hanging, id) = try await Child.hangingRun(in: fixture.path)
    defer { hanging.kill() }

    // Another process opens the store read-write (an app, an extension)...
    do {
      let other = try await FerryStore.open(at: fixture.path)
      #expect(other.queue.interruptedAtOpen.isEmpty)
      #expect(try await other.queue.interruptRunsOfDeadOwners().isEmpty)
      #expect(try other.queue.task(id)?.status == .running)
      other.close()
    }
    // ...and the tool compacts it in place, inspects it, and refuses an import into it.
    let compact = try Child("ferry", ["compact", fixture.path, "--retention", "0"])
    #expect(try await compact.wait() == 0)
    let inspect = try Child("ferry", ["inspect", fixture.path])
    #expect(try await inspect.wait() == 0)
    let export =
      FileManager.default.temporaryDirectory.path + "/ferry-export-\(UUID().uuidString.prefix(8)).jsonl"
    defer { try? FileManager.default.removeItem(atPath: export) }
    _ = FileManager.default.createFile(
      atPath: export, contents: Data("{\"ferry\":\"export\",\"format\":1,\"events\":0}\n".utf8))
    let importing = try Child("ferry", ["import", fixture.path], stdin: FileHandle(forReadingAtPath: export))
    #expect(try await importing.wait() != 0)

    do {
      let store = try FerryStore.openReadOnly(at: fixture.path)
      let events = try store.log.events(after: 0, limit: 100).map(\.type)
      #expect(!events.contains("task.runInterrupted"), "\(events)")
      #expect(try store.queue.task(id)?.status == .running)
      store.close()
    }

    // Once the owner is killed, its run is interrupted by the next look, and runs here.
    hanging.kill()
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    #expect(queue.interruptedAtOpen == [id])
    let runner = TaskRunner(queue: queue)
    runner.register(tag: "hang") { task in task.attempt == 2 ? .succeeded : .failed("attempt \(task.attempt)")
    }
    #expect(try await runner.run().outcome(of: id) == .succeeded)
    let ledger = try RunLedger(queue.log) { $0.hasPrefix(ownerPrefix(hanging.pid)) }
    ledger.expectEachTaskRanOnce([id])
  }

  @Test func aSurvivingProcessTakesOverTheRunOfAKilledOne() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let (hanging, id) = try await Child.hangingRun(in: fixture.path)
    // This process has the store open while the other runs: nothing of its run is touched...
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    var configuration = TaskRunner.Configuration()
    configuration.deadOwnerCheckInterval = .milliseconds(50)
    let runner = TaskRunner(queue: queue, configuration: configuration)
    let ran = Mutex<[UInt32]>([])
    runner.register(tag: "hang") { task in
      ran.withLock { $0.append(task.attempt) }
      return .succeeded
    }
    let updates = queue.updates()
    runner.startAutomaticRunning()
    defer { runner.stop() }
    try await Task.sleep(for: .milliseconds(200))
    #expect(ran.withLock { $0 }.isEmpty)
    #expect(try queue.task(id)?.status == .running)
    // ...until it is killed: automatic running sees the owner gone and runs the task.
    hanging.kill()
    for await update in updates {
      if update == .succeeded(id) { break }
    }
    #expect(ran.withLock { $0 } == [2])
    let ledger = try RunLedger(queue.log) { $0.hasPrefix(ownerPrefix(hanging.pid)) }
    ledger.expectEachTaskRanOnce([id])
  }

  @Test func keepReturnsATaskThatIsReallyQueuedWhileItsTwinSucceeds() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let runner = TaskRunner(queue: queue)
    runner.register(tag: "sync") { _ in .succeeded }
    let updates = queue.updates()
    for round in 0..<150 {
      let first = try await queue.add(
        tag: "sync", payload: ["round": round], dataId: "note", options: [.unique(.keep)])
      async let ran = runner.run()
      let kept = try await queue.add(
        tag: "sync", payload: ["round": round], dataId: "note", options: [.unique(.keep)])
      _ = try await ran
      if kept != first {
        // A new task: its add is in the log, and it is queued (or ran) as a task of its own.
        let added = try #require(try queue.log.event(at: kept))
        #expect(added.type == "task.added")
        _ = try await runner.run()
      }
      #expect(try queue.pendingTasks().isEmpty, "round \(round)")
    }
    queue.close()
    // Every `.added` that was published names an add the log holds.
    var published: [TaskID] = []
    for await update in updates { if case .added(let id) = update { published.append(id) } }
    let reopened = try FerryStore.openReadOnly(at: fixture.path)
    defer { reopened.close() }
    for id in published { #expect(try reopened.log.event(at: id)?.type == "task.added") }
  }

  @Test func runAfterAddCoversTheNewTaskEvenWhileAPassIsUnderWay() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let runner = TaskRunner(queue: queue)
    let started = Gate()
    let release = Gate()
    runner.register(tag: "slow") { _ in
      started.open()
      await release.wait()
      return .succeeded
    }
    runner.register(tag: "quick") { _ in .succeeded }
    let slow = try await queue.add(tag: "slow", payload: ["n": 1])
    async let first = runner.run()
    await started.wait()
    let added = try await queue.add(tag: "quick", payload: ["n": 2])
    async let second = runner.run()  // joins the pass under way
    try await Task.sleep(for: .milliseconds(20))
    release.open()
    let (a, b) = try await (first, second)
    #expect(b.outcome(of: added) == .succeeded)
    #expect(a == b)
    #expect(a.outcome(of: slow) == .succeeded)
  }

  @Test func runningOneTaskReportsItsOutcomeWhenAnotherPassRunsIt() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let runner = TaskRunner(queue: queue)
    let other = TaskRunner(queue: queue)
    let started = Gate()
    let release = Gate()
    for each in [runner, other] {
      each.register(tag: "slow") { _ in
        started.open()
        await release.wait()
        return .failed("server down", retryable: false)
      }
    }
    let id = try await queue.add(tag: "slow", payload: ["n": 1])
    async let all = runner.run()
    await started.wait()
    async let single = runner.run(.task(id))
    async let fromOther = other.run(.task(id))
    try await Task.sleep(for: .milliseconds(50))
    release.open()
    let (pass, one, two) = try await (all, single, fromOther)
    #expect(pass.outcome(of: id) == .failed("server down", retryAt: nil))
    #expect(one.outcome(of: id) == .failed("server down", retryAt: nil))
    #expect(two.outcome(of: id) == .failed("server down", retryAt: nil))
    try RunLedger(queue.log).expectEachTaskRanOnce([id])
  }

  @Test func aReplacedTasksHistoryEndsWithItsReplacement() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let old = try await queue.add(
      tag: "save", payload: ["v": 1], dataId: "note-1", options: [.unique(.replace)])
    let new = try await queue.add(
      tag: "save", payload: ["v": 2], dataId: "note-1", options: [.unique(.replace)])
    #expect(try queue.task(old) == nil)
    #expect(try queue.history(of: old).map(\.event) == [.added, .replaced(by: new)])
    #expect(try queue.history(of: new).map(\.event) == [.added])
  }

  @Test func observersSeeWhatAnotherProcessQueues() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let updates = queue.updates()
    let child = try Child("ferry-test-worker", ["add-tasks", fixture.path, "3"])
    #expect(try await child.wait() == 0)
    let acknowledged = child.acknowledgedIds
    #expect(acknowledged.count == 3)
    var seen: [TaskID] = []
    for await update in updates {
      if case .added(let id) = update { seen.append(id) }
      if seen.count == 3 { break }
    }
    #expect(seen == acknowledged)
  }

  @Test func aPassOverABlockedQueueReadsOnlyWhatCanRun() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    for group in 0..<50 {
      let head = try await queue.add(tag: "t", payload: ["g": group], groupId: "g\(group)")
      try await queue.recordError(head, message: "blocked")
      for n in 0..<10 { try await queue.add(tag: "t", payload: ["n": n], groupId: "g\(group)") }
    }
    let runnable = try await queue.add(tag: "t", payload: ["free": 1])
    let runner = TaskRunner(queue: queue)
    runner.register(tag: "t") { _ in .succeeded }
    let report = try await runner.run()
    #expect(report.entries.map(\.taskId) == [runnable])
  }

  @Test func dueRetriesCostWhatTheyReturn() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let runner = TaskRunner(queue: queue)
    runner.register(tag: "t", retry: RetryPolicy(maxAttempts: 5, initialDelay: .seconds(1), jitter: 0)) { _ in
      .failed("offline")
    }
    var ids: [TaskID] = []
    for n in 0..<300 { ids.append(try await queue.add(tag: "t", payload: ["n": n])) }
    _ = try await runner.run()
    #expect(try queue.probeNextRunnable().task == nil)
    fixture.time += 60_000
    let probe = try queue.probeNextRunnable()
    #expect(probe.task?.id == ids.first)
    // The levels present (two seeks in `waiting`, one in the empty `ready`), the due retry, its row.
    #expect(probe.touched <= 5, "read \(probe.touched) entries")
    let after = try queue.probeNextRunnable(after: ids[150])
    #expect(after.task?.id == ids[151])
  }

  @Test func aLiveOwnerWhoseTokenFileWasDeletedKeepsItsRun() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let (hanging, id) = try await Child.hangingRun(in: fixture.path)
    defer { hanging.kill() }
    let owners = fixture.path + "/owners"
    for name in try FileManager.default.contentsOfDirectory(atPath: owners) {
      try FileManager.default.removeItem(atPath: owners + "/" + name)
    }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    #expect(queue.interruptedAtOpen.isEmpty)
    #expect(try await queue.interruptRunsOfDeadOwners().isEmpty)
    #expect(try queue.task(id)?.status == .running)
    hanging.kill()  // now the pid is gone too: dead
    #expect(try await queue.interruptRunsOfDeadOwners() == [id])
  }

  @Test func aQueueClosedWhileItsHandlerRunsHasThatRunInterruptedAtReopen() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let started = Gate()
    let release = Gate()
    var id: TaskID = 0
    do {
      let queue = try await TaskQueue.open(at: fixture.path)
      let runner = TaskRunner(queue: queue)
      runner.register(tag: "slow") { _ in
        started.open()
        await release.wait()
        return .succeeded
      }
      id = try await queue.add(tag: "slow", payload: ["n": 1])
      let pass = Task { try await runner.run() }
      await started.wait()
      queue.close()  // the handler still runs; its outcome cannot be logged any more
      release.open()
      _ = try? await pass.value
    }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    #expect(queue.interruptedAtOpen == [id])
    #expect(try queue.task(id)?.status == .ready)
    // The token files of owners that are gone and claim nothing are swept.
    #expect(try FileManager.default.contentsOfDirectory(atPath: fixture.path + "/owners").isEmpty)
  }

  @Test func cacheStatesSeeAFetchAnotherProcessRecords() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    defer { store.close() }
    let notes = try CacheRepository(
      key: "notes", ledger: store.ledger, maxAge: .seconds(3600),
      source: CacheSource(fetch: { "fresh" }, save: { _ in }, load: { "saved" }), automaticRefresh: false)
    let states = notes.states()
    var iterator = states.makeAsyncIterator()
    let first = await iterator.next()
    guard case .noCache = first?.content else {
      Issue.record("the first state is not noCache: \(String(describing: first))")
      return
    }
    let child = try Child("ferry-test-worker", ["record-fetch", fixture.path, "notes"])
    #expect(try await child.wait() == 0)
    let next = await iterator.next()
    guard case .cache(let value, _, _, let isTooOld) = next?.content else {
      Issue.record("no cached state after another process's fetch: \(String(describing: next))")
      return
    }
    #expect(value == "saved" && !isTooOld)
  }
}

extension OwnershipTests {
  /// A runner process is stopped while it makes its liveness token — the file created under its
  /// staging name, not yet locked — and this process opens the store, whose open sweeps the owners'
  /// directory and takes that unlocked file for a killed process's leftover. Let go, the runner
  /// must still claim and run its task (before, its token's rename failed and its pass threw).
  @Test func anOpenThatSweepsAnotherProcesssTokenBeingMadeLeavesThatProcessRunning() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    try await TaskQueue.open(at: fixture.path).close()
    let goOn = fixture.path + ".go-on"
    defer { try? FileManager.default.removeItem(atPath: goOn) }
    let runner = try Child(
      "ferry-test-worker", ["run-and-hang", fixture.path],
      environment: [
        "FERRY_CRASH_POINT": "owner.tokenStaged", "FERRY_CRASH_SIGNAL": "STOP",
        "FERRY_CRASH_GO_ON_FILE": goOn,
      ])
    defer { runner.kill() }
    try await pollUntil { isStopped(runner.pid) || !runner.process.isRunning }
    try #require(isStopped(runner.pid), "the runner did not reach its token: \(runner.output)")
    let owners = fixture.path + "/owners"
    let staged = {
      (try? FileManager.default.contentsOfDirectory(atPath: owners))?.filter { $0.hasSuffix(".new") } ?? []
    }
    try #require(staged().count == 1)

    let store = try await FerryStore.open(at: fixture.path)  // sweeps the owners' directory
    defer { store.close() }
    #expect(staged().isEmpty, "the open's sweep left the unlocked staging file")
    #expect(FileManager.default.createFile(atPath: goOn, contents: nil))
    kill(runner.pid, SIGCONT)
    let said = try await runner.waitForLine(startingWith: "")
    #expect(said.hasPrefix("running "), "\(said)")
    // Its run stands: the task is running, owned by a live process, and this process leaves it alone.
    #expect(try await store.queue.interruptRunsOfDeadOwners().isEmpty)
  }
}
