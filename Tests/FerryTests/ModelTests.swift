import FerryLog
import FerryTesting
import Foundation
import PropertyBased
import Synchronization
import Testing

@_spi(Engine) @_spi(Experimental) @testable import Ferry

/// An obviously-correct, in-memory model of the queue and cache ledger: plain values and the rules
/// of `Specs/task-events.md` and `Specs/cache-events.md`, written out the simplest way.
struct Model {
  struct Task: Equatable {
    var id: UInt64
    var tag: String
    var group: String?
    var dataId: String?
    var manual: Bool
    var status: TaskStatus = .ready
    var attempts: UInt32 = 0
    /// The step that added the task or last updated its payload (what its payload says).
    var payload: Int = 0
    var priority: Int8 = 0
    /// No run starts after this time (Unix ms).
    var deadline: Int64?
  }
  struct Cache: Equatable {
    var lastSuccess: Int64?
    var lastAttempt: Int64?
    var lastFailureAt: Int64?
    var count: UInt64 = 0
  }

  var nextSequence: UInt64 = 1
  var tasks: [Task] = []  // in id order
  var errors: [UInt64: (errorId: UInt64, message: String)] = [:]
  var paused = false
  var caches: [String: Cache] = [:]
  var now: Int64

  static let maxAttempts: UInt32 = 3

  /// What a handler answers for a task's attempt with its payload: the same function drives the
  /// real handlers, so a run handed a stale payload answers differently from the model.
  static func outcome(id: UInt64, attempt: UInt32, salt: Int, payload: Int) -> Int {
    Int(
      (id &* 7 &+ UInt64(attempt) &* 3 &+ UInt64(truncatingIfNeeded: salt) &+ UInt64(
        truncatingIfNeeded: payload) &* 2) % 5)
  }

  mutating func log() -> UInt64 {
    defer { nextSequence += 1 }
    return nextSequence
  }

  func head(of group: String) -> UInt64? { tasks.first { $0.group == group }?.id }

  /// Adds a task; with `keep` and a queued twin that is not dead nothing is logged and the twin's
  /// id comes back (a dead twin keeps nothing out).
  @discardableResult
  mutating func add(
    tag: String, group: String?, dataId: String?, manual: Bool, unique: UniquePolicy, payload: Int,
    priority: Int8 = 0, deadline: Int64? = nil
  ) -> UInt64 {
    var replaced: Set<UInt64> = []
    if let dataId, unique != .append {
      let same = tasks.filter { $0.tag == tag && $0.dataId == dataId }.map(\.id)
      if unique == .keep, let kept = tasks.first(where: { same.contains($0.id) && $0.status != .dead }) {
        return kept.id
      }
      if unique == .replace { replaced = Set(same) }
    }
    let id = log()
    remove(replaced)
    tasks.append(
      Task(
        id: id, tag: tag, group: group, dataId: dataId, manual: manual, payload: payload, priority: priority,
        deadline: deadline))
    return id
  }

  /// Cancels every task of the selection (nothing runs between the model's commands): one event each.
  mutating func cancel(where selected: (Task) -> Bool) -> [UInt64] {
    let ids = tasks.filter(selected).map(\.id)
    for _ in ids { _ = log() }
    remove(Set(ids))
    return ids
  }

  /// The tasks as the queue shows them (`Specs/task-events.md` §3.3): a ready task behind its
  /// group's head, whatever the head's state, is waiting for its group.
  var shown: [Task] {
    tasks.map { task in
      guard task.status == .ready, let group = task.group, let head = head(of: group), head != task.id
      else { return task }
      var shown = task
      shown.status = .waitingForGroup(behind: TaskID(rawValue: head))
      return shown
    }
  }

  mutating func remove(_ ids: Set<UInt64>) {
    tasks.removeAll { ids.contains($0.id) }
    for id in ids { errors[id] = nil }
  }

  /// Whether a task is in the runner's indexes (ready or waiting): not manual, heading its group.
  func indexed(_ task: Task) -> Bool { !task.manual && (task.group.map { head(of: $0) == task.id } ?? true) }

