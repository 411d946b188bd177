import Foundation
import LMDB
import Synchronization

extension EventLog {
  /// The last sequence number in the log (0 when it is empty).
  public func head() throws -> UInt64 {
    try guarded { try environment.read { txn in try core.head(txn) } }
  }

  /// The store id a directory's head mark names, read without opening the store — a damaged
  /// store's too (the mark is a file of its own); nil when there is none.
  package static func markedStoreId(at path: String) -> EventID? {
    guard case .mark(let mark) = HeadMark.read(in: path), !mark.isCreating else { return nil }
    return EventID(bytes: mark.storeId)
  }

  /// The store's identity: made at random when the store was created and never changed — kept
  /// by compaction, `ferry compact --copy` and `ferry salvage`; a store created anew (even at the
  /// same path, or by `ferry import`) has another. Nil only for a store whose creation never finished.
  public func storeId() throws -> EventID? {
    try guarded {
      try environment.read { txn in try txn.get(core.meta, key: MetaKey.storeId).flatMap(EventID.init(bytes:))
      }
    }
  }

  /// The event at `sequence`, decoded and upcast; nil when there is none.
  public func event(at sequence: UInt64) throws -> LoggedEvent? {
    try guarded {
      try environment.read { txn in
        try txn.withValue(core.events, key: sequence.bigEndianBytes) { buffer in
          try buffer.map { try core.decode($0, sequence: sequence) }
        }
      }
    }
  }

  /// The stored bytes of the record at `sequence`, exactly as on disk; nil when there is none.
  public func record(at sequence: UInt64) throws -> [UInt8]? {
    try guarded { try environment.read { txn in try txn.get(core.events, key: sequence.bigEndianBytes) } }
  }

  /// Up to `limit` events after `sequence`, in order, read in one short read transaction.
  public func events(after sequence: UInt64, limit: Int = 1000) throws -> [LoggedEvent] {
    try events(after: sequence, limit: limit, upcast: true)
  }

  func events(after sequence: UInt64, limit: Int, upcast: Bool) throws -> [LoggedEvent] {
    try guarded {
      var result: [LoggedEvent] = []
      if limit <= 0 || sequence == .max { return result }
      try environment.read { txn in
        // Gaps are allowed only where compaction removed events on purpose.
        let compacted = try core.compactedThrough(txn)
        var expected = sequence + 1
        try txn.withCursor(core.events) { cursor in
          try cursor.scan(from: (sequence + 1).bigEndianBytes) { key, value in
            guard let current = UInt64(bigEndianBytes: key) else {
              throw FerryLogError.corruptRecord(
                sequence: expected, reason: "its key has \(key.count) bytes, not 8"
              )
            }
            if let problem = StoreCore.orderProblem(current, expected: expected, compacted: compacted) {
              throw problem
            }
            expected = current &+ 1
            result.append(
              upcast
                ? try core.decode(value, sequence: current) : try EventRecord.decode(value, sequence: current)
            )
            return result.count < limit
          }
        }
      }
      return result
    }
  }

  /// Calls `body` with every event from `first` through `last` (the head when nil), reading in
  /// chunks of `chunkSize` so that no read transaction stays open long.
  public func forEachEvent(
    from first: UInt64 = 1, through last: UInt64? = nil, chunkSize: Int = 1000,
    _ body: (LoggedEvent) throws -> Void
  ) throws {
    try forEach(from: first, through: last, chunkSize: chunkSize, upcast: true, body)
  }

  /// Like ``forEachEvent(from:through:chunkSize:_:)``, but with every record exactly as stored:
  /// not upcast, and readable without a catalog entry for its type (for export and statistics).
  public func forEachRecord(
    from first: UInt64 = 1, through last: UInt64? = nil, chunkSize: Int = 1000,
    _ body: (LoggedEvent) throws -> Void
  ) throws {
    try forEach(from: first, through: last, chunkSize: chunkSize, upcast: false, body)
  }

  private func forEach(
    from first: UInt64, through last: UInt64?, chunkSize: Int, upcast: Bool,
    _ body: (LoggedEvent) throws -> Void
  ) throws {
    var after = first > 0 ? first - 1 : 0
    let (head, removedBefore) = try read { view in
      (try view.core.head(view.transaction), try view.core.compaction(view.transaction)?.removed ?? 0)
    }
    let end = min(last ?? head, head)
    var seen: UInt64 = 0
    while after < end {
      let chunk = try events(after: after, limit: max(1, chunkSize), upcast: upcast)
      guard !chunk.isEmpty else {
        // Nothing after `after` up to the head: only compaction may have removed that (the head
        // is then its point); anything else is a log that ends before its head.
        guard try compactionState().map({ $0.through >= end }) ?? false else {
          throw FerryLogError.sequenceGap(expected: after + 1, found: nil)
        }
        break
      }
      for event in chunk where event.sequence <= end {
        try body(event)
        seen += 1
        after = event.sequence
      }
      if let lastRead = chunk.last?.sequence, lastRead >= end { break }
    }
    // A scan of the whole log must meet every record it holds (`head − removed`): a damaged branch
    // page can make a cursor skip a leaf inside the compacted range, where gaps are otherwise
    // legal. Skipped when a compaction ran during the scan (its removals are not this scan's).
    guard first <= 1, end == head else { return }
    let removedAfter = try read { view in try view.core.compaction(view.transaction)?.removed ?? 0 }
    guard removedAfter == removedBefore, head >= removedBefore, seen != head - removedBefore else { return }
    throw FerryLogError.damagedStore(
      path: path,
      reason:
        "a scan of the whole log met \(seen) records, but its head \(head) less the \(removedBefore) compaction removed makes \(head - removedBefore)"
    )
  }

