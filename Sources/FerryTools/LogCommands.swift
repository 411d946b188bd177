@_spi(Engine) import Ferry
import FerryLog
import Foundation

/// Which events `ferry log` shows.
package struct LogFilter: Sendable {
  /// First sequence shown.
  package var from: UInt64 = 1
  /// Last sequence shown (the head when nil).
  package var to: UInt64?
  /// Only this event type.
  package var type: String?
  /// Only events about this task.
  package var task: TaskID?
  /// Only events about this cache key.
  package var key: String?
  /// Only events appended at or after this time (Unix ms; `--since`).
  package var since: Int64?

  /// Shows every event.
  package init() {}

  func accepts(_ event: LoggedEvent, _ summary: EventSummary) -> Bool {
    if let type, event.type != type { return false }
    if let task, summary.taskId != task { return false }
    if let key, summary.key != key && !summary.staleKeys.contains(key) { return false }
    if let since, event.timestamp < since { return false }
    return true
  }
}

/// One event as `ferry log --json` prints it.
struct LogLine: Codable {
  var seq: UInt64
  var type: String
  var schemaVersion: UInt16
  var timestamp: Int64
  var time: String
  var id: String
  var taskId: TaskID?
  var key: String?
  var text: String
  var payloadJSON: JSONValue?
  var replaces: TaskID?
}

/// `ferry log`: the events, decoded. With `follow`, waits for new events (polling, since the
/// writer is another process) until the task is cancelled.
package func printLog(
  path: String, filter: LogFilter, json: Bool, follow: Bool, pollInterval: Duration = .milliseconds(250),
  output: Output
) async throws(ToolError) {
  let store = try openForReading(path)
  defer { store.close() }
  var replacement = ReplacementTracker(task: filter.task)
  func show(_ event: LoggedEvent) {
    let summary = EventSummary(event)
    let replaces = replacement.replaced(by: event)
    guard filter.accepts(event, summary) || replaces != nil else { return }
    let note = replaces.map { " (replaces task \($0), which leaves the queue)" } ?? ""
    if json {
      output.line(
        jsonLine(
          LogLine(
            seq: event.sequence, type: event.type, schemaVersion: event.schemaVersion,
            timestamp: event.timestamp,
            time: isoTime(event.timestamp), id: event.id.description, taskId: summary.taskId,
            key: summary.key,
            text: summary.text + note, payloadJSON: payloadJSON(event), replaces: replaces)))
    } else {
      output.line("\(column("\(event.sequence)", 8))\(isoTime(event.timestamp))  \(summary.text)\(note)")
    }
  }
  do {
    if follow {
      for try await event in store.log.tail(
        after: filter.from > 0 ? filter.from - 1 : 0, pollInterval: pollInterval)
      {
        if let to = filter.to, event.sequence > to { break }
        show(event)
      }
    } else {
      try store.log.forEachEvent(from: filter.from, through: filter.to, chunkSize: 2000) { show($0) }
    }
  } catch {
    throw ToolError.from(error)
  }
}

/// The stable JSON form of `ferry verify --json`.
package struct VerifyJSON: Codable, Sendable, Equatable {
  /// Whether nothing is wrong.
  package var healthy: Bool
  /// The log's head sequence.
  package var head: UInt64
  /// Records whose CRC, sequence and decoding were checked.
  package var recordsChecked: Int
  /// Projection rows compared with a rebuild.
  package var rowsCompared: Int
  /// Stale reader slots of dead processes cleared while opening.
  package var staleReadersCleared: Int
  /// The first bad sequence number, if a problem names one.
  package var firstBadSequence: UInt64?
  /// Each problem, one line each.
  package var problems: [String]
  /// Whether more differing rows were found than are listed.
  package var moreDifferences: Bool
}