  /// One pass, as `Specs/task-events.md` §4 claims tasks: first every task whose deadline has
  /// passed expires (in (deadline, id) order, one event each; the clock does not move during a
  /// model pass, so no claim meets one later); then the successor of a group whose task just
  /// succeeded when its priority's cursor passed it, then — the highest priority first — that
  /// priority's due retries in (time, id) order after its retry cursor, then its ready tasks in id
  /// order after its ready cursor; each task at most once.
  mutating func pass(salt: Int) {
    let due = tasks.compactMap { task in task.deadline.map { (at: $0, id: task.id) } }
      .filter { $0.at <= now }.sorted { ($0.at, $0.id) < ($1.at, $1.id) }
    for _ in due { _ = log() }
    remove(Set(due.map(\.id)))
    var touched = Set<UInt64>()
    var failedGroups = Set<String>()
    var readyCursors: [Int8: UInt64] = [:]
    var retryCursors: [Int8: (at: Int64, id: UInt64)] = [:]
    var successorOf: String?
    func mayStart(_ task: Task, now: Int64) -> Bool {
      switch task.status {
      case .ready: return true
      case .waiting(let until): return until <= at(now)
      default: return false
      }
    }
    while true {
      var pick: UInt64?
      if let group = successorOf, let head = head(of: group),
        let task = tasks.first(where: { $0.id == head }), head <= readyCursors[task.priority] ?? 0,
        mayStart(task, now: now), indexed(task),
        !touched.contains(head), !failedGroups.contains(group)
      {
        pick = head
      }
      successorOf = nil
      for priority in Set(tasks.map(\.priority)).sorted(by: >) where pick == nil {
        let due = tasks.compactMap { task -> (at: Int64, id: UInt64)? in
          guard task.priority == priority, indexed(task), case .waiting(let until) = task.status,
            until <= at(now)
          else { return nil }
          return (until.unixMilliseconds, task.id)
        }.sorted { ($0.at, $0.id) < ($1.at, $1.id) }
        for key in due {
          if let cursor = retryCursors[priority], (key.at, key.id) <= (cursor.at, cursor.id) { continue }
          retryCursors[priority] = key
          guard let task = tasks.first(where: { $0.id == key.id }) else { continue }
          if touched.contains(task.id) || (task.group.map { failedGroups.contains($0) } ?? false) { continue }
          pick = task.id
          break
        }
        if pick != nil { break }
        for task in tasks
        where task.priority == priority && indexed(task) && task.status == .ready
          && task.id > readyCursors[priority] ?? 0
        {
          readyCursors[priority] = task.id
          if touched.contains(task.id) || (task.group.map { failedGroups.contains($0) } ?? false) { continue }
          pick = task.id
          break
        }
      }
      guard let id = pick, let index = tasks.firstIndex(where: { $0.id == id }) else { return }
      touched.insert(id)
      let task = tasks[index]
      let attempt = task.attempts + 1
      _ = log()  // runStarted
      tasks[index].attempts = attempt
      switch Self.outcome(id: task.id, attempt: attempt, salt: salt, payload: task.payload) {
      case 0, 1:
        _ = log()
        tasks.remove(at: index)
        successorOf = task.group
      case 2:
        _ = log()
        tasks[index].status =
          attempt < Self.maxAttempts ? .waiting(until: at(now + 1000 * (1 << Int64(attempt - 1)))) : .dead
        if let group = task.group { failedGroups.insert(group) }
      case 3:
        let errorId = log()
        tasks[index].status = .blockedByError
        errors[task.id] = (errorId, "fix \(task.id)")
        if let group = task.group { failedGroups.insert(group) }
      default:
        _ = log()
        tasks[index].status = .dead
        if let group = task.group { failedGroups.insert(group) }
      }
    }
  }
}

/// One generated command, decoded from an integer so that sequences shrink to short, small ones.
enum Command: CustomStringConvertible {
  /// `deadline`: milliseconds from now (0: due at once).
  case add(tag: Int, group: Int?, dataId: Int, manual: Bool, unique: Int, priority: Int8, deadline: Int64?)
  case pass(salt: Int)
  /// Two runners of the store run a pass each at the same time.
  case twoRunners(salt: Int)
  case resolve(Int)
  case cancel(Int)
  case revive(Int)
  /// A queued task's payload becomes this step's.
  case updatePayload(Int)
  case cancelTag(Int)
  case cancelGroup(Int)
  case clear
  case pause(Bool)
  case advance(Int64)
  case fetch(key: Int, success: Bool)
  case reopen

