import FerryLog
import Foundation

/// A task as the `tasks` table stores it (`Specs/task-events.md` §3.1).
struct TaskRow: Equatable {
  enum Status: UInt8 {
    case ready = 0, running = 1, waiting = 2, blocked = 3, dead = 4
    /// Cancelled (or cleared) while a run of it was under way: out of the queue for every caller
    /// (reads, commands, unique keys), but its row, claim and group entry stay until that run's
    /// outcome is logged, so its group's next task cannot start beside the handler still running.
    case cancelled = 5
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
  /// Runs that gave their attempt back (deferred or interrupted): `attempts − givenBack` count
  /// toward the retry policy's limit.
  var givenBack: UInt32 = 0
  /// No run starts before this time (Unix ms), from the add's schedule.
  var startAt: Int64?
  /// A success adds the task that repeats this one, due this many milliseconds later.
  var interval: Int64?

  /// Whether the task waits for its start time: it has not run, and its first run is not due yet
  /// (or was not when it was last indexed).
  var isScheduled: Bool { status == .waiting && attempts == 0 && startAt != nil }

  /// Whether the task is in the queue as its callers see it: every row but a cancelled one whose
  /// run is still under way (`Status.cancelled`).
  var isQueued: Bool { status != .cancelled }

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
      self = try withRawBytes(bytes) { raw throws(PayloadError) in try Claim(raw) }
    }

    init(_ bytes: UnsafeRawBufferPointer) throws(PayloadError) {
      var reader = RawPayloadReader(bytes)
      owner = try reader.readString("owner")
      runner = try reader.read(UInt32.self, "runner")
      attempt = try reader.read(UInt32.self, "attempt")
      try reader.finish("a claim")
    }
  }

  /// The stored row's size in bytes.
  private var size: Int {
    FieldWriter.size(tag) + FieldWriter.size(dataId) + FieldWriter.size(groupId) + 1 + 1 + 4
      + FieldWriter.size(eligibleAt) + 8 + FieldWriter.size(lastFailure) + 4 + FieldWriter.size(claim?.owner)
      + 4
      + 4 + 1 + FieldWriter.size(deadline) + 4 + FieldWriter.size(startAt) + FieldWriter.size(interval)
  }

  /// The stored row, as an array.
  var bytes: [UInt8] { withBytes { Array($0) } }

  /// Calls `body` with the stored row written once at its exact size in temporary memory: what a
  /// fold hands the tables (which copy it) on every change of a task, without an array made and
  /// freed per change.
  func withBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
    let size = self.size
    if let result = try FieldWriter.withEncodedInline(size: size, { write(to: &$0) }, use: body) {
      return result
    }
    var writer = PayloadWriter(capacity: size)
    write(to: &writer)
    return try writer.bytes.withUnsafeBytes(body)
  }

  /// The row's fields in their stored order (`Specs/task-events.md` §3.1).
  func write(to writer: inout some FieldSink) {
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
    writer.write(givenBack)
    writer.write(startAt)
    writer.write(interval)
  }

  init(
    tag: String, dataId: String?, groupId: String?, manual: Bool, status: Status = .ready,
    attempts: UInt32 = 0,
    eligibleAt: Int64? = nil, addedAt: Int64, lastFailure: String? = nil, errorCount: UInt32 = 0,
    priority: Int8 = 0, deadline: Int64? = nil, schedule: AddSchedule = .none
  ) {
    self.startAt = schedule.startAt
    self.interval = schedule.interval
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
    self = try withRawBytes(bytes) { raw throws(PayloadError) in try TaskRow(raw) }
  }

  /// A row read where it lies (in the map, say).
  init(_ bytes: UnsafeRawBufferPointer) throws(PayloadError) {
    var reader = RawPayloadReader(bytes)
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
    givenBack = try reader.read(UInt32.self, "givenBack")
    startAt = try reader.readOptional(Int64.self, "startAt")
    interval = try reader.readOptional(Int64.self, "interval")
    try reader.finish("a task row")
  }

  func task(id: TaskID) -> PendingTask {
    let status: TaskStatus
    switch self.status {
    case .ready: status = .ready
    case .running: status = .running
    case .waiting where isScheduled: status = .scheduled(at: Date(unixMilliseconds: eligibleAt ?? 0))
    case .waiting: status = .waiting(until: Date(unixMilliseconds: eligibleAt ?? 0))
    case .blocked: status = .blockedByError
    case .dead: status = .dead
    // Never shown by the queue's reads (they skip such rows); a claim path that meets one sees a
    // run under way.
    case .cancelled: status = .running
    }
    return PendingTask(
      id: id, tag: tag, dataId: dataId, groupId: groupId, manual: manual, status: status, attempts: attempts,
      addedAtMs: addedAt, lastFailure: lastFailure, errorCount: errorCount,
      priority: TaskPriority(rawValue: priority), deadline: deadline.map(Date.init(unixMilliseconds:)),
      attemptsGivenBack: givenBack, startAt: startAt.map(Date.init(unixMilliseconds:)),
      repeatInterval: interval.map { .milliseconds($0) })
  }
}

