import Ferry
import Foundation

/// What a create task carries.
struct CreatePayload: Codable, Sendable {
  var localId: String
  var title: String
  var body: String
}

/// What an edit task carries: the whole note as the user left it, and the note's edit counter.
struct EditPayload: Codable, Sendable {
  var localId: String
  var title: String
  var body: String
  var revision: Int
}

/// What a create's success leaves for the tasks after it: the id the server gave the note.
struct CreateOutput: Codable, Sendable {
  var serverId: String
}

struct CreatedBody: Decodable {
  var id: String
}

struct NoteList: Codable, Sendable {
  var notes: [ServerNote]
}

enum Tags {
  static let create = "note.create"
  static let edit = "note.edit"
  static let changes = "note-changes"
}

enum ClientError: Error, CustomStringConvertible {
  case usage(String)
  case unknownNote(String)
  case nothingToFix(String)
  case io(String)

  var description: String {
    switch self {
    case .usage(let message): message
    case .unknownNote(let id): "no note \(id) was created here"
    case .nothingToFix(let id): "no change of note \(id) waits for the user"
    case .io(let message): message
    }
  }

  var exitStatus: Int32 {
    switch self {
    case .usage: 64
    case .unknownNote: 8
    case .nothingToFix: 11
    case .io: 1
    }
  }
}

/// The notes app: a Ferry store, a runner with the two handlers, and the notes cache.
final class NotesApp: Sendable {
  let home: String
  let store: FerryStore
  let runner: TaskRunner
  let api: NotesAPI
  let connectivity: FileConnectivity

  /// Backoff for the server's 500s and a restarting server: short, so that the proof does not
  /// wait on it, and many attempts, so that no change dies of a flaky server.
  static let retry = RetryPolicy(
    maxAttempts: 10_000, initialDelay: .milliseconds(50), multiplier: 2, maxDelay: .seconds(1), jitter: 0.2)