  init(_ n: Int) {
    let p = n / 19
    switch n % 19 {
    case 0, 1, 2, 3, 4:
      self = .add(
        tag: p % 3, group: p % 4 == 3 ? nil : p % 3, dataId: p % 2, manual: p % 11 == 5, unique: (p / 3) % 3,
        priority: Int8((p / 9) % 3) - 1, deadline: p % 5 == 2 ? Int64(1000 * (p % 7)) : nil)
    case 5, 6, 7: self = .pass(salt: p)
    case 8: self = .resolve(p)
    case 9: self = .cancel(p)
    case 10: self = .revive(p)
    case 11: self = p % 4 == 0 ? .clear : .advance(Int64(500 + p * 250))
    case 12: self = p % 3 == 2 ? .twoRunners(salt: p) : .pause(p % 2 == 0)
    case 13: self = .advance(Int64(1000 + p * 500))
    case 14: self = .fetch(key: p % 3, success: p % 4 != 0)
    case 15: self = .updatePayload(p)
    case 16: self = .cancelTag(p % 3)
    case 17: self = .cancelGroup(p % 3)
    default: self = .reopen
    }
  }

  var description: String {
    switch self {
    case .add(let tag, let group, let dataId, let manual, let unique, let priority, let deadline):
      return
        "add(t\(tag), g\(group.map(String.init) ?? "-"), d\(dataId), \(manual ? "manual" : "auto"), u\(unique), "
        + "p\(priority)\(deadline.map { ", deadline +\($0)" } ?? ""))"
    case .pass(let salt): return "pass(\(salt))"
    case .twoRunners(let salt): return "twoRunners(\(salt))"
    case .resolve(let k): return "resolve(\(k))"
    case .cancel(let k): return "cancel(\(k))"
    case .revive(let k): return "revive(\(k))"
    case .updatePayload(let k): return "updatePayload(\(k))"
    case .cancelTag(let t): return "cancelTag(t\(t))"
    case .cancelGroup(let g): return "cancelGroup(g\(g))"
    case .clear: return "clear"
    case .pause(let on): return on ? "pause" : "resume"
    case .advance(let ms): return "advance(\(ms))"
    case .fetch(let key, let success): return "fetch(k\(key), \(success ? "ok" : "fail"))"
    case .reopen: return "reopen"
    }
  }
}

