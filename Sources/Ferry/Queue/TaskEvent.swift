import FerryLog
import Foundation

/// The events of the task queue, as `Specs/task-events.md` specifies them (schema version 1, 2 for
/// `task.errorRecorded` and `task.runSucceeded`, and 3 for `task.added` and `task.runStarted`).
package enum TaskEvent: Equatable, Sendable {
  /// `priority`: larger runs first (0 normal); `deadline`: Unix ms after which no run starts;
  /// `schedule`: when its first run may start, and the interval it repeats at.
  case added(
    tag: String, payload: [UInt8], dataId: String?, groupId: String?, manual: Bool, unique: UniquePolicy,
    priority: Int8 = 0, deadline: Int64? = nil, schedule: AddSchedule = .none)
  /// A claim: run number `attempt` of the task belongs to runner `runner` of owner `owner` (a
  /// process's liveness token, ``RunOwner``; empty in events logged before owners existed).
  /// `batch`: the first task of the batch it was claimed in, for a batched handler's run (version 3).
  case runStarted(TaskID, attempt: UInt32, owner: String, runner: UInt32, batch: TaskID? = nil)
  /// A success; version 2 carries what the handler returned with it (``TaskResult/succeeded(output:invalidating:)``).
  case runSucceeded(TaskID, details: SuccessDetails = .none)
  /// The handler said "not now" (``TaskResult/deferred(_:)``), or its retryable failure came while
  /// the device was offline: the run ends and gives its attempt back, with no backoff.
  case runDeferred(TaskID, reason: String)
  case runFailed(TaskID, message: String, retryable: Bool, nextEligibleAt: Int64?)
  case runInterrupted(TaskID)
  /// `endsRun`: recorded by the task's own run as its outcome (its claim ends), rather than by the
  /// app while the task waits or runs.
  case errorRecorded(TaskID, message: String, endsRun: Bool)
  case errorResolved(TaskID)
  case cancelled(TaskID)
  /// The task's deadline passed before a run of it started: it leaves the queue. Logged only by a
  /// command that saw the deadline passed on its clock and the task queued without a claim.
  case expired(TaskID)
  case revived(TaskID)
  /// The task's payload is now `payload` (the JSON bytes a run is handed); its id, place in its
  /// group and status stay.
  case payloadUpdated(TaskID, payload: [UInt8])
  case cleared
  case paused
  case resumed

  package static let types = [
    "task.added", "task.runStarted", "task.runSucceeded", "task.runFailed", "task.runInterrupted",
    "task.errorRecorded", "task.errorResolved", "task.cancelled", "task.revived", "task.payloadUpdated",
    "task.expired", "queue.cleared", "queue.paused", "queue.resumed", "task.runDeferred",
  ]

  /// The current schema version of each type that has more than version 1.
  static let schemaVersions: [String: UInt16] = [
    "task.added": 3, "task.runStarted": 3, "task.errorRecorded": 2, "task.runSucceeded": 2,
  ]

  /// The upcasters of the types past version 1, by the version each reads (`v` → `v + 1`).
  static let upcasters: [String: [UInt16: @Sendable ([UInt8]) throws -> [UInt8]]] = [
    "task.added": [
      // v1 had no priority or deadline: priority 0 (normal), no deadline (an absent optional).
      1: { v1 in extended(v1, zeros: 2) },
      // v2 had no schedule: no start time and no interval (two absent optionals).
      2: { v2 in extended(v2, zeros: 2) },
    ],
    // v1 had no owner: an empty owner (never alive) and runner 0.
    "task.runStarted": [
      1: { v1 in extended(v1, zeros: 8) },
      // v2 had no batch: a run on its own (an absent optional).
      2: { v2 in extended(v2, zeros: 1) },
    ],
    // v1 was only ever logged as a run's outcome by the runner (the old projection took the task
    // out of `running`), so it ends the run.
    "task.errorRecorded": [1: { v1 in extended(v1, zeros: 0, then: 1) }],
    // v1 had no output and no cache keys: an absent output and an empty list.
    "task.runSucceeded": [1: { v1 in extended(v1, zeros: 5) }],
  ]

  /// `bytes` followed by `zeros` zero bytes and then `last` when given, in one allocation (an
  /// upcaster runs for every old event a rebuild reads).
  private static func extended(_ bytes: [UInt8], zeros: Int, then last: UInt8? = nil) -> [UInt8] {
    var result = [UInt8]()
    result.reserveCapacity(bytes.count + zeros + 1)
    result.append(contentsOf: bytes)
    for _ in 0..<zeros { result.append(0) }
    if let last { result.append(last) }
    return result
  }

  /// The same types, for membership tests (the store's log also holds the cache ledger's events).
  package static let typeSet = Set(types)

  var type: String {
    switch self {
    case .added: return "task.added"
    case .runStarted: return "task.runStarted"
    case .runSucceeded: return "task.runSucceeded"
    case .runDeferred: return "task.runDeferred"
    case .runFailed: return "task.runFailed"
    case .runInterrupted: return "task.runInterrupted"
    case .errorRecorded: return "task.errorRecorded"
    case .errorResolved: return "task.errorResolved"
    case .cancelled: return "task.cancelled"
    case .expired: return "task.expired"
    case .revived: return "task.revived"
    case .payloadUpdated: return "task.payloadUpdated"
    case .cleared: return "queue.cleared"
    case .paused: return "queue.paused"
    case .resumed: return "queue.resumed"
    }
  }

  /// The event's payload, written once at its exact size.
  var payload: [UInt8] {
    let size: Int
    switch self {
    case .added(let tag, let payload, let dataId, let groupId, _, _, _, let deadline, let schedule):
      size =
        FieldWriter.size(tag) + 4 + payload.count + FieldWriter.size(dataId) + FieldWriter.size(groupId) + 3
        + FieldWriter.size(deadline) + FieldWriter.size(schedule.startAt)
        + FieldWriter.size(schedule.interval)
    case .runStarted(_, _, let owner, _, let batch):
      size = 16 + FieldWriter.size(owner) + FieldWriter.size(batch)
    case .runFailed(_, let message, _, let next):
      size = 9 + FieldWriter.size(message) + FieldWriter.size(next)
    case .errorRecorded(_, let message, _): size = 9 + FieldWriter.size(message)
    case .payloadUpdated(_, let payload): size = 12 + payload.count
    case .runSucceeded(_, let details):
      size =
        8 + 1 + (details.output.map { 4 + $0.count } ?? 0) + 4
        + details.invalidates.reduce(0) { $0 + FieldWriter.size($1) }
    case .runDeferred(_, let reason): size = 8 + FieldWriter.size(reason)
    case .runInterrupted, .errorResolved, .cancelled, .revived, .expired: size = 8
    case .cleared, .paused, .resumed: size = 0
    }
    if let exact = FieldWriter.encode(size: size, { write(to: &$0) }) { return exact }
    var writer = PayloadWriter(capacity: size)
    write(to: &writer)
    return writer.bytes
  }

  /// The payload's fields in their stored order (`Specs/task-events.md` §2).
  func write(to writer: inout some FieldSink) {
    switch self {
    case .added(
      let tag, let payload, let dataId, let groupId, let manual, let unique, let priority, let deadline,
      let schedule):
      writer.write(tag)
      writer.write(bytes: payload)
      writer.write(dataId)
      writer.write(groupId)
      writer.write(manual)
      writer.write(unique.rawValue)
      writer.write(UInt8(bitPattern: priority))
      writer.write(deadline)
      writer.write(schedule.startAt)
      writer.write(schedule.interval)
    case .runStarted(let id, let attempt, let owner, let runner, let batch):
      writer.write(id)
      writer.write(attempt)
      writer.write(owner)
      writer.write(runner)
      writer.write(batch)
    case .runFailed(let id, let message, let retryable, let next):
      writer.write(id)
      writer.write(message)
      writer.write(retryable)
      writer.write(next)
    case .errorRecorded(let id, let message, let endsRun):
      writer.write(id)
      writer.write(message)
      writer.write(endsRun)
    case .payloadUpdated(let id, let payload):
      writer.write(id)
      writer.write(bytes: payload)
    case .runSucceeded(let id, let details):
      writer.write(id)
      writer.write(details.output != nil)
      if let output = details.output { writer.write(bytes: output) }
      writer.write(UInt32(details.invalidates.count))
      for key in details.invalidates { writer.write(key) }
    case .runDeferred(let id, let reason):
      writer.write(id)
      writer.write(reason)
    case .runInterrupted(let id), .errorResolved(let id), .cancelled(let id), .revived(let id),
      .expired(let id):
      writer.write(id)
    case .cleared, .paused, .resumed:
      break
    }
  }

  /// The schema version this code writes for the event's type.
  var schemaVersion: UInt16 { Self.schemaVersions[type] ?? 1 }

  var newEvent: NewEvent {
    var event = NewEvent(type: type, schemaVersion: schemaVersion, payload: payload)
    event.decoded = self  // the projection folds this instead of decoding the payload again
    return event
  }

  /// How the event reads in a task's history.
  var historyKind: TaskHistoryEntry.Kind {
    switch self {
    case .added: return .added
    case .runStarted(_, let attempt, _, _, _): return .runStarted(attempt: attempt)
    case .runSucceeded: return .runSucceeded
    case .runDeferred(_, let reason): return .runDeferred(reason: reason)
    case .runFailed(_, let message, _, let next):
      return .runFailed(message: message, retryAt: next.map(Date.init(unixMilliseconds:)))
    case .runInterrupted: return .runInterrupted
    case .errorRecorded(_, let message, _): return .errorRecorded(message: message)
    case .errorResolved: return .errorResolved
    case .cancelled: return .cancelled
    case .expired: return .expired
    case .revived: return .revived
    case .payloadUpdated: return .payloadUpdated
    case .cleared, .paused, .resumed: return .cleared
    }
  }

  /// The payload an add or a payload update carries (nil for the other events).
  var carriedPayload: [UInt8]? {
    switch self {
    case .added(_, let payload, _, _, _, _, _, _, _), .payloadUpdated(_, let payload): return payload
    default: return nil
    }
  }

  /// What observers are told when the event at `sequence` is logged.
  func updates(sequence: UInt64) -> [TaskUpdate] {
    switch self {
    case .added: return [.added(TaskID(rawValue: sequence))]
    case .runStarted(let id, let attempt, _, _, _): return [.running(id, attempt: attempt)]
    case .runSucceeded(let id, _): return [.succeeded(id)]
    case .runDeferred(let id, let reason): return [.deferred(id, reason: reason)]
    case .runFailed(let id, let message, _, let next):
      return [.failed(id, message: message, retryAt: next.map(Date.init(unixMilliseconds:)))]
    case .runInterrupted(let id): return [.interrupted(id)]
    case .errorRecorded(let id, let message, _): return [.errorRecorded(id, message: message)]
    case .errorResolved(let id): return [.errorResolved(id)]
    case .cancelled(let id): return [.cancelled(id)]
    case .expired(let id): return [.expired(id)]
    case .revived(let id): return [.revived(id)]
    case .payloadUpdated(let id, _): return [.payloadUpdated(id)]
    case .cleared: return [.cleared]
    case .paused: return [.paused]
    case .resumed: return [.resumed]
    }
  }

  /// Decodes a logged event of one of the queue's types.
  package init(_ event: LoggedEvent) throws(FerryError) {
    guard let decoded = try Self.decode(event, keepingPayload: true) else {
      throw .malformedEvent(
        sequence: event.sequence, type: event.type, reason: "not an event of the task queue")
    }
    self = decoded
  }

  /// What the projection folds: the event decoded when it is one of the queue's types, else nil
  /// (one pass over the type names, no set lookup first). The payload a `task.added` carries is
  /// skipped, not copied (the fold never reads it): its `payload` is empty.
  static func forFold(_ event: LoggedEvent) throws(FerryError) -> TaskEvent? {
    try decode(event, keepingPayload: false)
  }

  /// ``forFold(_:)`` of a record's payload where it lies.
  static func forFold(
    _ header: RecordHeader, payload: UnsafeRawBufferPointer
  ) throws(FerryError) -> TaskEvent? {
    try decode(type: header.type, sequence: header.sequence, payload: payload, keepingPayload: false)
  }

  private static func decode(_ event: LoggedEvent, keepingPayload: Bool) throws(FerryError) -> TaskEvent? {
    try withRawBytes(event.payload) { payload throws(FerryError) in
      try decode(type: event.type, sequence: event.sequence, payload: payload, keepingPayload: keepingPayload)
    }
  }

  private static func decode(
    type: String, sequence: UInt64, payload: UnsafeRawBufferPointer, keepingPayload: Bool
  ) throws(FerryError) -> TaskEvent? {
    var reader = RawPayloadReader(payload)
    let decoded: TaskEvent
    do {
      switch type {
      case "task.added":
        let tag = try reader.readString("tag")
        let payload = keepingPayload ? try reader.readBytes("payload") : try reader.skipBytes("payload")
        let dataId = try reader.readOptionalString("dataId")
        let groupId = try reader.readOptionalString("groupId")
        let manual = try reader.readBool("manual")
        let raw = try reader.read(UInt8.self, "unique")
        guard let unique = UniquePolicy(rawValue: raw) else {
          throw PayloadError("unique policy \(raw) is not known")
        }
        let priority = Int8(bitPattern: try reader.read(UInt8.self, "priority"))
        let deadline = try reader.readOptional(Int64.self, "deadline")
        let startAt = try reader.readOptional(Int64.self, "startAt")
        let interval = try reader.readOptional(Int64.self, "interval")
        if let interval, interval <= 0 { throw PayloadError("the interval \(interval) ms is not positive") }
        decoded = .added(
          tag: tag, payload: payload, dataId: dataId, groupId: groupId, manual: manual, unique: unique,
          priority: priority, deadline: deadline, schedule: AddSchedule(startAt: startAt, interval: interval))
      case "task.runStarted":
        decoded = .runStarted(
          TaskID(rawValue: try reader.read(UInt64.self, "taskId")),
          attempt: try reader.read(UInt32.self, "attempt"),
          owner: try reader.readString("owner"), runner: try reader.read(UInt32.self, "runner"),
          batch: try reader.readOptional(UInt64.self, "batch").map(TaskID.init(rawValue:)))
      case "task.runSucceeded":
        let id = TaskID(rawValue: try reader.read(UInt64.self, "taskId"))
        var details = SuccessDetails.none
        if try reader.readBool("hasOutput") {
          // Kept in the fold too: the projection stores it (`outputs`).
          details.output = try reader.readBytes("output")
        }
        let count = try reader.read(UInt32.self, "invalidates")
        // Each key takes at least its 4-byte length: a count past what is left is malformed.
        guard Int(count) <= reader.remaining / 4 else { throw PayloadError("\(count) cache keys do not fit") }
        for _ in 0..<count { details.invalidates.append(try reader.readString("cacheKey")) }
        decoded = .runSucceeded(id, details: details)
      case "task.runDeferred":
        decoded = .runDeferred(
          TaskID(rawValue: try reader.read(UInt64.self, "taskId")), reason: try reader.readString("reason"))
      case "task.runFailed":
        decoded = .runFailed(
          TaskID(rawValue: try reader.read(UInt64.self, "taskId")), message: try reader.readString("message"),
          retryable: try reader.readBool("retryable"),
          nextEligibleAt: try reader.readOptional(Int64.self, "nextEligibleAt"))
      case "task.runInterrupted":
        decoded = .runInterrupted(TaskID(rawValue: try reader.read(UInt64.self, "taskId")))
      case "task.errorRecorded":
        decoded = .errorRecorded(
          TaskID(rawValue: try reader.read(UInt64.self, "taskId")), message: try reader.readString("message"),
          endsRun: try reader.readBool("endsRun"))
      case "task.errorResolved":
        decoded = .errorResolved(TaskID(rawValue: try reader.read(UInt64.self, "taskId")))
      case "task.cancelled": decoded = .cancelled(TaskID(rawValue: try reader.read(UInt64.self, "taskId")))
      case "task.expired": decoded = .expired(TaskID(rawValue: try reader.read(UInt64.self, "taskId")))
      case "task.revived": decoded = .revived(TaskID(rawValue: try reader.read(UInt64.self, "taskId")))
      case "task.payloadUpdated":
        decoded = .payloadUpdated(
          TaskID(rawValue: try reader.read(UInt64.self, "taskId")),
          payload: keepingPayload ? try reader.readBytes("payload") : try reader.skipBytes("payload"))
      case "queue.cleared": decoded = .cleared
      case "queue.paused": decoded = .paused
      case "queue.resumed": decoded = .resumed
      default: return nil
      }
      try reader.finish(type)
      return decoded
    } catch let error as PayloadError {
      throw .malformedEvent(sequence: sequence, type: type, reason: error.reason)
    } catch {
      throw .malformedEvent(sequence: sequence, type: type, reason: "\(error)")
    }
  }
}

/// What a success carries besides itself (`task.runSucceeded` version 2).
package struct SuccessDetails: Equatable, Sendable {
  /// The handler's output (JSON), kept for later tasks (``TaskQueue/output(of:)``).
  package var output: [UInt8]?
  /// Cache keys the success makes stale: their next refresh fetches, whatever their age.
  package var invalidates: [String]

  package static let none = SuccessDetails(output: nil, invalidates: [])
}

/// When an added task may first start, and the interval it repeats at (`task.added` version 3).
package struct AddSchedule: Equatable, Sendable {
  /// Unix ms before which no run of it starts; nil: at once.
  package var startAt: Int64?
  /// Milliseconds from a success to the start of the task that repeats it; nil: it runs once.
  package var interval: Int64?

  package static let none = AddSchedule(startAt: nil, interval: nil)
}
