import Foundation
import LMDB

/// What a rebuild did.
public struct RebuildReport: Sendable, Equatable {
  /// The projections rebuilt.
  public var projections: [String]
  /// Events folded into them.
  public var eventsReplayed: Int
  /// The head of the log when the rebuild finished.
  public var head: UInt64
  /// Wall time the rebuild took, in seconds.
  public var seconds: Double
}

/// What ``EventLog/verify(maxDifferences:progress:)`` found.
public struct VerifyReport: Sendable {
  /// One thing wrong with a store.
  public enum Problem: Sendable, CustomStringConvertible {
    /// A record that fails its CRC, does not decode, or cannot be read by this code.
    case unreadableRecord(sequence: UInt64, reason: String)
    /// A sequence number missing from the log.
    case sequenceGap(expected: UInt64, found: UInt64?)
    /// A record with a valid CRC that this code cannot read: an event type, schema version or
    /// record format it does not know (written by a newer Ferry, or by another application through
    /// FerryLog). Not damage.
    case unreadableByThisVersion(sequence: UInt64, reason: String)
    /// A projection that threw while being rebuilt.
    case projectionFailed(projection: String, sequence: UInt64, reason: String)
    /// A projection's stored state is not where it should be.
    case projectionState(projection: String, reason: String)
    /// The log holds another number of records than its head less what compaction removed
    /// (a damaged branch page hiding or repeating records where gaps are legal).
    case recordCount(found: UInt64, expected: UInt64)
    /// A row that differs between the stored projection and a rebuild from the log.
    case rowDiffers(projection: String, table: String, key: [UInt8], stored: [UInt8]?, rebuilt: [UInt8]?)

    /// A one-line message.
    public var description: String {
      switch self {
      case .unreadableRecord(let sequence, let reason): return "record \(sequence): \(reason)"
      case .unreadableByThisVersion(let sequence, let reason):
        return "record \(sequence) cannot be read by this version: \(reason)"
      case .sequenceGap(let expected, let found):
        return "sequence \(expected) is missing" + (found.map { " (\($0) follows)" } ?? " (the log ends)")
      case .projectionFailed(let projection, let sequence, let reason):
        return "projection '\(projection)' failed on record \(sequence): \(reason)"
      case .projectionState(let projection, let reason): return "projection '\(projection)': \(reason)"
      case .recordCount(let found, let expected):
        return "the log holds \(found) records where its head less what compaction removed makes \(expected)"
      case .rowDiffers(let projection, let table, let key, let stored, let rebuilt):
        return "projection '\(projection)' table '\(table)' key \(hexString(key)): stored "
          + (stored.map(hexString) ?? "(missing)") + ", rebuilt " + (rebuilt.map(hexString) ?? "(missing)")
      }
    }

    /// Whether the problem is damage to the log itself (a record that does not read, a missing
    /// sequence), as opposed to projections that differ from it (which a rebuild repairs).
    public var isDamage: Bool {
      switch self {
      case .unreadableRecord, .sequenceGap, .recordCount: return true
      default: return false
      }
    }

    /// The sequence number the problem is about, when it is about one record.
    public var sequence: UInt64? {
      switch self {
      case .unreadableRecord(let sequence, _), .unreadableByThisVersion(let sequence, _): return sequence
      case .sequenceGap(let expected, _): return expected
      case .projectionFailed(_, let sequence, _): return sequence
      default: return nil
      }
    }
  }

  /// The head of the log in the snapshot verified.
  public var head: UInt64
  /// Records read and checked.
  public var recordsChecked: Int
  /// Rows compared across all projection tables.
  public var rowsCompared: Int
  /// Problems found, in the order found (at most the number asked for, plus record problems).
  public var problems: [Problem]
  /// Whether more row differences existed than were reported.
  public var moreDifferences: Bool
  /// Whether nothing is wrong.
  public var isHealthy: Bool { problems.isEmpty }
}

