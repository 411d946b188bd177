import LMDB

/// Appends records inside the writer's transaction: sequence numbers, the event-id index and
/// every projection, for prepared events and for the events commands decide on.
final class BatchAppender {
  let core: StoreCore
  let txn: Transaction
  let tables: [ProjectionTables]
  @exclusivity(unchecked) private(set) var head: UInt64
  @exclusivity(unchecked) private(set) var duplicates = 0
  /// Bytes of the records appended (for the commit-size metric).
  @exclusivity(unchecked) private(set) var bytesAppended = 0
  /// The sealed records appended, in order, when the store writes them into a segment frame too.
  @exclusivity(unchecked) private(set) var records: [[UInt8]]?

  init(core: StoreCore, txn: Transaction, head: UInt64, collectsRecords: Bool = false) {
    self.records = collectsRecords ? [] : nil
    self.core = core
    self.txn = txn
    self.head = head
    self.tables = core.projections.map { $0.tables(in: txn) }
  }

  /// Appends one event and folds it into the projections; returns its sequence (the existing one
  /// for an id already in the log, with idempotent appends on).
  func append(_ event: PreparedEvent) throws -> UInt64 {
    if let eventIndex = core.eventIndex, let existing = try txn.get(eventIndex, key: event.id.bytes) {
      guard let sequence = UInt64(bigEndianBytes: existing) else {
        throw FerryLogError.corruptRecord(
          sequence: 0, reason: "event-id index entry for \(event.id) is malformed")
      }
      duplicates += 1
      return sequence
    }
    guard head < UInt64.max else {
      throw FerryLogError.corruptRecord(
        sequence: head, reason: "the log's last sequence number is the largest possible")
    }
    let sequence = head + 1
    let sealed = event.record.sealed(at: sequence)
    try txn.put(core.events, key: sequence.bigEndianBytes, value: sealed, flags: .append)
    records?.append(sealed)
    head = sequence
    bytesAppended &+= event.record.body.count &+ 12  // the sealed record: body, sequence, CRC
    let logged = LoggedEvent(
      sequence: sequence, type: event.type, schemaVersion: event.currentSchemaVersion,
      storedSchemaVersion: event.schemaVersion, timestamp: event.timestamp, id: event.id,
      payload: event.currentPayload, decoded: event.decoded)
    try core.apply(logged, to: core.projections, tables: tables)
    return sequence
  }
}

/// What a command sees and does: the projections at the log's current head, inside the writer's
/// transaction, and the events it decides to append. Valid only during the command's call.
///
/// A command is a decision that depends on state — "add unless one is queued", "claim the next
/// runnable task" — made where the state is, so two callers can never decide the same thing:
///
/// ```swift
/// let added = try await log.execute { context in
///   let tables = try context.tables(of: "items")
///   if try tables.get("byName", key: key) != nil { return false }
///   _ = try context.append([NewEvent(type: "item.added", payload: key)])
///   return true
/// }
/// ```
///
/// The command shares its transaction, and its commit, with every append in the batch. It must be
/// deterministic and free of effects outside what it appends: the transaction may be run again
/// (when the map grows, or another request in the batch fails) and the command with it. Reads
/// after an `append` see that append folded into the projections. A command that throws before
/// appending fails alone; one that throws after appending is failed alone and the batch is written
/// again without it.
public final class CommandContext {
  let batch: BatchAppender
  let prepare: ([NewEvent]) throws -> [PreparedEvent]
  /// The sequences this command has appended, in order.
  @exclusivity(unchecked) public private(set) var sequences: [UInt64] = []
  @exclusivity(unchecked) private var isLive = true
  /// Whether this command's appends may wait for the next flushed commit (``mayDeferFlush()``).
  @exclusivity(unchecked) private(set) var defersFlush = false

  init(batch: BatchAppender, prepare: @escaping ([NewEvent]) throws -> [PreparedEvent]) {
    self.batch = batch
    self.prepare = prepare
  }

  func finish() { isLive = false }

  private func ensureLive() throws(FerryLogError) {
    guard isLive else {
      throw .invalidConfiguration(reason: "a command context was used after its command returned")
    }
  }

  /// The log's head: the last sequence given out, including this command's appends.
  public var head: UInt64 { batch.head }

  /// The tables of the projection named `name`, as of ``head``.
  public func tables(of name: String) throws -> ProjectionReader {
    try ensureLive()
    guard let index = batch.core.projections.firstIndex(where: { $0.name == name }) else {
      throw FerryLogError.invalidConfiguration(reason: "no projection named '\(name)' is registered")
    }
    return ProjectionReader(tables: batch.tables[index])
  }

  /// The event at `sequence`, decoded and upcast; nil when there is none (or it was compacted).
  public func event(at sequence: UInt64) throws -> LoggedEvent? {
    try ensureLive()
    return try batch.txn.withValue(batch.core.events, key: sequence.bigEndianBytes) { buffer in
      try buffer.map { try batch.core.decode($0, sequence: sequence) }
    }
  }

  /// Lets what this command appends become durable with the next flushed commit instead of its
  /// own: with the write-ahead segment, a commit whose every request allows it writes its frame
  /// without flushing it, and `execute` returns once it is visible to every process. Only for
  /// events whose loss in a power cut the store recovers from by itself — a runner's claim, which
  /// its outcome's commit always follows (`Specs/one-sync-commit.md` §3). A process killed keeps
  /// them: they are in the page cache. Without the segment every commit is flushed.
  public func mayDeferFlush() { defersFlush = true }

  /// Appends events to the batch and folds them into the projections at once; returns their
  /// sequence numbers (durable when the command's `execute` returns, unless it called
  /// ``mayDeferFlush()``).
  @discardableResult
  public func append(_ events: [NewEvent]) throws -> [UInt64] {
    try ensureLive()
    var appended: [UInt64] = []
    appended.reserveCapacity(events.count)
    for event in try prepare(events) { appended.append(try batch.append(event)) }
    sequences += appended
    return appended
  }
}

extension EventLog {
  /// Runs `command` on the writer thread inside the next group-commit transaction and returns its
  /// result once what it appended is durable (at once after the commit when it appended nothing).
  ///
  /// See ``CommandContext`` for the rules a command follows.
  public func execute<Result: Sendable>(
    _ command: @escaping @Sendable (CommandContext) throws -> Result
  ) async throws -> Result {
    guard let writer else {
      throw FerryLogError.permissionDenied(path: path, detail: "the store is open read-only")
    }
    if isUnavailable { throw unavailable }
    let outcome = try await withUnsafeThrowingContinuation {
      (continuation: UnsafeContinuation<GroupCommitWriter.AppendOutcome, any Error>) in
      let request = GroupCommitWriter.AppendRequest(
        work: .command { context in try command(context) }, continuation: continuation)
      if !writer.submit(.append(request)) {
        continuation.resume(throwing: unavailable)
      }
    }
    guard let result = outcome.result as? Result else {
      throw FerryLogError.invalidConfiguration(reason: "a command's result did not come back")
    }
    return result
  }
}