/// `ferry verify`: every record, contiguity, projections against a rebuild, stale readers.
/// Returns whether the store is healthy. With `json`, prints one ``VerifyJSON`` object.
package func verify(path: String, json: Bool = false, output: Output) throws(ToolError) -> Bool {
  let output = json ? output.withoutProgress : output
  let store = try openForReading(path)
  defer { store.close() }
  do {
    let head = try store.log.head()
    output.progress("verify", 0, Int(head))
    let report = try store.log.verify { reached, head in
      // The bar is completed once, below.
      if reached < head { output.progress("verify", Int(clamping: reached), Int(clamping: head)) }
    }
    output.progress("verify", Int(head), Int(head))
    let first = report.problems.compactMap(\.sequence).first
    if json {
      output.line(
        jsonLine(
          VerifyJSON(
            healthy: report.isHealthy, head: report.head, recordsChecked: Int(report.recordsChecked),
            rowsCompared: Int(report.rowsCompared),
            staleReadersCleared: Int(store.log.environmentStaleReadersCleared),
            firstBadSequence: first, problems: report.problems.map { "\($0)" },
            moreDifferences: report.moreDifferences)))
      if report.isHealthy { return true }
      try throwIfDamaged(report, path: path)
      return false
    }
    output.line(
      "verified \(report.recordsChecked) of \(report.head) records (CRC32C, sequence, decoding), "
        + "\(report.rowsCompared) projection rows compared with a rebuild")
    if store.log.environmentStaleReadersCleared > 0 {
      output.line(
        "cleared \(plural(Int(store.log.environmentStaleReadersCleared), "stale reader slot")) left by dead processes"
      )
    }
    if report.isHealthy {
      output.line("ok: no problems")
      return true
    }
    if let first {
      output.line("first bad sequence number: \(first)")
    }
    for problem in report.problems { output.line("problem: \(problem)") }
    if report.moreDifferences { output.line("(more differing rows not listed)") }
    try throwIfDamaged(report, path: path)
    return false
  } catch {
    throw ToolError.from(error)
  }
}

/// `ferry replay`: with `until`, the state as of that sequence, rebuilt from the log in a scratch
/// area; without, the rebuild compared with the stored projections. Returns false when they differ.
package func replay(
  path: String, until: UInt64?, json: Bool, maxAgeMs: Int64, output: Output
) throws(ToolError)
  -> Bool
{
  let store = try openForReading(path)
  defer { store.close() }
  do {
    if let until {
      let head = try store.log.head()
      guard until <= head else {
        throw ToolError(.badInput, "--until \(until) is past the log's head \(head)")
      }
      let shown = json ? output.withoutProgress : output
      shown.progress("replay", 0, Int(clamping: until))
      let snapshot = try store.log.withProjections(
        asOf: until,
        progress: { reached, until in shown.progress("replay", Int(clamping: reached), Int(clamping: until)) }
      ) { try FerryStore.snapshot(of: $0) }
      let at = try store.log.event(at: until)?.timestamp ?? wallClockMilliseconds()
      let report = InspectReport(snapshot, now: at, maxAgeMs: maxAgeMs)
      if json {
        output.line(jsonLine(report))
      } else {
        output.line(
          "state as of sequence \(until) of \(head) (rebuilt from the log; ages as of \(isoTime(at)))")
        report.lines().forEach(output.line)
      }
      return true
    }
    let shown = json ? output.withoutProgress : output
    let head = try store.log.head()
    shown.progress("replay", 0, Int(clamping: head))
    let report = try store.log.verify(
      maxDifferences: 50,
      progress: { reached, head in shown.progress("replay", Int(clamping: reached), Int(clamping: head)) })
    shown.progress("replay", Int(clamping: head), Int(clamping: head))
    let differences = report.problems.filter {
      if case .rowDiffers = $0 { return true }
      return false
    }
    if json {
      output.line(
        jsonLine(
          ["head": "\(report.head)", "equal": "\(report.isHealthy)", "problems": "\(report.problems.count)"]))
    } else {
      output.line("rebuilt \(report.recordsChecked) events and compared \(report.rowsCompared) rows")
    }
    if report.isHealthy {
      if !json { output.line("stored projections equal the rebuild") }
      return true
    }
    if !json {
      output.line("stored projections differ from the rebuild (\(differences.count) rows):")
      for problem in report.problems { output.line("  \(problem)") }
    }
    try throwIfDamaged(report, path: path)
    return false
  } catch {
    throw ToolError.from(error)
  }
}