func hexString(_ bytes: [UInt8]) -> String {
  let shown = bytes.prefix(48).map { byte -> String in
    let digits = String(byte, radix: 16)
    return digits.count == 1 ? "0" + digits : digits
  }.joined()
  return bytes.count > 48 ? shown + "…(\(bytes.count) bytes)" : shown
}

/// A throw-away LMDB environment for rebuilding projections outside the store (verify, replay).
/// Its commits are not flushed, and it is deleted when closed.
final class ScratchArea {
  let path: String
  let environment: Environment
  let projections: [BoundProjection]

  init(projections: [any Projection]) throws {
    let base = FileManager.default.temporaryDirectory.path
    path = base + "/ferry-scratch-\(getpid())-\(EventID.make().hex.suffix(12))"
    var options = Environment.Options()
    options.durability = .scratch
    options.initialMapSize = 16 << 20
    let names = projections.flatMap(BoundProjection.databaseNames(of:))
    let environment = try Environment.open(path: path, options: options, databases: names)
    self.environment = environment
    self.projections = try projections.map { try BoundProjection.bind($0, in: environment) }
  }

  func close() {
    environment.close()
    try? FileManager.default.removeItem(atPath: path)
  }
}

extension EventLog {
  /// Empties projections that are new, of a changed version, or named in `reset`, then folds the
  /// log into every projection that is behind, in transactions of `chunk` events. Returns how many
  /// events were replayed.
  static func prepareProjections(
    _ core: StoreCore, environment: Environment, chunk: Int, reset: Set<String>
  ) throws -> Int {
    // Most opens find every projection at its version and at the head: then nothing is written,
    // and the open does not wait for another process that holds LMDB's writer lock.
    let settled =
      try reset.isEmpty
      && environment.read { txn -> Bool in
        let head = try core.head(txn)
        for target in core.projections {
          guard let state = try core.state(of: target.name, txn), state.version == target.projection.version,
            state.position >= head
          else { return false }
        }
        return true
      }
    if settled { return 0 }
    // Projections rebuilt from what a compacted log still holds (no usable snapshot): once they
    // reach the head, their state there becomes their snapshot, so that verify, time travel and
    // later rebuilds start from it rather than from events that are gone.
    let rebuiltWithoutSnapshot = try environment.write { txn -> [String] in
      var rebuilt: [String] = []
      for target in core.projections {
        let state = try core.state(of: target.name, txn)
        if state == nil || state?.version != target.projection.version || reset.contains(target.name) {
          // Start from the newest snapshot when it is of this version and intact (the events it
          // covers may have been compacted away); otherwise from nothing, replaying what the log
          // still holds.
          let start = try core.restoreFromSnapshot(target, txn) ?? 0
          if start == 0 {
            for database in target.databases.values { try txn.empty(database) }
            if try core.compactedThrough(txn) > 0 && !target.snapshotDatabases.isEmpty {
              rebuilt.append(target.name)
            }
          }
          try core.setState(
            ProjectionState(version: target.projection.version, position: start), of: target.name, txn)
        }
      }
      return rebuilt
    }
    defer {
      if !rebuiltWithoutSnapshot.isEmpty {
        _ = try? environment.write { txn in
          try core.writeSnapshots(
            of: core.projections.filter { rebuiltWithoutSnapshot.contains($0.name) }, txn)
        }
      }
    }
    return try foldBehind(core, environment: environment, chunk: chunk)
  }

  /// Folds the log into every projection of this code's version that is behind its head, in
  /// transactions of `chunk` events, each starting from the position stored then (so another
  /// process folding the same projection at the same time — its own rebuild or catch-up — only
  /// shares the work). A projection stored at another version is left alone. Returns how many
  /// events were replayed.
  static func foldBehind(_ core: StoreCore, environment: Environment, chunk: Int) throws -> Int {
    var replayed = 0
    while true {
      let progressed = try environment.write { txn in try core.foldFurthestBehind(limit: chunk, txn) }
      if progressed == 0 { break }
      CrashPoint.reach(CrashPoint.rebuildChunk)
      replayed += progressed
    }
    return replayed
  }