  /// Reads projections through one consistent snapshot.
  ///
  /// ```swift
  /// let n = try log.read { view in try view.tables(of: "countByType").count("counts") }
  /// ```
  ///
  /// A projection the log has moved past — another process appended without folding it, or is
  /// rebuilding it in chunks, or was killed part-way through a rebuild — is first caught up through
  /// this process's writer (what an append here does first), and `body` runs again on a snapshot
  /// that has it. When that snapshot is behind again (another process keeps appending without
  /// folding, or rebuilds back to back, and won the race), `body` runs once more inside the
  /// writer's own transaction, on the writer's thread, after the writer has folded what is behind:
  /// there the projections are at the head whatever other processes do. So `body` may run more
  /// than once, on another thread than the caller's; it should only read the view, and not depend
  /// on the calling thread (thread or task locals, locks the caller holds). While it runs in the
  /// writer's transaction this process's appends, and other processes' writes, wait for it.
  ///
  /// The read waits for the writer at most a second for the catch-up and four seconds in all,
  /// blocking its thread: when another process holds LMDB's write lock for longer (an app
  /// extension suspended mid-rebuild), it throws
  /// ``FerryLogError/projectionNotCurrent(projection:reason:)`` rather than hang — a read on an
  /// app's main thread — with a reason that says the writer did not get to the read. A `body` the
  /// writer has begun is waited for; one it has not is never run after the read gave up.
  ///
  /// Still ``FerryLogError/projectionNotCurrent(projection:reason:)``, at once: a read-only open (no
  /// writer), a read on the writer's own thread (a compaction's predicate: it would wait for
  /// itself), a read inside another read (its thread holds a snapshot the writer may have to wait
  /// for, to grow the map). A projection stored at another version is never folded or served: its
  /// read gets the error after the rounds above. A closed log throws ``FerryLogError/closed``.
  public func read<R>(_ body: (LogView) throws -> R) throws -> R {
    try read(body, inWriter: true)
  }

  /// ``read(_:)`` for a caller with a way to wait for the writer that does not block a thread
  /// (``execute(_:)``, which suspends): a snapshot and, after one catch-up, another — then
  /// ``FerryLogError/projectionNotCurrent(projection:reason:)``, never a turn in the writer's
  /// transaction, so it blocks its thread a second at most where ``read(_:)`` may take four.
  package func readCatchingUpOnly<R>(_ body: (LogView) throws -> R) throws -> R {
    try read(body, inWriter: false)
  }

  /// A snapshot; when a projection is behind, ``readBehind(_:_:inWriter:)``.
  private func read<R>(_ body: (LogView) throws -> R, inWriter: Bool) throws -> R {
    let behind: FerryLogError
    do {
      return try readSnapshot(body)
    } catch let error as FerryLogError {
      guard case .projectionNotCurrent = error else { throw error }
      behind = error
    }
    return try readBehind(body, behind, inWriter: inWriter)
  }

  /// `body` on a new read snapshot.
  private func readSnapshot<R>(_ body: (LogView) throws -> R) throws -> R {
    try guarded {
      // One session for the whole read: a resume meanwhile must not mix two environments' handles.
      let session = self.session
      return try session.environment.read { txn in
        try body(LogView(core: session.core, transaction: txn, stale: session.stale))
      }
    }
  }

  /// The rest of ``read(_:)`` once its snapshot found a projection behind the log (`behind`):
  /// one catch-up and a new snapshot, then, `inWriter`, `body` in the writer's transaction.
  private func readBehind<R>(
    _ body: (LogView) throws -> R, _ behind: FerryLogError, inWriter: Bool
  ) throws -> R {
    // Only a writer this thread may wait for can help: none read-only; not on its own thread
    // (it would wait for itself); not on a thread holding another transaction of the store — a
    // read inside a read: the writer's transaction may have to grow the map, which waits for
    // that transaction to end, which waits for the writer.
    guard let writer, !writer.isCurrentThread, !environment.callingThreadHoldsTransaction else {
      throw behind
    }
    let deadline = DispatchTime.now() + Self.readWriterWait
    var notCurrent = behind
    switch try catchUpBehind(writer) {
    case .refused:
      throw unavailable
    case .pending:
      // The writer did not finish the catch-up in a second (another process holds LMDB's write
      // lock, or this process's writer is on a long job): the job stays queued, and the read's
      // turn in the writer's transaction queues behind it, until the deadline.
      guard inWriter else { throw behind }
    case .done:
      // One new snapshot: behind again means another process keeps moving the projection (it
      // appends without folding it, or rebuilds back to back) and won this race; more rounds
      // would mostly lose too. The writer's transaction cannot lose it.
      do {
        return try readSnapshot(body)
      } catch let error as FerryLogError {
        guard case .projectionNotCurrent = error else { throw error }
        notCurrent = error
      }
    }
    guard inWriter else { throw notCurrent }
    return try readInWriterTransaction(body, writer: writer, until: deadline, notCurrent: notCurrent)
  }