/// A log that is itself damaged (an unreadable record, a missing sequence) is exit 6, like every
/// other command that meets it; projections that only differ from the log stay exit 1.
private func throwIfDamaged(_ report: VerifyReport, path: String) throws(ToolError) {
  guard let damage = report.problems.first(where: \.isDamage) else {
    if let newer = report.problems.first(where: {
      if case .unreadableByThisVersion = $0 { return true }
      return false
    }) {
      throw ToolError(
        .newerFormat,
        "\(newer) — written by a newer Ferry or by another application through FerryLog (its CRC holds: this is not damage); read it with the code that wrote it"
      )
    }
    return
  }
  throw ToolError(
    .corruptRecord,
    "the log of \(path) is damaged: \(damage); `ferry salvage \(path) NEW_DIR` recovers what is left")
}

/// The first line of an export.
struct ExportHeader: Codable {
  var format = "ferry-export"
  var version = 1
  var storeFormat = EventLog.storeFormatVersion
  var events: UInt64
}

/// One event of an export: everything its record holds, the payload in base64 — the exact bytes
/// `ferry import` reads back — and, for a queue event that carries the app's payload as UTF-8 JSON
/// (`task.added`, `task.payloadUpdated`), that payload decoded in `payloadJSON`, to read and grep
/// (import ignores it).
struct ExportedEvent: Codable {
  var seq: UInt64
  var type: String
  var schemaVersion: UInt16
  var timestamp: Int64
  var id: String
  var payload: String
  var payloadJSON: JSONValue?
}

/// `ferry export`: the log as JSON Lines (a header, then one event per line).
package func export(path: String, output: Output) throws(ToolError) {
  let store = try openForReading(path)
  defer { store.close() }
  do {
    let head = try store.log.head()
    output.line(jsonLine(ExportHeader(events: head)))
    var done = 0
    // The raw records, not upcast: an export is the log as stored.
    try store.log.forEachRecord(chunkSize: 2000) { event in
      output.line(
        jsonLine(
          ExportedEvent(
            seq: event.sequence, type: event.type, schemaVersion: event.storedSchemaVersion,
            timestamp: event.timestamp, id: event.id.hex, payload: Data(event.payload).base64EncodedString(),
            payloadJSON: payloadJSON(event)))
      )
      done += 1
      if done % 1000 == 0 { output.progress("export", done, Int(head)) }
    }
    output.progress("export", Int(head), Int(head))
  } catch {
    throw ToolError.from(error)
  }
}

/// `ferry import`: an export into a new store at `path`, which must be missing or an empty
/// directory. The store gets the same events under the same sequence numbers, ids and timestamps.
/// Returns how many were imported.
///
/// Exclusive and all-or-nothing: the store is built in a temporary directory beside the target and
/// renamed onto it once complete and flushed, so no other process ever writes to it alongside the
/// import. The rename fails, leaving everything there as it is, when another process created a store
/// at the target meanwhile. A killed import leaves only its temporary directory, which the next
/// import into the same target removes.
package func importLog(
  path: String, lines: some Sequence<String>, output: Output
) async throws(ToolError) -> Int {
  let target = try ImportTarget(path)
  try target.refuseUnlessEmpty()
  var iterator = lines.makeIterator()
  guard let first = iterator.next(),
    let header = try? JSONDecoder().decode(ExportHeader.self, from: Data(first.utf8)),
    header.format == "ferry-export"
  else {
    throw ToolError(.badInput, "the input does not start with a ferry export header")
  }
  guard header.version == 1 else {
    throw ToolError(.badInput, "export version \(header.version) is newer than this ferry reads (1)")
  }
  return try await target.build(output: output) { directory throws(ToolError) in
    try await importEvents(into: directory, header: header, lines: &iterator, output: output)
  }
}