  /// Empties the named projections (all when nil) and replays the whole log into them.
  ///
  /// Appends wait while it runs; readers may see the projections partly rebuilt until it returns.
  /// An interrupted rebuild resumes where it stopped at the next open.
  public func rebuild(_ names: [String]? = nil) async throws -> RebuildReport {
    guard let writer else {
      throw FerryLogError.permissionDenied(path: path, detail: "the store is open read-only")
    }
    let registered = Set(self.core.projections.map(\.name))
    let selected = names.map(Set.init) ?? registered
    if let unknown = selected.first(where: { !registered.contains($0) }) {
      throw FerryLogError.invalidConfiguration(reason: "no projection named '\(unknown)' is registered")
    }
    let core = self.core
    let environment = self.environment
    let chunk = configuration.rebuildChunkSize
    let segment = self.segment
    return try await withCheckedThrowingContinuation { continuation in
      let accepted = writer.submit(
        .exclusive {
          let start = ContinuousClock.now
          do {
            let subset = StoreCore(
              events: core.events, meta: core.meta,
              projections: core.projections.filter { selected.contains($0.name) },
              eventIndex: core.eventIndex, catalog: core.catalog)
            let replayed = try Self.prepareProjections(
              subset, environment: environment, chunk: chunk, reset: selected)
            let head = try environment.read { txn in try core.head(txn) }
            // With a write-ahead segment the rebuild's commits were not flushed: a checkpoint does.
            try segment?.checkpointNow(environment: environment, core: core)
            let elapsed = ContinuousClock.now - start
            continuation.resume(
              returning: RebuildReport(
                projections: subset.projections.map(\.name), eventsReplayed: replayed, head: head,
                seconds: Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18))
          } catch {
            continuation.resume(throwing: FerryLogError.wrap(error, path: environment.path))
          }
        })
      if !accepted { continuation.resume(throwing: self.unavailable) }
    }
  }

  /// Checks the store: every record's CRC and decoding, gap-free sequence numbers, each
  /// projection's stored version and position, and every projection row against a rebuild from
  /// the log into a scratch area. Reports at most `maxDifferences` differing rows.
  ///
  /// It reads one consistent snapshot, so it can run while another caller or process appends.
  /// `progress` is called with the sequence the rebuild has reached and the head, after each chunk
  /// of the log (``Configuration/rebuildChunkSize`` events), on the calling thread.
  public func verify(
    maxDifferences: Int = 20, progress: (_ reached: UInt64, _ head: UInt64) -> Void = { _, _ in }
  ) throws -> VerifyReport {
    try guarded {
      let projections = core.projections.map(\.projection)
      let scratch = try ScratchArea(projections: projections)
      defer { scratch.close() }
      return try environment.read { txn in
        let head = try core.head(txn)
        var report = VerifyReport(
          head: head, recordsChecked: 0, rowsCompared: 0, problems: [], moreDifferences: false)
        let replayed = rebuild(into: scratch, from: txn, through: head, report: &report, progress: progress)
        for (name, reason) in staleProjections.sorted(by: { $0.key < $1.key }) {
          report.problems.append(.projectionState(projection: name, reason: reason))
        }
        for target in core.projections {
          let state = try core.state(of: target.name, txn)
          if let state, state.version != target.projection.version {
            report.problems.append(
              .projectionState(
                projection: target.name,
                reason: "stored version \(state.version), code version \(target.projection.version)"))
          } else if let state, state.position != head {
            report.problems.append(
              .projectionState(
                projection: target.name, reason: "covers the log up to \(state.position), the head is \(head)"
              ))
          } else if state == nil {
            report.problems.append(
              .projectionState(projection: target.name, reason: "it has no stored state"))
          }
        }
        if replayed == head {
          // Every record the replay met was in order, but inside the compacted range gaps are
          // legal: counting the keys tells whether a damaged branch page hid some.
          let walk = try core.walkKeys(txn)
          let removed = try core.compaction(txn)?.removed ?? 0
          if walk.problem == nil, head >= removed, walk.records != head - removed {
            report.problems.append(.recordCount(found: walk.records, expected: head - removed))
          }
        }
        guard replayed == head else { return report }
        var budget = maxDifferences
        for (stored, rebuilt) in zip(core.projections, scratch.projections) {
          for table in stored.projection.tables {
            guard let storedDB = stored.databases[table], let rebuiltDB = rebuilt.databases[table] else {
              continue
            }
            try compare(
              storedDB, in: txn, with: rebuiltDB, of: scratch.environment, projection: stored.name,
              table: table,
              budget: &budget, report: &report)
          }
        }
        return report
      }
    }
  }