/// Keys of the queue's tables (`Specs/task-events.md` §3). Each key is built in one allocation:
/// a fold makes several keys per event.
enum QueueKey {
  static func task(_ id: TaskID) -> [UInt8] { id.bigEndianBytes }

  /// A `ready` key: the priority level (higher priorities first), then the id.
  static func ready(_ level: UInt8, _ id: TaskID) -> [UInt8] {
    build(9) { key in
      key.append(level)
      key.append(bigEndian: id)
    }
  }

  static func readyEntry(_ key: UnsafeRawBufferPointer) -> (level: UInt8, id: TaskID)? {
    guard key.count == 9, let id = UInt64(bigEndianBytes: key[1..<9]) else { return nil }
    return (key[0], TaskID(rawValue: id))
  }

  /// A time as 8 bytes that order by time: flipping the sign bit makes signed order byte order.
  static func timeBits(_ at: Int64) -> UInt64 { UInt64(bitPattern: at) ^ (1 << 63) }

  /// Times in keys order by time (``timeBits(_:)``).
  static func time(_ at: Int64) -> [UInt8] { timeBits(at).bigEndianBytes }

  /// A `waiting` key: the priority level, then the retry time, then the id.
  static func waiting(_ level: UInt8, _ at: Int64, _ id: TaskID) -> [UInt8] {
    build(17) { key in
      key.append(level)
      key.append(bigEndian: timeBits(at))
      key.append(bigEndian: id)
    }
  }

  static func waitingTime(_ key: UnsafeRawBufferPointer) -> (level: UInt8, at: Int64, id: TaskID)? {
    guard key.count == 17, let raw = UInt64(bigEndianBytes: key[1..<9]),
      let id = UInt64(bigEndianBytes: key[9..<17])
    else { return nil }
    return (key[0], Int64(bitPattern: raw ^ (1 << 63)), TaskID(rawValue: id))
  }

  /// A `deadlines` key: the deadline, then the id.
  static func deadline(_ at: Int64, _ id: TaskID) -> [UInt8] {
    build(16) { key in
      key.append(bigEndian: timeBits(at))
      key.append(bigEndian: id)
    }
  }

  static func deadlineEntry(_ key: UnsafeRawBufferPointer) -> (at: Int64, id: TaskID)? {
    guard key.count == 16, let raw = UInt64(bigEndianBytes: key[0..<8]),
      let id = UInt64(bigEndianBytes: key[8..<16])
    else { return nil }
    return (Int64(bitPattern: raw ^ (1 << 63)), TaskID(rawValue: id))
  }