/// Appends the exported events after the header into a new store at `directory`, and closes it.
private func importEvents(
  into directory: String, header: ExportHeader, lines iterator: inout some IteratorProtocol<String>,
  output: Output
) async throws(ToolError) -> Int {
  do {
    let store = try await FerryStore.open(at: directory)
    defer { store.close() }
    var batch: [NewEvent] = []
    var expected: UInt64 = 1
    var imported = 0
    var lineNumber = 1
    func flush() async throws {
      if batch.isEmpty { return }
      let sequences = try await store.log.append(batch)
      guard sequences.last == expected - 1 else {
        throw ToolError(
          .badInput,
          "imported events landed at sequences \(sequences.first ?? 0)… instead of the exported ones")
      }
      imported += batch.count
      batch.removeAll(keepingCapacity: true)
      output.progress("import", imported, Int(header.events))
    }
    while let line = iterator.next() {
      lineNumber += 1
      if line.isEmpty { continue }
      guard let event = try? JSONDecoder().decode(ExportedEvent.self, from: Data(line.utf8)),
        let id = EventID(hex: event.id), let payload = Data(base64Encoded: event.payload)
      else {
        throw ToolError(.badInput, "line \(lineNumber) is not an exported event")
      }
      guard event.seq == expected else {
        // Sequences only skip where a compaction removed events: such an export is the log that
        // was left, without the snapshot that stands for what went, and cannot make a store.
        let why =
          event.seq > expected
          ? ": the store it was exported from was compacted (events \(expected)–\(event.seq - 1) were removed), "
            + "and an import takes a whole log only; move a compacted store by copying its directory while it is closed"
          : ""
        throw ToolError(.badInput, "line \(lineNumber) has sequence \(event.seq), expected \(expected)\(why)")
      }
      batch.append(
        NewEvent(
          type: event.type, schemaVersion: event.schemaVersion, payload: [UInt8](payload), id: id,
          timestamp: event.timestamp))
      expected += 1
      if batch.count == 2000 { try await flush() }
    }
    try await flush()
    guard UInt64(imported) == header.events else {
      throw ToolError(.badInput, "the header promised \(header.events) events, the input held \(imported)")
    }
    // Runs under way where the export was made belong to processes of that store, never of this
    // new one: they are interrupted here, so their tasks run again instead of waiting for owners
    // that cannot finish them.
    let interrupted = try await store.queue.interruptEveryRun()
    if !interrupted.isEmpty {
      output.line(
        "interrupted \(plural(interrupted.count, "run")) that \(interrupted.count == 1 ? "was" : "were") under way in the exported store"
      )
    }
    return imported
  } catch let error as ToolError {
    throw error
  } catch {
    throw ToolError.from(error)
  }
}

/// The stable JSON form of `ferry stats --json`.
package struct StatsJSON: Codable, Sendable, Equatable {
  /// One event at an end of the log.
  package struct End: Codable, Sendable, Equatable {
    /// Its sequence number.
    package var seq: UInt64
    /// Its type.
    package var type: String
    /// When it was appended (Unix ms).
    package var timestamp: Int64
    /// The same, as UTC ISO 8601.
    package var time: String
  }
  /// The events the log holds (fewer than `head` after a compaction).
  package var events: Int
  /// The head sequence number.
  package var head: UInt64
  /// Events by type.
  package var types: [String: Int]
  /// The last sequence a compaction removed events through, if any.
  package var compactedThrough: UInt64?
  /// Events compactions removed in all.
  package var compactedRemoved: UInt64?
  /// The size of `data.mdb`.
  package var dataFileBytes: Int
  /// LMDB's map size.
  package var mapBytes: Int
  /// Bytes of the map in use.
  package var usedBytes: Int
  /// The oldest event held.
  package var oldest: End?
  /// The newest event.
  package var newest: End?
}