  /// Seeds a scratch area with the store's snapshots when the log was compacted (the events they
  /// cover may be gone), checking each snapshot's version and CRC; returns, for each of the
  /// scratch area's projections, the sequence to replay it from (0 when the log was never
  /// compacted). Snapshots need not share a sequence: a projection rebuilt at open from what a
  /// compacted log holds gets a snapshot at that open's head, the others keep theirs. A snapshot
  /// newer than `until` (time travel to a point before it) is not used: that projection was
  /// rebuilt from what the log holds, so it is replayed from nothing, as that rebuild did.
  func seedFromSnapshots(
    _ scratch: ScratchArea, from txn: Transaction, until: UInt64
  ) throws -> [UInt64] {
    let compacted = try core.compactedThrough(txn)
    guard compacted > 0 else { return scratch.projections.map { _ in 0 } }
    var positions: [UInt64] = []
    for rebuilt in scratch.projections {
      let projection = rebuilt.projection
      guard let snapshot = try core.snapshot(of: projection.name, txn) else {
        throw FerryLogError.snapshotUnusable(
          projection: projection.name, reason: "the log was compacted and it has no snapshot")
      }
      guard snapshot.version == projection.version else {
        throw FerryLogError.snapshotUnusable(
          projection: projection.name,
          reason: "its snapshot is of version \(snapshot.version), the code has version \(projection.version)"
        )
      }
      if snapshot.sequence > until {
        positions.append(0)
        continue
      }
      var sources: [String: Database] = [:]
      for table in projection.tables {
        sources[table] = try environment.database(
          TableNaming.snapshotName(projection: projection.name, table: table))
      }
      let check = try StoreCore.checksum(sources.map { ($0.key, $0.value) }, txn)
      guard check.crc == snapshot.crc, check.rows == snapshot.rows else {
        throw FerryLogError.snapshotUnusable(
          projection: projection.name,
          reason: "its snapshot fails its CRC32C (\(check.rows) rows, \(snapshot.rows) expected)")
      }
      try scratch.environment.write { scratchTxn in
        for (table, source) in sources {
          guard let target = rebuilt.databases[table] else { continue }
          try txn.withCursor(source) { cursor in
            try cursor.scan(from: nil) { key, value in
              try scratchTxn.put(target, key: Array(key), value: Array(value), flags: .append)
              return true
            }
          }
        }
      }
      positions.append(snapshot.sequence)
    }
    return positions
  }

  /// Replays one chunk of the log into the scratch projections furthest behind (`positions`, one
  /// per projection, moved on), after `floor`, the lowest of them, and up to `until`: the
  /// projections behind catch up first and the others join them as they are reached, as
  /// ``prepareProjections(_:environment:chunk:reset:)`` does. Returns the new floor.
  func replayChunk(
    into scratch: ScratchArea, positions: inout [UInt64], floor: UInt64, through until: UInt64,
    from txn: Transaction
  ) throws -> UInt64 {
    let behind = scratch.projections.indices.filter { positions[$0] <= floor }
    let last = try scratch.environment.write { scratchTxn in
      try core.replay(
        after: floor, limit: max(1, configuration.rebuildChunkSize), through: until,
        into: behind.map { scratch.projections[$0] }, targetTxn: scratchTxn, logTxn: txn, batched: true)
    }
    for index in behind { positions[index] = last }
    return positions.min() ?? last
  }