  /// How long a read waits for its catch-up before it runs in the writer's transaction instead.
  static let readCatchUpWait: DispatchTimeInterval = .seconds(1)

  /// The longest ``read(_:)`` waits for this process's writer in all — its catch-up
  /// (``readCatchUpWait`` at most), then for the writer to begin the transaction it reads in —
  /// before it throws ``FerryLogError/projectionNotCurrent(projection:reason:)``. Bounded, because
  /// another process may hold LMDB's write lock for as long as it is stopped (an app extension
  /// suspended mid-rebuild, a debugger), and a read on an app's main thread must not freeze the
  /// app for that long; four seconds, because a read is rarely worth more to an app and rarely
  /// needs as much (the writer's turn normally comes within a commit or a rebuild chunk).
  static let readWriterWait: DispatchTimeInterval = .seconds(readWriterWaitSeconds)
  /// ``readWriterWait`` in whole seconds (for messages).
  static let readWriterWaitSeconds = 4

  /// What became of a read's catch-up.
  enum CatchUp {
    /// The writer folded what was behind (or found nothing behind).
    case done
    /// The writer has not finished it within ``readCatchUpWait``; it stays queued.
    case pending
    /// The writer is stopping: the log is closed.
    case refused
  }

  /// Folds into this process's projections what the log holds past them, on the writer thread
  /// (waiting for it, ``readCatchUpWait`` at most), and checkpoints when the store has a
  /// write-ahead segment. The caller checked that this thread may wait for the writer (see
  /// ``readBehind(_:_:)``).
  func catchUpBehind(_ writer: GroupCommitWriter) throws -> CatchUp {
    let core = self.core
    let environment = self.environment
    let chunk = configuration.rebuildChunkSize
    let segment = self.segment
    let outcome = Mutex<Result<Int, any Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    let accepted = writer.submit(
      .exclusive {
        let result = Result {
          let folded = try Self.foldBehind(core, environment: environment, chunk: chunk)
          if folded > 0 { try segment?.checkpointNow(environment: environment, core: core) }
          return folded
        }
        outcome.withLock { $0 = result }
        done.signal()
      })
    guard accepted else { return .refused }
    // Bounded: another process may hold LMDB's write lock for long (an app extension suspended
    // mid-rebuild). The job stays queued and catches up when it can.
    guard done.wait(timeout: .now() + Self.readCatchUpWait) == .success else { return .pending }
    switch outcome.withLock({ $0 }) {
    case .failure(let error): throw FerryLogError.wrap(error, path: path)
    case .success, nil: return .done
    }
  }
}

/// A consistent snapshot of a log's projections, valid only inside ``EventLog/read(_:)``.
public struct LogView {
  let core: StoreCore
  let transaction: Transaction
  let stale: [String: String]
  var fixedHead: UInt64? = nil
  /// Whether to check each projection's stored state against the log (not for a scratch rebuild).
  var checksState = true

  /// The head of the log in this snapshot (for a view of the past, the sequence it was built up to).
  public func head() throws -> UInt64 { try fixedHead ?? core.head(transaction) }

  /// The event at `sequence` in this snapshot, decoded and upcast; nil when there is none (or it
  /// is past the head of a view of the past).
  public func event(at sequence: UInt64) throws -> LoggedEvent? {
    if let fixedHead, sequence > fixedHead { return nil }
    return try transaction.withValue(core.events, key: sequence.bigEndianBytes) { buffer in
      try buffer.map { try core.decode($0, sequence: sequence) }
    }
  }

  /// The tables of the projection named `name`.
  public func tables(of name: String) throws -> ProjectionReader {
    if let reason = stale[name] { throw FerryLogError.projectionNotCurrent(projection: name, reason: reason) }
    guard let target = core.projections.first(where: { $0.name == name }) else {
      throw FerryLogError.invalidConfiguration(reason: "no projection named '\(name)' is registered")
    }
    // Another process may have appended without it, rebuilt it at another version, or a rebuild
    // may have failed part-way: never serve rows that do not match the log.
    if checksState, let reason = try core.staleness(of: target, head: core.head(transaction), transaction) {
      throw FerryLogError.projectionNotCurrent(projection: name, reason: reason)
    }
    return ProjectionReader(tables: target.tables(in: transaction))
  }
}