/// `ferry stats`: counts by event type, file and map sizes, oldest and newest event. With
/// `json`, one ``StatsJSON`` object.
package func stats(path: String, json: Bool = false, output: Output) throws(ToolError) {
  let output = json ? output.withoutProgress : output
  let store = try openForReading(path)
  defer { store.close() }
  do {
    let head = try store.log.head()
    let compaction = try store.log.compactionState()
    var counts: [String: Int] = [:]
    var done = 0
    var oldest: LoggedEvent?
    var newest: LoggedEvent?
    output.progress("stats", 0, Int(head))
    try store.log.forEachRecord(chunkSize: 5000) { event in
      counts[event.type, default: 0] += 1
      done += 1
      if oldest == nil { oldest = event }
      newest = event
      if done % 5000 == 0 { output.progress("stats", done, Int(head)) }
    }
    output.progress("stats", Int(head), Int(head))
    let info = try store.log.storageInfo()
    let fileSize =
      (try? FileManager.default.attributesOfItem(atPath: path + "/data.mdb")[.size] as? NSNumber)?.intValue
      ?? 0
    if json {
      func end(_ event: LoggedEvent?) -> StatsJSON.End? {
        event.map {
          StatsJSON.End(seq: $0.sequence, type: $0.type, timestamp: $0.timestamp, time: isoTime($0.timestamp))
        }
      }
      output.line(
        jsonLine(
          StatsJSON(
            events: done, head: head, types: counts, compactedThrough: compaction.map { UInt64($0.through) },
            compactedRemoved: compaction.map { UInt64($0.removed) }, dataFileBytes: fileSize,
            mapBytes: Int(info.mapSize), usedBytes: Int(info.usedBytes), oldest: end(oldest),
            newest: end(newest))))
      return
    }
    // The events the log holds: after a compaction, fewer than the head's sequence number.
    output.line("events: \(done)" + (done == Int(head) ? "" : " (head \(head))"))
    for (type, count) in counts.sorted(by: { $0.key < $1.key }) {
      output.line("  \(column(type, 24))\(count)")
    }
    if let compaction {
      output.line("compacted through \(compaction.through): \(compaction.removed) events removed in all")
    }
    output.line("data file: \(fileSize) bytes")
    output.line(
      "map: \(info.mapSize) bytes, \(info.usedBytes) used (\(info.mapSize > 0 ? info.usedBytes * 100 / info.mapSize : 0)%)"
    )
    if let oldest, let newest {
      output.line("oldest event: \(oldest.sequence) at \(isoTime(oldest.timestamp)) (\(oldest.type))")
      output.line("newest event: \(newest.sequence) at \(isoTime(newest.timestamp)) (\(newest.type))")
    }
  } catch {
    throw ToolError.from(error)
  }
}

/// The stable JSON form of `ferry import --json`: `{"imported": N, "store": "DIR"}`.
package struct ImportJSON: Codable, Sendable, Equatable {
  /// Events imported.
  package var imported: Int
  /// The new store's directory.
  package var store: String
}

/// The line `ferry import --json` prints once the import is done.
package func importedJSON(count: Int, store: String) -> String {
  jsonLine(ImportJSON(imported: count, store: store))
}

/// For `ferry log --task N`: notices the `task.added` with `unique: .replace` that replaced task N
/// (same tag and data id, while N was queued and had no run under way), which logs no event of N's
/// own.
struct ReplacementTracker {
  let task: TaskID?
  private var identity: (tag: String, dataId: String)?
  private var running = false

  init(task: TaskID?) { self.task = task }

  /// The task `event` replaces, when it is the one followed.
  mutating func replaced(by event: LoggedEvent) -> TaskID? {
    guard let task, event.type.hasPrefix("task.") || event.type.hasPrefix("queue."),
      let decoded = try? TaskEvent(event)
    else { return nil }
    switch decoded {
    case .added(let tag, _, let dataId, _, _, let unique, _, _, _):
      if event.sequence == task.rawValue, let dataId { identity = (tag, dataId) }
      // By bytes, as the queue's unique index compares them (see TaskQueue.history(of:)).
      if event.sequence != task.rawValue, unique == .replace, !running, let identity,
        identity.tag.utf8.elementsEqual(tag.utf8), let dataId, identity.dataId.utf8.elementsEqual(dataId.utf8)
      {
        self.identity = nil
        return task
      }
    case .runStarted(let id, _, _, _, _) where id == task: running = true
    case .runFailed(let id, _, _, _) where id == task, .runInterrupted(let id) where id == task:
      running = false
    case .errorRecorded(let id, _, let endsRun) where id == task && endsRun: running = false
    case .runSucceeded(let id, _) where id == task, .cancelled(let id) where id == task,
      .expired(let id) where id == task:
      identity = nil
    case .cleared: identity = nil
    default: break
    }
    return nil
  }
}