  /// Rebuilds the projections into the scratch area from the snapshots plus the log up to `head`;
  /// records problems; returns the sequence every projection reached.
  private func rebuild(
    into scratch: ScratchArea, from txn: Transaction, through head: UInt64, report: inout VerifyReport,
    progress: (UInt64, UInt64) -> Void
  )
    -> UInt64
  {
    var positions: [UInt64]
    var position: UInt64 = 0
    do {
      positions = try seedFromSnapshots(scratch, from: txn, until: head)
      position = positions.min() ?? 0
      // The records the snapshots cover are not replayed, but every one still there is checked.
      if position > 0 {
        try txn.withCursor(core.events) { cursor in
          try cursor.scan(from: nil) { key, value in
            guard let sequence = UInt64(bigEndianBytes: key), sequence <= position else { return false }
            _ = try core.decode(value, sequence: sequence)
            report.recordsChecked += 1
            return true
          }
        }
      }
    } catch let error as FerryLogError {
      switch error {
      case .corruptRecord(let sequence, let reason):
        report.problems.append(.unreadableRecord(sequence: sequence, reason: reason))
      default: report.problems.append(.projectionState(projection: "(snapshot)", reason: error.description))
      }
      return 0
    } catch {
      report.problems.append(.projectionState(projection: "(snapshot)", reason: "\(error)"))
      return 0
    }
    while position < head {
      do {
        let last = try replayChunk(
          into: scratch, positions: &positions, floor: position, through: head, from: txn)
        report.recordsChecked += Int(last - position)
        position = last
        progress(position, head)
      } catch let error as FerryLogError {
        switch error {
        case .corruptRecord(let sequence, let reason):
          report.problems.append(.unreadableRecord(sequence: sequence, reason: reason))
        case .unsupportedRecordFormat(let sequence, _, _), .unknownEventType(_, let sequence?),
          .unsupportedSchemaVersion(_, _, _, let sequence?):
          report.problems.append(.unreadableByThisVersion(sequence: sequence, reason: error.description))
        case .sequenceGap(let expected, let found):
          report.problems.append(.sequenceGap(expected: expected, found: found))
        case .projectionFailed(let projection, let sequence, let underlying):
          report.problems.append(
            .projectionFailed(projection: projection, sequence: sequence, reason: "\(underlying)"))
        default:
          report.problems.append(.unreadableRecord(sequence: position + 1, reason: error.description))
        }
        // The failing chunk was rolled back; everything before the named record was read and checked.
        if let sequence = report.problems.last?.sequence, sequence > position {
          report.recordsChecked += Int(sequence - position - 1)
        }
        return position
      } catch {
        report.problems.append(.unreadableRecord(sequence: position + 1, reason: "\(error)"))
        return position
      }
    }
    return position
  }

  private func compare(
    _ storedDB: Database, in txn: Transaction, with rebuiltDB: Database, of scratch: Environment,
    projection: String,
    table: String, budget: inout Int, report: inout VerifyReport
  ) throws {
    try txn.withCursor(storedDB) { storedCursor in
      try scratch.read { scratchTxn in
        try scratchTxn.withCursor(rebuiltDB) { rebuiltCursor in
          var stored = try storedCursor.first()
          var rebuilt = try rebuiltCursor.first()
          while stored != nil || rebuilt != nil {
            report.rowsCompared += 1
            var difference: VerifyReport.Problem?
            if let s = stored, let r = rebuilt, s.key == r.key {
              if s.value != r.value {
                difference = .rowDiffers(
                  projection: projection, table: table, key: s.key, stored: s.value, rebuilt: r.value)
              }
              stored = try storedCursor.next()
              rebuilt = try rebuiltCursor.next()
            } else if let s = stored, rebuilt == nil || s.key.lexicographicallyPrecedes(rebuilt?.key ?? []) {
              difference = .rowDiffers(
                projection: projection, table: table, key: s.key, stored: s.value, rebuilt: nil)
              stored = try storedCursor.next()
            } else if let r = rebuilt {
              difference = .rowDiffers(
                projection: projection, table: table, key: r.key, stored: nil, rebuilt: r.value)
              rebuilt = try rebuiltCursor.next()
            }
            if let difference {
              if budget > 0 {
                report.problems.append(difference)
                budget -= 1
              } else {
                report.moreDifferences = true
                return
              }
            }
          }
        }
      }
    }
  }