  init(home: String, server: URL, networkDirectory: String, concurrency: Int, batch: Int = 0) async throws {
    self.home = home
    try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true)
    store = try await FerryStore.open(at: home + "/store")
    api = NotesAPI(base: server)
    connectivity = FileConnectivity(directory: networkDirectory)
    var configuration = TaskRunner.Configuration()
    configuration.maxConcurrentTasks = concurrency
    configuration.collections[Tags.changes] = [Tags.create, Tags.edit]
    configuration.connectivity = connectivity
    configuration.defaultRetry = Self.retry
    // A kill of another process mid-run is noticed this soon, so its task runs again here.
    configuration.deadOwnerCheckInterval = .milliseconds(500)
    runner = TaskRunner(queue: store.queue, configuration: configuration)
    register()
    if batch > 0 { registerBatched(size: batch) }
  }

  /// Both tags batched: each call sends its changes in one `POST /batch`, which applies them in
  /// order and stops a note's changes at the first that is not applied — as Ferry gives back the
  /// rest of a group after its first change that did not succeed.
  private func registerBatched(size: Int) {
    let api = api
    let connectivity = connectivity
    let queue = store.queue
    for tag in [Tags.create, Tags.edit] {
      runner.register(tag: tag, batchSize: size, timeLimit: .seconds(15)) { tasks in
        guard connectivity.isOnline else { return Self.all(tasks, .deferred("offline")) }
        var results: [TaskID: TaskResult] = [:]
        var items: [BatchItem] = []
        var sent: [RunningTask] = []
        var stopped = Set<String>()
        for task in tasks {
          // A change with no group holds no other back.
          let group = task.groupId
          // never sent ahead of its group's earlier change
          if let group, stopped.contains(group) { continue }
          if tag == Tags.create {
            let note = try task.payload(as: CreatePayload.self)
            items.append(
              BatchItem(
                key: task.idempotencyKey, group: group, method: "POST", path: "/notes",
                body: ChangeFields(title: note.title, body: note.body, revision: nil)))
          } else {
            let edit = try task.payload(as: EditPayload.self)
            guard let output = try queue.output(dataId: edit.localId, tag: Tags.create) else {
              results[task.id] = .failed(
                "note \(edit.localId) has no server id yet (its create has not succeeded)")
              if let group { stopped.insert(group) }
              continue
            }
            let serverId = try output.decode(as: CreateOutput.self).serverId
            items.append(
              BatchItem(
                key: task.idempotencyKey, group: group, method: "PUT", path: "/notes/\(serverId)",
                body: ChangeFields(title: edit.title, body: edit.body, revision: edit.revision)))
          }
          sent.append(task)
        }
        if items.isEmpty { return results }
        switch try await api.send("POST", "batch", body: BatchRequest(items: items), idempotencyKey: nil) {
        case .ok(let data):
          guard let answer = try? JSONDecoder().decode(BatchAnswer.self, from: data),
            answer.results.count == sent.count
          else {
            return Self.all(sent, .failed("the server's answer to a batch does not match it"), into: results)
          }
          for (task, item) in zip(sent, answer.results) {
            guard (200..<300).contains(item.status) else {
              let message = (try? JSONDecoder().decode([String: String].self, from: Data(item.body.utf8)))?[
                "error"]
              // 409: not applied because an earlier change of its note was not: try it again later.
              results[task.id] =
                item.status == 409
                ? .failed(message ?? "not applied")
                : Self.result(status: item.status, message: message ?? item.body)
              continue
            }
            if tag == Tags.create {
              guard let created = try? JSONDecoder().decode(CreatedBody.self, from: Data(item.body.utf8))
              else {
                results[task.id] = .failed("a batch's create answer has no id: \(item.body.prefix(200))")
                continue
              }
              results[task.id] = .succeeded(
                output: try TaskOutput(CreateOutput(serverId: created.id)), invalidating: ["notes"])
            } else {
              results[task.id] = .succeeded(invalidating: ["notes"])
            }
          }
          return results
        case .status(let status, let message):
          return Self.all(sent, Self.result(status: status, message: message), into: results)
        case .unreachable(let message):
          return Self.all(
            sent, connectivity.isOnline ? .failed("server unreachable: \(message)") : .deferred("offline"),
            into: results)
        }
      }
    }
  }

  /// `results` with `outcome` for every task of `tasks`.
  static func all(
    _ tasks: [RunningTask], _ outcome: TaskResult, into results: [TaskID: TaskResult] = [:]
  ) -> [TaskID: TaskResult] {
    var results = results
    for task in tasks { results[task.id] = outcome }
    return results
  }

  private func register() {
    let api = api
    let connectivity = connectivity
    let queue = store.queue
    runner.register(tag: Tags.create, timeLimit: .seconds(15)) { task in
      guard connectivity.isOnline else { return .deferred("offline") }
      let note = try task.payload(as: CreatePayload.self)
      let answer = try await api.send(
        "POST", "notes", body: CreateBody(title: note.title, body: note.body),
        idempotencyKey: task.idempotencyKey)
      switch answer {
      case .ok(let data):
        guard let created = try? JSONDecoder().decode(CreatedBody.self, from: data) else {
          return .failed(
            "the server's answer to a create has no id: \(String(decoding: data.prefix(200), as: UTF8.self))")
        }
        // The server's id, for the edits queued behind this create; and the notes cache is stale.
        return .succeeded(output: try TaskOutput(CreateOutput(serverId: created.id)), invalidating: ["notes"])
      case .status(let status, let message):
        return Self.result(status: status, message: message)
      case .unreachable(let message):
        return connectivity.isOnline ? .failed("server unreachable: \(message)") : .deferred("offline")
      }
    }
    runner.register(tag: Tags.edit, timeLimit: .seconds(15)) { task in
      guard connectivity.isOnline else { return .deferred("offline") }
      let edit = try task.payload(as: EditPayload.self)
      // The create ran before this edit (same group), so its output holds the server's id.
      guard let output = try queue.output(dataId: edit.localId, tag: Tags.create) else {
        return .failed("note \(edit.localId) has no server id yet (its create has not succeeded)")
      }
      let serverId = try output.decode(as: CreateOutput.self).serverId
      let answer = try await api.send(
        "PUT", "notes/\(serverId)",
        body: EditBody(title: edit.title, body: edit.body, revision: edit.revision),
        idempotencyKey: task.idempotencyKey)
      switch answer {
      case .ok: return .succeeded(invalidating: ["notes"])
      case .status(let status, let message): return Self.result(status: status, message: message)
      case .unreachable(let message):
        return connectivity.isOnline ? .failed("server unreachable: \(message)") : .deferred("offline")
      }
    }
  }

  /// What the server's refusals mean for a task: 400 is the user's to fix, other 4xx will never
  /// succeed as sent, 5xx may succeed later.
  static func result(status: Int, message: String) -> TaskResult {
    switch status {
    case 400: .recordError("the server refused this change: \(message)")
    case 401..<500: .failed("HTTP \(status): \(message)", retryable: false)
    default: .failed("HTTP \(status): \(message)")
    }
  }

  // MARK: Commands

  /// Queues the creation of a note; `localId` is the app's own id for it.
  func create(localId: String, title: String, body: String) async throws -> (TaskID, Int) {
    try await withRevisionLock { revisions in
      if revisions[localId] != nil { throw ClientError.usage("note \(localId) already exists") }
      revisions[localId] = 0
      try saveRevisions(revisions)
      let id = try await store.queue.add(
        tag: Tags.create, payload: CreatePayload(localId: localId, title: title, body: body), dataId: localId,
        groupId: localId)
      return (id, 0)
    }
  }

  /// Queues an edit of a note: its next revision, after every change queued before it.
  func edit(localId: String, title: String, body: String) async throws -> (TaskID, Int) {
    try await withRevisionLock { revisions in
      guard let last = revisions[localId] else { throw ClientError.unknownNote(localId) }
      let revision = last + 1
      revisions[localId] = revision
      // Saved before the add: a crash between the two skips a revision, never reuses one.
      try saveRevisions(revisions)
      let id = try await store.queue.add(
        tag: Tags.edit, payload: EditPayload(localId: localId, title: title, body: body, revision: revision),
        dataId: localId, groupId: localId)
      return (id, revision)
    }
  }

  /// The user changes the title the server refused; the change then goes again.
  func fix(localId: String, title: String) async throws -> PendingTask {
    let blocked = try store.queue.pendingTasks(groupId: localId).filter { $0.status == .blockedByError }
    guard let task = blocked.first else { throw ClientError.nothingToFix(localId) }
    if task.tag == Tags.create {
      var payload = try store.queue.payload(of: task.id, as: CreatePayload.self)
      payload.title = title
      try await store.queue.updatePayload(task.id, to: payload)
    } else {
      var payload = try store.queue.payload(of: task.id, as: EditPayload.self)
      payload.title = title
      try await store.queue.updatePayload(task.id, to: payload)
    }
    try await store.queue.resolveError(task.id)
    return task
  }

  enum SyncEnd: String {
    /// Nothing left that can run: the queue is empty, or holds only what waits for the user.
    case done
    /// Time ran out with work left.
    case timeUp
  }

  /// Runs the queue until nothing is left that can run by itself, or `seconds` have passed.
  func sync(seconds: Double) async throws -> SyncEnd {
    let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
    runner.startAutomaticRunning()
    defer { runner.stop() }
    while true {
      // What waits for the user (an error to fix, a dead task) holds its whole group back.
      let pending = try store.queue.pendingTasks()
      let stuck = pending.filter { $0.status == .blockedByError || $0.status == .dead }
      let stuckGroups = Set(stuck.compactMap(\.groupId))
      let left = pending.filter { task in
        task.status != .blockedByError && task.status != .dead
          && !(task.groupId.map(stuckGroups.contains) ?? false)
      }
      if left.isEmpty { return .done }
      if ContinuousClock.now >= deadline { return .timeUp }
      try await Task.sleep(for: .milliseconds(25))
    }
  }

  /// Refreshes the notes cache (after pushing what is queued, through the gate) and returns it.
  func read() async throws -> (RefreshOutcome, [ServerNote]) {
    let api = api
    let path = home + "/notes.json"
    let source = CacheSource<NoteList>(
      fetch: {
        switch try await api.get("notes") {
        case .ok(let data): return try JSONDecoder().decode(NoteList.self, from: data)
        case .status(let status, let message): throw ClientError.io("GET /notes: HTTP \(status): \(message)")
        case .unreachable(let message): throw ClientError.io("GET /notes: \(message)")
        }
      },
      save: { list in
        try JSONEncoder().encode(list).write(to: URL(fileURLWithPath: path), options: .atomic)
      },
      load: {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        return try JSONDecoder().decode(NoteList.self, from: data)
      })
    // A max age of an hour: within this proof only a push makes the cache stale, through the
    // keys its tasks invalidate.
    let repository = try CacheRepository(
      key: "notes", ledger: store.ledger, maxAge: .seconds(3600), source: source,
      automaticRefresh: false, requires: try PendingTasksGate(runner: runner, collection: Tags.changes))
    let result = await repository.refresh()
    let notes = try await source.load()?.notes ?? []
    return (result, notes)
  }

  struct Status: Encodable {
    var pending = 0
    var ready = 0
    var running = 0
    var waiting = 0
    var blocked = 0
    var dead = 0
    var behindGroupHead = 0
    /// Runs started by the tasks still queued.
    var runsStarted: UInt32 = 0
    /// Of those, the runs that count toward the retry policy (not deferred, not interrupted).
    var attemptsSpent: UInt32 = 0
    var online = true
  }

  func status() throws -> Status {
    var status = Status()
    status.online = connectivity.isOnline
    for task in try store.queue.pendingTasks() {
      status.pending += 1
      status.runsStarted += task.attempts
      status.attemptsSpent += task.attemptsSpent
      switch task.status {
      case .ready: status.ready += 1
      case .running: status.running += 1
      case .waiting, .scheduled: status.waiting += 1
      case .blockedByError: status.blocked += 1
      case .dead: status.dead += 1
      case .waitingForGroup: status.behindGroupHead += 1
      }
    }
    return status
  }

  // MARK: The per-note edit counter

  /// Runs `body` with the edit counters, holding a lock on them across processes: two processes
  /// editing one note get distinct revisions, and each adds its task before the other takes the
  /// next revision, so the group's order is the revisions' order.
  private func withRevisionLock<T>(_ body: (inout [String: Int]) async throws -> T) async throws -> T {
    let lockPath = home + "/revisions.lock"
    let fd = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
    guard fd >= 0 else { throw ClientError.io("cannot open \(lockPath): errno \(errno)") }
    defer { close(fd) }
    while flock(fd, LOCK_EX) != 0 {
      guard errno == EINTR else { throw ClientError.io("cannot lock \(lockPath): errno \(errno)") }
    }
    let path = home + "/revisions.json"
    var revisions: [String: Int] = [:]
    if let data = FileManager.default.contents(atPath: path) {
      do {
        revisions = try JSONDecoder().decode([String: Int].self, from: data)
      } catch {
        throw ClientError.io("\(path) does not decode: \(error)")
      }
    }
    return try await body(&revisions)
  }

  private func saveRevisions(_ revisions: [String: Int]) throws {
    try JSONEncoder().encode(revisions).write(
      to: URL(fileURLWithPath: home + "/revisions.json"), options: .atomic)
  }
}

struct CreateBody: Encodable {
  var title: String
  var body: String
}

/// One change of a `POST /batch`.
struct BatchItem: Encodable {
  var key: String
  var group: String?
  var method: String
  var path: String
  var body: ChangeFields
}

struct ChangeFields: Encodable {
  var title: String
  var body: String
  var revision: Int?
}

struct BatchRequest: Encodable {
  var items: [BatchItem]
}

/// The server's answer to each change of a batch, in order.
struct BatchAnswer: Decodable {
  struct Item: Decodable {
    var status: Int
    var body: String
  }
  var results: [Item]
}

struct EditBody: Encodable {
  var title: String
  var body: String
  var revision: Int
}