@Suite(.timeLimit(.minutes(20))) struct ModelTests {
  /// Random command sequences, applied to a real store and to the model: after every step the
  /// store's projections equal the model, and at the end a rebuild from the log equals them.
  ///
  /// With `writeAheadSegment` the store starts with the segment on (`Specs/one-sync-commit.md`),
  /// and every reopen turns it off or on again — both conversions, under every command sequence.
  /// Serialized: the handlers read the step's salt from one global (`currentSalt`).
  @Test(.serialized, arguments: [false, true]) func theStoreBehavesLikeTheModel(writeAheadSegment: Bool) async
  {
    await propertyCheck(count: writeAheadSegment ? 60 : 100, input: Gen.int(in: 0...1899).array(of: 1...60)) {
      numbers in
      let commands = numbers.map(Command.init)
      let fixture = QueueFixture()
      defer { fixture.remove() }
      let clock = ManualClock()
      var configuration = FerryStore.Configuration()
      configuration.writeAheadSegment = writeAheadSegment
      clock.install(in: &configuration)
      var model = Model(now: clock.milliseconds)
      do {
        var store = try await FerryStore.open(at: fixture.path, configuration: configuration)
        var runners = [makeRunner(store), makeRunner(store)]
        for (step, command) in commands.enumerated() {
          switch command {
          case .add(let tag, let group, let dataId, let manual, let unique, let priority, let deadline):
            let policy = UniquePolicy(rawValue: UInt8(unique)) ?? .append
            let data: String? = policy == .append ? nil : "d\(dataId)"
            let at = deadline.map { model.now + $0 }
            try await store.queue.add(
              tag: "t\(tag)", payload: ["step": step], dataId: data, groupId: group.map { "g\($0)" },
              options: TaskOptions(
                manual: manual, unique: policy, priority: TaskPriority(rawValue: priority),
                deadline: at.map { Date(timeIntervalSince1970: Double($0) / 1000) }))
            model.add(
              tag: "t\(tag)", group: group.map { "g\($0)" }, dataId: data, manual: manual, unique: policy,
              payload: step, priority: priority, deadline: at)
          case .pass(let salt):
            currentSalt.withLock { $0 = salt }
            _ = try await runners[salt % 2].run()  // either runner: passes behave the same
            model.pass(salt: salt)
          case .twoRunners(let salt):
            // Which runner takes which task is a race: the log must show every task claimed once
            // per run and finished by its claimant; the model then takes the store's state.
            currentSalt.withLock { $0 = salt }
            let before = try store.log.head()
            let (runnerA, runnerB) = (runners[0], runners[1])
            async let first = runnerA.run()
            async let second = runnerB.run()
            let reports = try await [first, second]
            try expectEachRunOnce(store.log, after: before, reports: reports, commands)
            try model.adopt(store)
          case .resolve(let k):
            let blocked = model.tasks.filter { $0.status == .blockedByError }
            if !blocked.isEmpty {
              let id = blocked[k % blocked.count].id
              try await store.queue.resolveError(TaskID(rawValue: id))
              _ = model.log()
              if let i = model.tasks.firstIndex(where: { $0.id == id }) { model.tasks[i].status = .ready }
              model.errors[id] = nil
            }
          case .cancel(let k):
            if !model.tasks.isEmpty {
              let id = model.tasks[k % model.tasks.count].id
              try await store.queue.cancel(TaskID(rawValue: id))
              _ = model.log()
              model.remove([id])
            }
          case .updatePayload(let k):
            if !model.tasks.isEmpty {
              let index = k % model.tasks.count
              try await store.queue.updatePayload(TaskID(rawValue: model.tasks[index].id), to: ["step": step])
              _ = model.log()
              model.tasks[index].payload = step
            }
          case .cancelTag(let tag):
            let report = try await store.queue.cancel(tag: "t\(tag)")
            let expected = model.cancel { $0.tag == "t\(tag)" }
            #expect(
              report == CancelReport(cancelled: expected.map(TaskID.init(rawValue:)), running: []),
              "cancel by tag in \(commands)")
          case .cancelGroup(let group):
            let report = try await store.queue.cancel(group: "g\(group)")
            let expected = model.cancel { $0.group == "g\(group)" }
            #expect(
              report == CancelReport(cancelled: expected.map(TaskID.init(rawValue:)), running: []),
              "cancel by group in \(commands)")
          case .revive(let k):
            let dead = model.tasks.filter { $0.status == .dead }
            if !dead.isEmpty {
              let id = dead[k % dead.count].id
              try await store.queue.revive(TaskID(rawValue: id))
              _ = model.log()
              if let i = model.tasks.firstIndex(where: { $0.id == id }) { model.tasks[i].status = .ready }
            }
          case .clear:
            try await store.queue.clear()
            _ = model.log()
            model.remove(Set(model.tasks.map(\.id)))
          case .pause(let on):
            if on { try await store.queue.pause() } else { try await store.queue.resume() }
            if model.paused != on { _ = model.log() }  // no change, nothing logged
            model.paused = on
          case .advance(let ms):
            clock.advance(by: .milliseconds(ms))
            model.now += ms
          case .fetch(let key, let success):
            try await store.ledger.recordFetch(
              key: "k\(key)", outcome: success ? .success(isEmpty: false) : .failure("503"))
            _ = model.log()
            var cache = model.caches["k\(key)"] ?? Model.Cache()
            cache.count += 1
            cache.lastAttempt = model.now
            if success { cache.lastSuccess = model.now } else { cache.lastFailureAt = model.now }
            model.caches["k\(key)"] = cache
          case .reopen:
            store.close()
            if writeAheadSegment { configuration.writeAheadSegment.toggle() }
            store = try await FerryStore.open(at: fixture.path, configuration: configuration)
            runners = [makeRunner(store), makeRunner(store)]
          }
          try expectSame(store, model, after: step, commands)
        }
        let report = try store.log.verify()
        #expect(report.isHealthy, "rebuild differs after \(commands): \(report.problems)")
        store.close()
      } catch {
        Issue.record("\(error) while running \(commands)")
      }
    }
  }
}

let currentSalt = Mutex(0)

extension Model {
  /// Takes the store's queue as the model's (after a step whose interleaving is a race).
  mutating func adopt(_ store: FerryStore) throws {
    let snapshot = try store.log.read { try FerryStore.snapshot(of: $0) }
    let payloads = Dictionary(uniqueKeysWithValues: tasks.map { ($0.id, $0.payload) })
    tasks = snapshot.tasks.map {
      var status = $0.status
      if case .waitingForGroup = status { status = .ready }  // derived when read; stored as ready
      return Model.Task(
        id: $0.id.rawValue, tag: $0.tag, group: $0.groupId, dataId: $0.dataId, manual: $0.manual,
        status: status,
        attempts: $0.attempts, payload: payloads[$0.id.rawValue] ?? -1, priority: $0.priority.rawValue,
        deadline: milliseconds($0.deadline))
    }
    errors = Dictionary(
      uniqueKeysWithValues: snapshot.errors.map { ($0.taskId.rawValue, ($0.errorId, $0.message)) })
    nextSequence = snapshot.head + 1
  }
}

/// A deadline as the log holds it.
func milliseconds(_ date: Date?) -> Int64? { date.map { Int64(($0.timeIntervalSince1970 * 1000).rounded()) } }