  /// Rebuilds every projection from the log up to `sequence` (the head when nil) in a scratch
  /// area and reads the result: the state as it was then. The store itself is not touched.
  /// `progress` is called with the sequence the rebuild has reached and the target after each
  /// chunk (``Configuration/rebuildChunkSize`` events), for a progress bar.
  public func withProjections<R>(
    asOf sequence: UInt64?, progress: (_ reached: UInt64, _ until: UInt64) -> Void = { _, _ in },
    _ body: (LogView) throws -> R
  ) throws -> R {
    try guarded {
      // Every configured projection, stale ones included: a scratch rebuild needs none of the store's rows.
      let projections = configuration.projections + (configuration.idempotentAppends ? [EventIDIndex()] : [])
      let scratch = try ScratchArea(projections: projections)
      defer { scratch.close() }
      let until = try environment.read { txn -> UInt64 in
        let head = try core.head(txn)
        let until = min(sequence ?? head, head)
        let compacted = try core.compactedThrough(txn)
        if until < compacted { throw FerryLogError.historyCompacted(through: compacted) }
        var positions = try seedFromSnapshots(scratch, from: txn, until: until)
        var position = positions.min() ?? 0
        while position < until {
          position = try replayChunk(
            into: scratch, positions: &positions, floor: position, through: until, from: txn)
          progress(position, until)
        }
        return until
      }
      let scratchCore = StoreCore(
        events: core.events, meta: core.meta, projections: scratch.projections, eventIndex: nil,
        catalog: core.catalog)
      return try scratch.environment.read { txn in
        try body(
          LogView(core: scratchCore, transaction: txn, stale: [:], fixedHead: until, checksState: false))
      }
    }
  }
}

/// What a compaction did.
public struct CompactionReport: Sendable, Equatable {
  /// The sequence the snapshot covers: every event at or below it was considered.
  public var snapshotSequence: UInt64
  /// Events removed now.
  public var removed: Int
  /// Bytes of records removed now.
  public var removedBytes: Int
  /// Events left in the log.
  public var remaining: Int
  /// Rows in the snapshot, over every projection.
  public var snapshotRows: UInt64
  /// The projections that kept this compaction from removing anything: stored at another version
  /// than this code's, or not configured here, and behind the head (`Specs/compaction.md`). Empty
  /// when nothing held it back. While one stays there — a projection a later version of the app
  /// dropped, say — the log is never compacted.
  public var heldBackBy: [String] = []

  /// A report with these figures.
  public init(
    snapshotSequence: UInt64, removed: Int, removedBytes: Int, remaining: Int, snapshotRows: UInt64,
    heldBackBy: [String] = []
  ) {
    self.snapshotSequence = snapshotSequence
    self.removed = removed
    self.removedBytes = removedBytes
    self.remaining = remaining
    self.snapshotRows = snapshotRows
    self.heldBackBy = heldBackBy
  }
}

