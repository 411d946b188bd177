import FerryLog
import Foundation

/// A task as the `tasks` table stores it (`Specs/task-events.md` §3.1).
struct TaskRow: Equatable {
  enum Status: UInt8 {
    case ready = 0, running = 1, waiting = 2, blocked = 3, dead = 4
  }

  var tag: String
  var dataId: String?
  var groupId: String?
  var manual: Bool
  var status: Status
  var attempts: UInt32
  var eligibleAt: Int64?
  var addedAt: Int64
  var lastFailure: String?
  var errorCount: UInt32
  /// The run under way: who claimed it (set by `task.runStarted`, ended by the run's outcome).
  /// A task with a claim is never claimed again, whatever its status says meanwhile.
  var claim: Claim?
  /// Larger runs first (0 normal), from the add.
  var priority: Int8 = 0
  /// No run starts after this time (Unix ms), from the add.
  var deadline: Int64?

  /// The first byte of the task's `ready` and `waiting` keys: higher priorities sort first.
  var level: UInt8 { TaskPriority(rawValue: priority).indexLevel }

  /// Who owns a run: a process's liveness token and a runner within it.
  struct Claim: Equatable {
    var owner: String
    var runner: UInt32
    var attempt: UInt32

    var bytes: [UInt8] {
      var writer = PayloadWriter(capacity: 16 + owner.utf8.count)
      writer.write(owner)
      writer.write(runner)
      writer.write(attempt)
      return writer.bytes
    }

    init(owner: String, runner: UInt32, attempt: UInt32) {
      self.owner = owner
      self.runner = runner
      self.attempt = attempt
    }

    init(bytes: [UInt8]) throws(PayloadError) {
      var reader = PayloadReader(bytes)
      owner = try reader.readString("owner")
      runner = try reader.read(UInt32.self, "runner")
      attempt = try reader.read(UInt32.self, "attempt")
      try reader.finish("a claim")
    }
  }

  var bytes: [UInt8] {
    var writer = PayloadWriter(
      capacity: 64 + tag.utf8.count + (dataId?.utf8.count ?? 0) + (groupId?.utf8.count ?? 0))
    writer.write(tag)
    writer.write(dataId)
    writer.write(groupId)
    writer.write(manual)
    writer.write(status.rawValue)
    writer.write(attempts)
    writer.write(eligibleAt)
    writer.write(addedAt)
    writer.write(lastFailure)
    writer.write(errorCount)
    writer.write(claim?.owner)
    writer.write(claim?.runner ?? 0)
    writer.write(claim?.attempt ?? 0)
    writer.write(UInt8(bitPattern: priority))
    writer.write(deadline)
    return writer.bytes
  }

  init(
    tag: String, dataId: String?, groupId: String?, manual: Bool, status: Status = .ready,
    attempts: UInt32 = 0,
    eligibleAt: Int64? = nil, addedAt: Int64, lastFailure: String? = nil, errorCount: UInt32 = 0,
    priority: Int8 = 0, deadline: Int64? = nil
  ) {
    self.priority = priority
    self.deadline = deadline
    self.tag = tag
    self.dataId = dataId
    self.groupId = groupId
    self.manual = manual
    self.status = status
    self.attempts = attempts
    self.eligibleAt = eligibleAt
    self.addedAt = addedAt
    self.lastFailure = lastFailure
    self.errorCount = errorCount
  }

  init(bytes: [UInt8]) throws(PayloadError) {
    var reader = PayloadReader(bytes)
    tag = try reader.readString("tag")
    dataId = try reader.readOptionalString("dataId")
    groupId = try reader.readOptionalString("groupId")
    manual = try reader.readBool("manual")
    let raw = try reader.read(UInt8.self, "status")
    guard let status = Status(rawValue: raw) else { throw PayloadError("task status \(raw) is not known") }
    self.status = status
    attempts = try reader.read(UInt32.self, "attempts")
    eligibleAt = try reader.readOptional(Int64.self, "eligibleAt")
    addedAt = try reader.read(Int64.self, "addedAt")
    lastFailure = try reader.readOptionalString("lastFailure")
    errorCount = try reader.read(UInt32.self, "errorCount")
    let owner = try reader.readOptionalString("claim owner")
    let runner = try reader.read(UInt32.self, "claim runner")
    let attempt = try reader.read(UInt32.self, "claim attempt")
    claim = owner.map { Claim(owner: $0, runner: runner, attempt: attempt) }
    priority = Int8(bitPattern: try reader.read(UInt8.self, "priority"))
    deadline = try reader.readOptional(Int64.self, "deadline")
    try reader.finish("a task row")
  }