  /// A text as a u16 byte count and its UTF-8 bytes.
  static func prefixed(_ text: String) -> [UInt8] {
    build(2 + text.utf8.count) { key in key.append(prefixed: text) }
  }

  static func groupPrefix(_ groupId: String) -> [UInt8] { prefixed(groupId) }
  static func group(_ groupId: String, _ id: TaskID) -> [UInt8] {
    build(2 + groupId.utf8.count + 8) { key in
      key.append(prefixed: groupId)
      key.append(bigEndian: id)
    }
  }
  static func uniquePrefix(tag: String, dataId: String) -> [UInt8] {
    build(4 + tag.utf8.count + dataId.utf8.count) { key in
      key.append(prefixed: tag)
      key.append(prefixed: dataId)
    }
  }
  static func unique(tag: String, dataId: String, _ id: TaskID) -> [UInt8] {
    build(4 + tag.utf8.count + dataId.utf8.count + 8) { key in
      key.append(prefixed: tag)
      key.append(prefixed: dataId)
      key.append(bigEndian: id)
    }
  }
  static let paused: [UInt8] = Array("paused".utf8)

  /// The task id at the end of an index key.
  static func trailingID(_ key: UnsafeRawBufferPointer) -> TaskID? {
    guard key.count >= 8 else { return nil }
    return UInt64(bigEndianBytes: key[(key.count - 8)...]).map(TaskID.init(rawValue:))
  }

  /// Calls `body` with a task's key in temporary memory (``task(_:)`` without an array).
  @inline(__always)
  static func withTask<R>(_ id: TaskID, _ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
    try withUnsafeBytes(of: id.rawValue.bigEndian, body)
  }

  /// Calls `body` with a `ready` key in temporary memory (``ready(_:_:)`` without an array).
  static func withReady<R>(
    _ level: UInt8, _ id: TaskID, _ body: (UnsafeRawBufferPointer) throws -> R
  ) rethrows -> R {
    var raw: (UInt64, UInt64) = (0, 0)
    return try withUnsafeMutableBytes(of: &raw) { buffer in
      buffer.storeBytes(of: level, toByteOffset: 0, as: UInt8.self)
      buffer.storeBytes(of: id.rawValue.bigEndian, toByteOffset: 1, as: UInt64.self)
      return try body(UnsafeRawBufferPointer(rebasing: buffer[0..<9]))
    }
  }

  /// No bytes (an index row's value), at an address that is not null.
  static func withEmpty<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
    var byte: UInt8 = 0
    return try withUnsafeBytes(of: &byte) { try body(UnsafeRawBufferPointer(rebasing: $0[0..<0])) }
  }

  /// A key of exactly `capacity` bytes, written by `body` (``makeBytes(count:_:)``).
  private static func build(_ capacity: Int, _ body: (inout KeyWriter) -> Void) -> [UInt8] {
    makeBytes(count: capacity) { buffer in
      var writer = KeyWriter(buffer: buffer)
      body(&writer)
    }
  }
}

/// Writes a key's fields into memory of its exact size (never past it).
private struct KeyWriter {
  let buffer: UnsafeMutableRawBufferPointer
  var offset = 0

  mutating func append(_ byte: UInt8) {
    guard offset < buffer.count else { return }
    buffer[offset] = byte
    offset += 1
  }

  mutating func append(bigEndian value: UInt64) {
    guard buffer.count - offset >= 8 else { return }
    buffer.storeBytes(of: value.bigEndian, toByteOffset: offset, as: UInt64.self)
    offset += 8
  }

  mutating func append(bigEndian id: TaskID) { append(bigEndian: id.rawValue) }

  /// A text as a u16 byte count and its UTF-8 bytes.
  mutating func append(prefixed text: String) {
    let utf8 = text.utf8
    let count = UInt16(truncatingIfNeeded: utf8.count)
    append(UInt8(count >> 8))
    append(UInt8(truncatingIfNeeded: count))
    for byte in utf8 { append(byte) }
  }
}