extension EventLog {
  /// Takes a snapshot of every projection at the head and removes the events `isRemovable`
  /// accepts among those it covers — all in one transaction, so a crash leaves the store before or
  /// after the compaction, never between. Rebuilds, verify and time travel then start from the
  /// snapshot and replay only what follows.
  ///
  /// `isRemovable` is called once for every event the snapshot covers, newest first (so it can keep
  /// the newest of a kind by remembering what it has seen). It must only accept events no
  /// projection needs past the snapshot (the domain
  /// knows which: Ferry's retention policy removes finished tasks and old fetches).
  ///
  /// `progress` is called on the writer's thread with the events read so far and the head, every
  /// 10,000 events, for a progress bar.
  public func compact(
    removing isRemovable: @escaping @Sendable (LoggedEvent) -> Bool,
    progress: @escaping @Sendable (_ read: UInt64, _ head: UInt64) -> Void = { _, _ in }
  ) async throws -> CompactionReport {
    guard let writer else {
      throw FerryLogError.permissionDenied(path: path, detail: "the store is open read-only")
    }
    let core = self.core
    let environment = self.environment
    let segment = self.segment
    let chunk = configuration.rebuildChunkSize
    return try await withCheckedThrowingContinuation { continuation in
      let accepted = writer.submit(
        .exclusive {
          do {
            let report = try environment.write { txn -> CompactionReport in
              let head = try core.head(txn)
              // Another process may have reset a projection (a rebuild starting from its
              // snapshot) or left it behind since the caller last read: fold it up to the head in
              // this transaction, so that the snapshot covers it and nothing it still needs is
              // removed (a projection at another version is left alone, and gets no snapshot).
              // In chunks, as a rebuild does: each chunk's overlay is written out before the
              // next, so memory follows the chunk, not the whole range left behind.
              while try core.foldFurthestBehind(limit: chunk, txn) > 0 {}
              let rows = try core.writeSnapshots(of: core.projections, txn)
              // A projection left without one at this head (stored at another version) loses the
              // older one it had: the events removed below may be ones it needs past it.
              try core.dropSnapshots(olderThan: head, txn)
              // A projection stored at another version — or one this process does not configure
              // at all (another version of the app added it) — and behind the head is folded by its
              // own code from its position on: removing events past it would go unseen there (an
              // unset gone, its key set for ever). Nothing goes. Every stored state is looked at.
              let heldBackBy = try core.projectionsOfOtherCodeBehind(head, txn)
              let othersBehind = !heldBackBy.isEmpty
              // Newest first: a predicate that keeps "the newest of each kind" learns it from the
              // first one it meets, so one pass over the log decides everything.
              var doomed: [(UInt64, Int)] = []
              var read: UInt64 = 0
              try txn.withCursor(core.events) { cursor in
                var entry = try cursor.last()  // the head's record (nothing is appended during this job)
                while let (key, value) = entry {
                  guard let sequence = UInt64(bigEndianBytes: key) else {
                    throw FerryLogError.corruptRecord(
                      sequence: 0, reason: "a key of the log has \(key.count) bytes, not 8")
                  }
                  let event = try value.withUnsafeBytes { try core.decode($0, sequence: sequence) }
                  if isRemovable(event) && !othersBehind { doomed.append((sequence, value.count)) }
                  read += 1
                  if read % 10_000 == 0 { progress(read, head) }
                  entry = try cursor.previous()
                }
              }
              for (sequence, _) in doomed { try txn.delete(core.events, key: sequence.bigEndianBytes) }
              let before = try core.compaction(txn)?.removed ?? 0
              try txn.put(
                core.meta, key: MetaKey.compaction,
                value: CompactionState(through: head, removed: before + UInt64(doomed.count)).bytes)
              CrashPoint.reach(CrashPoint.compaction)
              let tail = try txn.statistics(core.events).entries
              return CompactionReport(
                snapshotSequence: head, removed: doomed.count, removedBytes: doomed.reduce(0) { $0 + $1.1 },
                remaining: tail, snapshotRows: rows, heldBackBy: heldBackBy)
            }
            // With a write-ahead segment the compaction's commit was not flushed: a checkpoint does.
            try segment?.checkpointNow(environment: environment, core: core)
            continuation.resume(returning: report)
          } catch {
            continuation.resume(throwing: FerryLogError.wrap(error, path: environment.path))
          }
        })
      if !accepted { continuation.resume(throwing: self.unavailable) }
    }
  }

  /// The newest compaction point and how many events compaction has removed in all (nil when never).
  public func compactionState() throws -> (through: UInt64, removed: UInt64)? {
    try guarded { try environment.read { txn in try core.compaction(txn).map { ($0.through, $0.removed) } } }
  }
}