  func task(id: TaskID) -> PendingTask {
    let status: TaskStatus
    switch self.status {
    case .ready: status = .ready
    case .running: status = .running
    case .waiting: status = .waiting(until: Date(unixMilliseconds: eligibleAt ?? 0))
    case .blocked: status = .blockedByError
    case .dead: status = .dead
    }
    return PendingTask(
      id: id, tag: tag, dataId: dataId, groupId: groupId, manual: manual, status: status, attempts: attempts,
      addedAtMs: addedAt, lastFailure: lastFailure, errorCount: errorCount,
      priority: TaskPriority(rawValue: priority), deadline: deadline.map(Date.init(unixMilliseconds:)))
  }
}

/// Keys of the queue's tables (`Specs/task-events.md` §3).
enum QueueKey {
  static func task(_ id: TaskID) -> [UInt8] { id.bigEndianBytes }

  /// A `ready` key: the priority level (higher priorities first), then the id.
  static func ready(_ level: UInt8, _ id: TaskID) -> [UInt8] { [level] + id.bigEndianBytes }

  static func readyEntry(_ key: UnsafeRawBufferPointer) -> (level: UInt8, id: TaskID)? {
    guard key.count == 9, let id = UInt64(bigEndianBytes: key[1..<9]) else { return nil }
    return (key[0], id)
  }

  /// Times in keys order by time: flipping the sign bit makes signed order byte order.
  static func time(_ at: Int64) -> [UInt8] { (UInt64(bitPattern: at) ^ (1 << 63)).bigEndianBytes }

  /// A `waiting` key: the priority level, then the retry time, then the id.
  static func waiting(_ level: UInt8, _ at: Int64, _ id: TaskID) -> [UInt8] {
    [level] + time(at) + id.bigEndianBytes
  }

  static func waitingTime(_ key: UnsafeRawBufferPointer) -> (level: UInt8, at: Int64, id: TaskID)? {
    guard key.count == 17, let raw = UInt64(bigEndianBytes: key[1..<9]),
      let id = UInt64(bigEndianBytes: key[9..<17])
    else { return nil }
    return (key[0], Int64(bitPattern: raw ^ (1 << 63)), id)
  }

  /// A `deadlines` key: the deadline, then the id.
  static func deadline(_ at: Int64, _ id: TaskID) -> [UInt8] { time(at) + id.bigEndianBytes }

  static func deadlineEntry(_ key: UnsafeRawBufferPointer) -> (at: Int64, id: TaskID)? {
    guard key.count == 16, let raw = UInt64(bigEndianBytes: key[0..<8]),
      let id = UInt64(bigEndianBytes: key[8..<16])
    else { return nil }
    return (Int64(bitPattern: raw ^ (1 << 63)), id)
  }

  static func prefixed(_ text: String) -> [UInt8] {
    let utf8 = Array(text.utf8)
    return UInt16(truncatingIfNeeded: utf8.count).bigEndianBytes + utf8
  }

  static func groupPrefix(_ groupId: String) -> [UInt8] { prefixed(groupId) }
  static func group(_ groupId: String, _ id: TaskID) -> [UInt8] { prefixed(groupId) + id.bigEndianBytes }
  static func uniquePrefix(tag: String, dataId: String) -> [UInt8] { prefixed(tag) + prefixed(dataId) }
  static func unique(tag: String, dataId: String, _ id: TaskID) -> [UInt8] {
    uniquePrefix(tag: tag, dataId: dataId) + id.bigEndianBytes
  }
  static let paused: [UInt8] = Array("paused".utf8)

  /// The task id at the end of an index key.
  static func trailingID(_ key: UnsafeRawBufferPointer) -> TaskID? {
    guard key.count >= 8 else { return nil }
    return UInt64(bigEndianBytes: key[(key.count - 8)...])
  }
}