/// From the log after `before`: no task is claimed while a run of it is under way, every run ends
/// exactly once, by one outcome, both reports together name each run once, and a task expires at
/// most once, never during a run of it.
func expectEachRunOnce(
  _ log: EventLog, after before: UInt64, reports: [PassReport], _ commands: [Command]
) throws {
  var open: [TaskID: String] = [:]
  var runs: [TaskID: Int] = [:]
  var expired: Set<TaskID> = []
  try log.forEachEvent(from: before + 1) { event in
    guard TaskEvent.typeSet.contains(event.type) else { return }
    switch try TaskEvent(event) {
    case .runStarted(let id, _, let owner, let runner, _):
      #expect(open[id] == nil, "task \(id) claimed twice at once in \(commands)")
      open[id] = "\(owner)/\(runner)"
      runs[id, default: 0] += 1
    case .runSucceeded(let id, _), .runFailed(let id, _, _, _), .runInterrupted(let id),
      .errorRecorded(let id, _, true):
      #expect(open[id] != nil, "task \(id) finished without a run in \(commands)")
      open[id] = nil
    case .expired(let id):
      #expect(open[id] == nil, "task \(id) expired during its run in \(commands)")
      #expect(expired.insert(id).inserted, "task \(id) expired twice in \(commands)")
    default: break
    }
  }
  #expect(open.isEmpty, "runs left open: \(open) in \(commands)")
  let reported = reports.flatMap(\.entries).filter {
    if case .skipped = $0.outcome { return false }
    return $0.outcome != .expired
  }
  let reportedExpired = reports.flatMap(\.entries).filter { $0.outcome == .expired }.map(\.taskId)
  #expect(reportedExpired.sorted() == expired.sorted(), "expiries reported and logged differ in \(commands)")
  #expect(reported.count == runs.values.reduce(0, +), "reports and log disagree in \(commands)")
}

/// A runner whose handlers answer by `Model.outcome` for the salt `salt()` gives: succeeded, failed
/// (retried with backoff), recorded an error, or failed for good.
func makeRunner(
  _ store: FerryStore, salt: @escaping @Sendable () -> Int = { currentSalt.withLock { $0 } }
) -> TaskRunner {
  var configuration = TaskRunner.Configuration()
  configuration.random = { 0.5 }
  configuration.defaultRetry = RetryPolicy(
    maxAttempts: Model.maxAttempts, initialDelay: .seconds(1), multiplier: 2, jitter: 0)
  let runner = TaskRunner(queue: store.queue, configuration: configuration)
  for tag in ["t0", "t1", "t2"] {
    runner.register(tag: tag) { task in
      let payload = try task.payload(as: [String: Int].self)["step"] ?? -1
      switch Model.outcome(id: task.id.rawValue, attempt: task.attempt, salt: salt(), payload: payload) {
      case 0, 1: return .succeeded
      case 2: return .failed("flaky")
      case 3: return .recordError("fix \(task.id)")
      default: return .failed("rejected", retryable: false)
      }
    }
  }
  return runner
}

func expectSame(_ store: FerryStore, _ model: Model, after step: Int, _ commands: [Command]) throws {
  let snapshot = try store.log.read { try FerryStore.snapshot(of: $0) }
  let actual = try snapshot.tasks.map { task in
    let payload = try store.queue.payload(of: task.id, as: [String: Int].self)["step"] ?? -1
    return Model.Task(
      id: task.id.rawValue, tag: task.tag, group: task.groupId, dataId: task.dataId, manual: task.manual,
      status: task.status, attempts: task.attempts, payload: payload, priority: task.priority.rawValue,
      deadline: milliseconds(task.deadline))
  }
  #expect(actual == model.shown, "tasks differ after step \(step) of \(commands)")
  #expect(
    snapshot.errors.map { "\($0.taskId):\($0.errorId):\($0.message)" }
      == model.errors.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value.errorId):\($0.value.message)" },
    "errors differ after step \(step) of \(commands)")
  #expect(snapshot.paused == model.paused, "pause differs after step \(step) of \(commands)")
  #expect(snapshot.head == model.nextSequence - 1, "log head differs after step \(step) of \(commands)")
  let caches = Dictionary(
    uniqueKeysWithValues: snapshot.caches.map {
      (
        $0.key,
        Model.Cache(
          lastSuccess: $0.lastSuccessMs, lastAttempt: $0.lastAttemptMs, lastFailureAt: $0.lastFailureMs?.at,
          count: $0.fetchCount)
      )
    })
  #expect(caches == model.caches, "caches differ after step \(step) of \(commands)")
}
