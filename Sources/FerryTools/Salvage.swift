@_spi(Engine) import Ferry
import FerryLog
import Foundation
import LMDB
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

// `ferry salvage DIR OUT` (Specs/salvage.md): a new, verified store from the valid records a damaged
// data file still holds. The data file is read raw, page by page (RawPages.swift); LMDB's live tree
// is read in a child process (`ferry salvage --tree-dump`), so that damage that crashes LMDB only
// ends the child.

/// What `ferry salvage` did, for people (``lines()``) and programs (`--json`, stable keys).
package struct SalvageReport: Codable, Sendable, Equatable {
  /// The data file read.
  package var source: String
  /// The new store's directory (absolute).
  package var output: String
  /// The data file's size.
  package var fileBytes: Int
  /// The page size scanned with.
  package var pageSize: Int
  /// Where it came from: "meta pages" (both agree), "meta page 0", "meta page 1", or "guessed".
  package var pageSizeSource: String
  /// Whether no meta page named it (then the size that yielded the most records was taken).
  package var pageSizeGuessed: Bool
  /// Pages read by the raw scan.
  package var pagesScanned: Int
  /// Valid record copies the raw scan found (old copies in freed pages count too).
  package var recordsFound: Int
  /// Distinct sequences among them.
  package var sequencesFound: Int
  /// How reading LMDB's live tree went.
  package var liveTree: String
  /// Whether the live tree was read in full.
  package var liveTreeRead: Bool
  /// Events written to the new store with their original fields.
  package var recovered: Int
  /// Of them, taken from the live tree.
  package var recoveredFromTree: Int
  /// Of them, found only by the raw scan.
  package var recoveredFromScan: Int
  /// Of them, taken from the write-ahead segment's frames past its checkpoint (not in the live tree):
  /// commits acknowledged after one flush of the segment whose data-file pages never reached the disk.
  package var recoveredFromSegment: Int = 0
  /// What the write-ahead segment held: "none" (the store has none), what was read from it, or why
  /// it could not be read (then the salvage is incomplete).
  package var segment: String = "none"
  /// Sequences for which two different valid records were found.
  package var conflicting: Int
  /// Of them, those the live tree could not decide (the first record found was kept).
  package var conflictingUnresolved: Int
  /// Sequences lost: nothing valid was found for them. Each is a `ferry.lost` marker in the new log.
  package var lost: Int
  /// The first lost ranges, e.g. "120-130", "500".
  package var lostRanges: [String]
  /// Sequences at or below the compaction point that the live tree could not be read for: removed by
  /// compaction or lost, nobody can tell. Nothing is restored there (an old copy could bring back a
  /// finished task's partial history); they stay gaps, as compaction leaves them.
  package var uncertain: Int
  /// The first uncertain ranges.
  package var uncertainRanges: [String]
  /// The compaction point (nil when the store was never compacted, as far as could be read).
  package var compactedThrough: UInt64?
  /// Where it was read: "live tree" or "raw scan".
  package var compactionSource: String?
  /// Sequences at or below the compaction point that the live tree says were removed: gaps again.
  package var removedByCompaction: Int
  /// Of them, how many the raw scan found old copies of (in freed pages), left out.
  package var notResurrected: Int
  /// Values found but not believed: sequences far beyond everything else (a damaged key or meta row).
  package var ignored: [String]
  /// Records found past both the live tree's head and the head mark when the tree read in full:
  /// written by a commit that never completed (so never acknowledged), left out.
  package var unacknowledged: Int = 0
  /// The highest sequence the new log holds: the highest seen in the live tree, the records, or the
  /// `meta` rows that remember the log's head.
  package var highestSequence: UInt64
  /// `ferry.lost` markers the new log holds.
  package var markers: Int
  /// Runs under way in the damaged store, interrupted in the new one (one `task.runInterrupted` each,
  /// logged after ``highestSequence``).
  package var interruptedRuns: Int
  /// Whether the store has a write-ahead segment that could not be read in full: acknowledged
  /// events it held may be missing (counted as lost up to the head mark, when it names them).
  package var segmentUnread: Bool = false
  /// Whether every sequence up to ``highestSequence`` was recovered (nothing lost, uncertain or
  /// decided without the live tree, and the write-ahead segment, if any, read).
  package var complete: Bool

  /// The report for people.
  package func lines() -> [String] {
    var lines: [String] = []
    let sizeNote =
      pageSizeGuessed
      ? "guessed: no meta page names it, this size yields the most records" : "from \(pageSizeSource)"
    lines.append(
      "read \(source): \(fileBytes) bytes, \(pagesScanned) pages of \(pageSize) bytes (page size \(sizeNote))"
    )
    lines.append("raw scan: \(recordsFound) valid record copies of \(sequencesFound) sequences")
    if unacknowledged > 0 {
      lines.append(
        "left out \(unacknowledged) records past the log's acknowledged end (a commit that never completed)")
    }
    lines.append("live tree: \(liveTree)")
    if segment != "none" { lines.append("write-ahead segment (ferry-segment): \(segment)") }
    if let compactedThrough {
      lines.append(
        "compacted through \(compactedThrough) (read from the \(compactionSource ?? "store")): "
          + "\(removedByCompaction) removed sequences stay gaps, \(notResurrected) old copies of them not restored"
      )
    }
    lines.append(
      "recovered \(recovered) of \(highestSequence) events: \(recoveredFromTree) from the live tree, "
        + "\(recoveredFromScan) from the raw scan only"
        + (recoveredFromSegment > 0 ? ", \(recoveredFromSegment) from the write-ahead segment" : ""))
    if conflicting > 0 {
      lines.append(
        "conflicting: \(conflicting) sequences held by two different valid records ("
          + "\(conflicting - conflictingUnresolved) decided by the live tree, "
          + "\(conflictingUnresolved) undecided: the first found was kept)")
    }
    lines.append(lost == 0 ? "lost: none" : "lost \(lost): \(rangeList(lostRanges))")
    if uncertain > 0 {
      lines.append(
        "uncertain \(uncertain) (at or below the compaction point: removed by compaction or lost; "
          + "nothing restored there): \(rangeList(uncertainRanges))")
    }
    for value in ignored { lines.append("ignored: \(value)") }
    if interruptedRuns > 0 {
      lines.append(
        "interrupted \(interruptedRuns) runs that were under way (logged after sequence \(highestSequence))")
    }
    lines.append(
      "wrote \(output): \(highestSequence) sequences, \(markers) of them ferry.lost markers; verified healthy"
    )
    lines.append(
      complete
        ? "complete: every event up to sequence \(highestSequence) was recovered"
        : "incomplete: \(lost) lost, \(uncertain) uncertain, \(conflictingUnresolved) undecided"
          + (segmentUnread ? "; the write-ahead segment (ferry-segment) was not read in full" : ""))
    return lines
  }

  private func rangeList(_ ranges: [String]) -> String {
    ranges.count < SalvageReport.rangesListed
      ? ranges.joined(separator: ", ") : ranges.joined(separator: ", ") + ", …"
  }

  /// How many ranges a report lists.
  static let rangesListed = 20
}

/// `ferry salvage`: builds a new store at `target` (missing or empty) from the valid records the data
/// file at `source` still holds, and prints the report (`json`: one JSON object). `treeReader` is the
/// `ferry` executable, run as `ferry salvage --tree-dump` to read LMDB's live tree in a child
/// process; nil reads the raw pages alone. Returns ``ExitStatus/ok`` when everything was recovered,
/// ``ExitStatus/problemsFound`` otherwise.
package func runSalvage(
  source: String, target: String, json: Bool, treeReader: URL?, output: Output
) async throws(ToolError) -> ExitStatus {
  let report = try await salvage(
    source: source, target: target, treeReader: treeReader,
    output: json ? Output(line: { _ in }, progress: output.progress) : output)
  if json {
    output.line(jsonLine(report))
  } else {
    report.lines().forEach(output.line)
  }
  return report.complete ? .ok : .problemsFound
}

/// Builds the salvaged store (see ``runSalvage(source:target:json:treeReader:output:)``) and returns
/// its report. Throws, having written nothing at `target`: ``ExitStatus/noSuchStore`` (no `source`
/// directory), ``ExitStatus/notAStore`` (no data file in it), ``ExitStatus/badInput`` (`target` is
/// not a missing or empty directory), ``ExitStatus/corruptRecord`` (no valid record at all).
package func salvage(
  source: String, target: String, treeReader: URL?, output: Output
) async throws(ToolError) -> SalvageReport {
  let dataPath = try salvageSource(source)
  // The raw scan reads pages in LMDB 0.9's layout: on another LMDB it would misread them.
  do {
    try EventLog.requireSupportedLMDB()
  } catch {
    throw ToolError.from(error)
  }
  let destination: ImportTarget
  do {
    destination = try ImportTarget(target, verb: "salvage")
    try destination.refuseUnlessEmpty()
  } catch {
    throw ToolError(.badInput, error.message)
  }
  var parent = stat()
  guard stat(destination.parent, &parent) == 0, (parent.st_mode & S_IFMT) == S_IFDIR else {
    throw ToolError(
      .badInput, "\(destination.parent), where \(destination.path) would be created, is not a directory")
  }
  let file = try RawDataFile(path: dataPath)

  let (scan, sizeSource) = scanWithBestPageSize(file, output: output)
  // How far the child reads the tree one sequence at a time: as far as the raw scan says the log went.
  let hint = SalvagePlan(scan: scan, tree: LiveTree(), acknowledged: nil).top
  let tree =
    treeReader.map { LiveTree.read(executable: $0, store: source, through: hint) }
    ?? LiveTree(failure: "not read (no ferry executable to read it with)")
  let directory = (dataPath as NSString).deletingLastPathComponent
  // The rebuilt store is the same store: it keeps the damaged one's id (its head mark, a file of
  // its own, names it even when the data file's metadata is gone).
  let storeId = EventLog.markedStoreId(at: directory)
  let plan = SalvagePlan(
    scan: scan, tree: tree, acknowledged: EventLog.acknowledgedHead(in: directory),
    segment: SegmentFrames(directory: directory, storeId: storeId))
  var report = plan.report()
  guard report.recovered > 0 else {
    throw ToolError(
      .corruptRecord,
      "found no valid event record in \(dataPath) (\(file.size) bytes, \(scan.pagesScanned) pages "
        + "of \(scan.pageSize) bytes): nothing to salvage, nothing was written")
  }
  report.source = URL(fileURLWithPath: dataPath).standardizedFileURL.path
  report.output = destination.path
  report.fileBytes = file.size
  report.pageSizeSource = sizeSource.rawValue
  report.pageSizeGuessed = sizeSource == .guessed
  report.interruptedRuns = try await destination.build(output: output) { directory throws(ToolError) in
    try await plan.write(into: directory, storeId: storeId, output: output)
  }
  return report
}

/// The data file of the store at `path`: 3 when there is no such directory, 4 when it holds none.
private func salvageSource(_ path: String) throws(ToolError) -> String {
  var info = stat()
  guard stat(path, &info) == 0 else {
    let code = errno
    if code == ENOENT { throw ToolError(.noSuchStore, "no store to salvage at \(path): it does not exist") }
    throw ToolError(.unavailable, "cannot read \(path): \(String(cString: strerror(code)))")
  }
  guard (info.st_mode & S_IFMT) == S_IFDIR else {
    throw ToolError(.notAStore, "\(path) is a file, not a store directory: nothing to salvage")
  }
  let dataPath = path + "/data.mdb"
  guard stat(dataPath, &info) == 0 else {
    let code = errno
    if code == ENOENT {
      throw ToolError(.notAStore, "\(path) holds no data.mdb: there is no store there to salvage")
    }
    throw ToolError(.unavailable, "cannot read \(dataPath): \(String(cString: strerror(code)))")
  }
  return dataPath
}

/// Where a page size came from.
enum PageSizeSource: String {
  case metaPages = "meta pages"
  case metaPage0 = "meta page 0"
  case metaPage1 = "meta page 1"
  case guessed
}

/// Scans with the page size the meta pages name; when they disagree or name none, with each
/// candidate, keeping the scan that found the most sequences.
private func scanWithBestPageSize(_ file: RawDataFile, output: Output) -> (RawScan, PageSizeSource) {
  let first = file.pageSizeNamedByMetaPage0()
  let second = file.pageSizeNamedByMetaPage1()
  let candidates: [(Int, PageSizeSource)]
  switch (first, second) {
  case (let a?, let b?) where a == b: candidates = [(a, .metaPages)]
  case (let a?, let b?): candidates = [(a, .metaPage0), (b, .metaPage1)]
  case (let a?, nil): candidates = [(a, .metaPage0)]
  case (nil, let b?): candidates = [(b, .metaPage1)]
  case (nil, nil): candidates = PageLayout.commonPageSizes.map { ($0, .guessed) }
  }
  var best: (RawScan, PageSizeSource)?
  for (size, source) in candidates {
    let scan = file.scan(pageSize: size) { done, total in output.progress("salvage: scan", done, total) }
    if best == nil || scan.sequencesFound > (best?.0.sequencesFound ?? 0) { best = (scan, source) }
  }
  return best ?? (RawScan(pageSize: 4096), .guessed)
}

// MARK: Sequence ranges

/// Sequence numbers as sorted, disjoint, non-adjacent closed ranges.
struct SequenceRanges: Sendable, Equatable {
  private(set) var ranges: [ClosedRange<UInt64>] = []

  /// How many sequences.
  var count: Int {
    ranges.reduce(0) { total, range in
      let (sum, overflow) = total.addingReportingOverflow(Int(clamping: range.upperBound - range.lowerBound))
      return overflow || sum == .max ? .max : sum + 1
    }
  }

  /// Adds `range`, which must not start before the last range added (the usual order of a scan);
  /// one that does is merged in place, keeping the ranges sorted.
  mutating func insert(_ range: ClosedRange<UInt64>) {
    guard let last = ranges.last else {
      ranges.append(range)
      return
    }
    if range.lowerBound >= last.lowerBound {
      if last.upperBound == .max || range.lowerBound <= last.upperBound + 1 {
        ranges[ranges.count - 1] = last.lowerBound...max(last.upperBound, range.upperBound)
      } else {
        ranges.append(range)
      }
      return
    }
    var merged = range
    var kept: [ClosedRange<UInt64>] = []
    for existing in ranges {
      let touches =
        (existing.upperBound == .max || merged.lowerBound <= existing.upperBound + 1)
        && (merged.upperBound == .max || existing.lowerBound <= merged.upperBound + 1)
      if touches {
        merged = min(merged.lowerBound, existing.lowerBound)...max(merged.upperBound, existing.upperBound)
      } else {
        kept.append(existing)
      }
    }
    kept.append(merged)
    ranges = kept.sorted { $0.lowerBound < $1.lowerBound }
  }

  mutating func insert(_ sequence: UInt64) { insert(sequence...sequence) }

  func contains(_ sequence: UInt64) -> Bool {
    var low = 0
    var high = ranges.count
    while low < high {
      let middle = (low + high) / 2
      if ranges[middle].upperBound < sequence {
        low = middle + 1
      } else {
        high = middle
      }
    }
    return low < ranges.count && ranges[low].contains(sequence)
  }

  /// The first `limit` ranges as text: "120-130", "500".
  func descriptions(limit: Int) -> [String] {
    ranges.prefix(limit).map {
      $0.lowerBound == $0.upperBound ? "\($0.lowerBound)" : "\($0.lowerBound)-\($0.upperBound)"
    }
  }
}

// MARK: The live tree, read in a child process

/// What LMDB's live tree said, as read by `ferry salvage --tree-dump` in a child process.
struct LiveTree: Sendable {
  enum Compaction: Sendable, Equatable {
    /// Not read (the tree could not be opened, or its `meta` row not read).
    case unknown
    /// The store was never compacted.
    case never
    case at(through: UInt64, removed: UInt64)

    /// The sequence at or below which gaps are the compaction's (0 when never compacted; nil when
    /// not known).
    var floor: UInt64? {
      switch self {
      case .unknown: return nil
      case .never: return 0
      case .at(let through, _): return through
      }
    }
  }

  /// Why the tree could not be opened at all (nil when it was).
  var failure: String?
  var compaction = Compaction.unknown
  /// The log's head as LMDB reads it.
  var head: UInt64?
  /// The valid records the tree holds.
  var events: [UInt64: LoggedEvent] = [:]
  /// Sequences where the tree holds a record that does not decode.
  var bad: Set<UInt64> = []
  /// Sequences whose lookup failed.
  var failed = SequenceRanges()
  /// Sequences the tree was read for: it holds exactly ``events`` and ``bad`` among them.
  var covered = SequenceRanges()
  /// Whether the tree was read to its end.
  var finished = false
  /// Sequences LMDB crashed on (or that were skipped past, after repeated crashes).
  var crashed = SequenceRanges()
  /// How each reader that crashed ended.
  var crashes: [String] = []
  /// Why reading stopped before the end (nil when it got there).
  var stop: String?
  /// The highest sequence the current reader has reported on.
  var reached: UInt64 = 0

  init(failure: String? = nil) { self.failure = failure }

  /// Whether the tree was read in full, without a failed lookup, a crash or an undecodable record.
  var readInFull: Bool {
    failure == nil && finished && failed.ranges.isEmpty && bad.isEmpty && crashes.isEmpty
  }

  /// One line for the report.
  var summary: String {
    if let failure { return "unreadable: \(failure)" }
    if readInFull { return "read in full" + (head.map { " (head \($0))" } ?? "") }
    var parts: [String] = []
    if !bad.isEmpty {
      parts.append("\(bad.count) records that do not decode (first at \(bad.min() ?? 0))")
    }
    if !failed.ranges.isEmpty {
      parts.append(
        "\(failed.count) lookups failed (\(failed.descriptions(limit: 5).joined(separator: ", ")))")
    }
    if !crashes.isEmpty {
      let kinds = Set(crashes).sorted().joined(separator: ", ")
      let times = crashes.count == 1 ? "once" : "\(crashes.count) times"
      parts.append(
        "reading it crashed LMDB \(times) (\(kinds))"
          + (crashed.ranges.isEmpty
            ? "" : ", sequences skipped: " + crashed.descriptions(limit: 5).joined(separator: ", ")))
    }
    if !finished {
      parts.append(
        "not read past sequence \(covered.ranges.last?.upperBound ?? 0): " + (stop ?? "the reader stopped"))
    }
    return "read in part: " + parts.joined(separator: "; ")
  }

  /// How many readers are started at most, one after another, past the places where LMDB crashes.
  static let readerAttempts = 64
  /// How many sequences a reader restarted after a crash reads one at a time, reporting each.
  static let carefulSequences: UInt64 = 256

  /// Reads the tree with `executable salvage --tree-dump STORE --through N --from F --careful K` and
  /// collects what it prints. A reader that dies by a signal keeps what it printed; another is
  /// started where it stopped, reading one sequence at a time, so that the sequence LMDB crashes on
  /// is known and skipped (after repeated crashes, exponentially more: a damaged branch page hides a
  /// range). A reader that prints nothing for `idleSeconds` is killed and not restarted (a damaged
  /// file can make LMDB loop). Nothing past `hint`, the highest sequence the raw scan knows of, is
  /// worth a restart.
  static func read(executable: URL, store: String, through hint: UInt64, idleSeconds: Int = 20) -> LiveTree {
    var tree = LiveTree()
    var from: UInt64 = 1
    var careful: UInt64 = 0
    var skip: UInt64 = 1
    for attempt in 0..<readerAttempts {
      tree.reached = from - 1
      let run = runReader(
        executable: executable,
        arguments: [store, "--through", "\(hint)", "--from", "\(from)", "--careful", "\(careful)"],
        idleSeconds: idleSeconds, into: &tree)
      if tree.finished { break }
      guard run.opened else {
        if attempt == 0 {
          tree.failure = run.openFailure ?? run.ending + " before opening it"
        } else {
          tree.stop = run.ending + " before reopening it"
        }
        break
      }
      guard run.signalled else {
        tree.stop = run.ending
        break
      }
      tree.crashes.append(run.ending)
      guard tree.reached < hint else {
        tree.stop = run.ending
        break
      }
      let stopped = tree.reached + 1
      if careful > 0 && stopped - from < careful {
        // The reader was reading one sequence at a time: LMDB crashed on `stopped`.
        if stopped > from { skip = 1 }
        let end = min(hint, stopped > UInt64.max - skip ? UInt64.max : stopped + skip - 1)
        tree.crashed.insert(stopped...end)
        from = end == .max ? end : end + 1
        skip = min(skip * 2, 1 << 20)
      } else {
        // Somewhere in a chunk: read again from where it stopped, one at a time.
        from = stopped
      }
      careful = carefulSequences
      if attempt == readerAttempts - 1 {
        tree.stop = "gave up after \(readerAttempts) readers crashed"
      }
    }
    return tree
  }

  /// How one reader went.
  private struct ReaderRun {
    var opened = false
    var openFailure: String?
    var signalled = false
    var ending = ""
  }

  /// Runs one reader to its end, taking its lines into `tree`.
  private static func runReader(
    executable: URL, arguments: [String], idleSeconds: Int, into tree: inout LiveTree
  ) -> ReaderRun {
    var run = ReaderRun()
    let process = Process()
    process.executableURL = executable
    process.arguments = ["salvage", "--tree-dump"] + arguments
    let pipe = Pipe()
    process.standardOutput = pipe
    process.standardError = FileHandle.nullDevice
    process.standardInput = FileHandle.nullDevice
    do {
      try process.run()
    } catch {
      run.ending = "the reader could not be started (\(error.localizedDescription))"
      return run
    }
    let pid = process.processIdentifier
    let watch = ReaderWatch()
    let timer = DispatchSource.makeTimerSource(queue: .global())
    timer.schedule(deadline: .now() + 1, repeating: 1)
    timer.setEventHandler {
      watch.state.withLock { state in
        guard !state.ended, !state.killed else { return }
        state.idle += 1
        if state.idle >= idleSeconds {
          state.killed = true
          kill(pid, SIGKILL)
        }
      }
    }
    timer.resume()
    var pending: [UInt8] = []
    let handle = pipe.fileHandleForReading
    while true {
      let data = handle.availableData
      if data.isEmpty { break }
      watch.state.withLock { $0.idle = 0 }
      pending.append(contentsOf: data)
      guard let lastNewline = pending.lastIndex(of: 0x0A) else { continue }
      for line in pending[..<lastNewline].split(separator: 0x0A) {
        let text = String(decoding: line, as: UTF8.self)
        if text == "opened" { run.opened = true }
        if text.hasPrefix("unopened ") { run.openFailure = String(text.dropFirst("unopened ".count)) }
        tree.take(text)
      }
      pending.removeFirst(lastNewline + 1)
    }
    watch.state.withLock { $0.ended = true }
    timer.cancel()
    process.waitUntilExit()
    if watch.state.withLock({ $0.killed }) {
      run.ending = "the reader printed nothing for \(idleSeconds) s and was killed"
    } else if process.terminationReason == .uncaughtSignal {
      run.signalled = true
      run.ending = "signal \(process.terminationStatus)"
    } else {
      run.ending = "the reader ended with status \(process.terminationStatus)"
    }
    return run
  }

  /// Takes one line of the reader's output (malformed lines are ignored).
  mutating func take(_ line: String) {
    let parts = line.split(separator: " ", omittingEmptySubsequences: false)
    guard let kind = parts.first else { return }
    func number(_ index: Int) -> UInt64? {
      guard index < parts.count else { return nil }
      return parts[index] == "max" ? .max : UInt64(parts[index])
    }
    switch kind {
    case "compaction":
      if parts.count == 2 && parts[1] == "none" {
        compaction = .never
      } else if let through = number(1), let removed = number(2) {
        compaction = .at(through: through, removed: removed)
      }
    case "head": head = number(1)
    case "e":
      guard parts.count == 7, let sequence = number(1), let schema = UInt16(parts[3]),
        let timestamp = Int64(parts[4]), let id = EventID(hex: String(parts[5])),
        let payload = parts[6] == "-" ? Data() : Data(base64Encoded: String(parts[6]))
      else { return }
      events[sequence] = LoggedEvent(
        sequence: sequence, type: String(parts[2]), schemaVersion: schema, timestamp: timestamp, id: id,
        payload: [UInt8](payload))
    case "bad": if let sequence = number(1) { bad.insert(sequence) }
    case "failed":
      if let sequence = number(1) {
        failed.insert(sequence)
        reached = max(reached, sequence)
      }
    case "covered":
      if let from = number(1), let to = number(2), from <= to {
        covered.insert(from...to)
        reached = max(reached, to)
        if to == .max { finished = true }
      }
    case "done": finished = true
    default: return
    }
  }
}

/// Seconds since the tree reader last printed, whether its output has ended (it is gone then, and
/// its pid must not be signalled) and whether it was killed.
private final class ReaderWatch: Sendable {
  let state = Mutex((idle: 0, ended: false, killed: false))
}

/// `ferry salvage --tree-dump DIR --through N --from F --careful K`: prints, line by line, what
/// LMDB's live tree of the store at `path` holds from sequence `from` on, for a parent
/// `ferry salvage` (which reads it with `LiveTree.take(_:)`). Run in a child process: damage may
/// crash LMDB here, and the parent keeps what was printed.
///
/// The first `careful` sequences (up to `hint`) are read one at a time, each reported before the
/// next is read; then chunks while the tree reads cleanly, and one sequence at a time (up to `hint`,
/// the highest sequence the parent knows of) past anything that fails.
///
/// Lines: `opened` or `unopened REASON`; `compaction THROUGH REMOVED` or `compaction none`; for each
/// valid record `e SEQ TYPE SCHEMA TIMESTAMP IDHEX PAYLOAD_BASE64|-`; `bad SEQ` for a record that does
/// not decode; `failed SEQ` for a lookup that failed; `covered FROM TO|max` once every record in
/// that range has been reported; `head N`; `done`.
package func dumpLiveTree(path: String, through hint: UInt64, from first: UInt64 = 1, careful: UInt64 = 0) {
  var configuration = EventLog.Configuration()
  configuration.readOnly = true
  configuration.allowDamage = true  // the store is damaged: read what LMDB can still walk
  configuration.createIfMissing = false
  let log: EventLog
  do {
    log = try EventLog.open(at: path, configuration: configuration)
  } catch {
    _ = writeToStandardOutput("unopened \(oneLine("\(error)"))\n")
    return
  }
  defer { log.close() }
  guard writeToStandardOutput("opened\n") else { return }
  var text: String
  do {
    if let state = try log.compactionState() {
      text = "compaction \(state.through) \(state.removed)\n"
    } else {
      text = "compaction none\n"
    }
  } catch {
    text = "compaction unreadable\n"
  }
  guard writeToStandardOutput(text) else { return }
  text = ""
  func line(_ event: LoggedEvent) -> String {
    let payload = event.payload.isEmpty ? "-" : Data(event.payload).base64EncodedString()
    return
      "e \(event.sequence) \(event.type) \(event.storedSchemaVersion) \(event.timestamp) \(event.id.hex) \(payload)\n"
  }
  /// Reads one sequence by itself.
  func step(_ sequence: UInt64) -> String {
    do {
      guard let bytes = try log.record(at: sequence) else { return "covered \(sequence) \(sequence)\n" }
      do {
        return line(try EventRecord.decode(bytes, sequence: sequence)) + "covered \(sequence) \(sequence)\n"
      } catch {
        return "bad \(sequence)\ncovered \(sequence) \(sequence)\n"
      }
    } catch {
      return "failed \(sequence)\n"
    }
  }
  var after = max(first, 1) - 1
  var carefulLeft = careful
  while after < .max {
    if carefulLeft > 0 && after < hint {
      carefulLeft -= 1
      after += 1
      guard writeToStandardOutput(step(after)) else { return }
      continue
    }
    do {
      let chunk = try log.events(after: after, limit: 256)
      for event in chunk { text += line(event) }
      guard chunk.count == 256, let last = chunk.last?.sequence, last > after else {
        text += "covered \(after + 1) max\n"
        break
      }
      text += "covered \(after + 1) \(last)\n"
      after = last
      guard writeToStandardOutput(text) else { return }
      text = ""
    } catch {
      if after >= hint { break }
      after += 1
      text += step(after)
      if text.utf8.count >= 1 << 16 {
        guard writeToStandardOutput(text) else { return }
        text = ""
      }
    }
  }
  guard writeToStandardOutput(text) else { return }
  if let head = try? log.head() { _ = writeToStandardOutput("head \(head)\n") }
  _ = writeToStandardOutput("done\n")
}

/// Writes all of `text` to standard output; false when it cannot (the parent is gone).
private func writeToStandardOutput(_ text: String) -> Bool {
  var bytes = Array(text.utf8)
  var done = 0
  while done < bytes.count {
    let written = bytes.withUnsafeMutableBytes { raw -> Int in
      guard let base = raw.baseAddress else { return -1 }
      return write(1, base + done, raw.count - done)
    }
    if written < 0 && errno == EINTR { continue }
    if written <= 0 { return false }
    done += written
  }
  bytes.removeAll()
  return true
}

/// A message on one line.
private func oneLine(_ text: String) -> String {
  String(text.map { $0.isNewline ? " " : $0 })
}

// MARK: The write-ahead segment

/// The events the store's write-ahead segment holds past its checkpoint, read without writing or
/// locking anything. After a power cut they may be nowhere else: the segment acknowledges a commit
/// after its frame's flush, and the data file's pages of that commit need not have reached the disk.
struct SegmentFrames: Sendable {
  var events: [UInt64: LoggedEvent] = [:]
  /// For the report (``SalvageReport/segment``).
  var summary = "none"
  /// Whether a segment exists that could not be read in full.
  var unread = false

  init() {}

  init(directory: String, storeId: EventID?) {
    let read: OutstandingSegmentCommits?
    do {
      read = try EventLog.outstandingSegmentCommits(in: directory)
    } catch FerryLogError.damagedStore(_, let reason) {
      // The reason alone: the error's own advice is to run salvage.
      summary = "could not be read: \(oneLine(reason))"
      unread = true
      return
    } catch {
      summary = "could not be read: \(oneLine("\(error)"))"
      unread = true
      return
    }
    guard let read else { return }
    if let storeId, let own = EventID(bytes: read.storeId), own != storeId, read.storeId != Self.creatingId {
      summary = "belongs to another store (id \(own.hex)): not used"
      unread = true
      return
    }
    for event in read.events { events[event.sequence] = event }
    let through = read.events.last.map { " (sequences \(read.checkpointHead + 1)-\($0.sequence))" } ?? ""
    summary =
      "\(read.events.count) events in \(read.frames) frames past its checkpoint at sequence "
      + "\(read.checkpointHead)\(through)"
    if let damage = read.damage {
      summary += "; then stopped: \(damage)"
      unread = true
    }
  }

  /// The id a segment's header carries while its store's creation was unfinished.
  private static let creatingId = [UInt8](repeating: 0, count: 16)
}

// MARK: The plan

/// What goes at each sequence of the new log, decided from the raw scan and the live tree.
struct SalvagePlan: Sendable {
  /// A value more than this far beyond everything below it is not believed (a damaged key or meta
  /// row): salvage would otherwise write that many markers.
  static let largestJump: UInt64 = 10_000_000

  let scan: RawScan
  let tree: LiveTree
  let segment: SegmentFrames
  /// The highest sequence of the new log.
  let top: UInt64
  /// Records past the acknowledged end, left out.
  let unacknowledged: Int
  /// The compaction point (0 when none); ``compacted`` says whether there is one.
  let through: UInt64
  let compacted: Bool
  let compactionSource: String?
  let ignored: [String]

  enum Entry {
    /// The event, from the tree, the write-ahead segment or the raw scan only.
    case event(LoggedEvent, from: Source)
    /// Nothing valid: a `ferry.lost` marker that stays.
    case lost
    /// At or below the compaction point, removed by it (the tree says so): a gap again.
    case compacted
    /// At or below the compaction point, the tree could not be read there: a gap.
    case uncertain
  }

  /// Where an event was taken from.
  enum Source {
    case tree
    case segment
    case scan
  }

  init(scan: RawScan, tree: LiveTree, acknowledged: UInt64?, segment: SegmentFrames = SegmentFrames()) {
    self.scan = scan
    self.tree = tree
    self.segment = segment
    // A tree read in full, with nothing failed, knows the log's end; with the head mark (which
    // keeps what lost commits took away) it bounds what was ever acknowledged. Records past both
    // were written by a commit that never completed.
    // A whole tree only: one that holds every sequence from its compaction point to its head. A
    // tree LMDB reads without an error can still be a fragment — a damaged root that parses as a
    // page (another page's copy, bytes that pass for a branch) — and its head then says nothing of
    // how far the log went: the records the raw scan finds past it are the log's, not a failed
    // commit's.
    var cap = UInt64.max
    if tree.finished, tree.failed.count == 0, tree.crashed.count == 0, tree.bad.isEmpty, let head = tree.head,
      let floor = tree.compaction.floor,
      tree.events.keys.lazy.filter({ $0 > floor }).count == Int(head - min(head, floor))
    {
      // The segment's frames were flushed before their commits were acknowledged.
      cap = max(head, acknowledged ?? 0, segment.events.keys.max() ?? 0)
    }
    self.unacknowledged = scan.records.keys.filter { $0 > cap }.count
    // Everything that says how far the log went, cut at the first implausible jump.
    var values: [(UInt64, String)] = scan.records.keys.map { ($0, "a record's key") }
    values += tree.events.keys.filter { scan.records[$0] == nil }.map {
      ($0, "a record's key in the live tree")
    }
    if let head = tree.head { values.append((head, "the live tree's head")) }
    if case .at(let through, _) = tree.compaction {
      values.append((through, "the live tree's compaction point"))
    }
    if tree.compaction == .unknown {
      values += scan.compactionRows.map { ($0.through, "a compaction point in a meta row") }
    }
    values += scan.projectionPositions.map { ($0, "a projection's position in a meta row") }
    values += segment.events.keys.map { ($0, "a record in the write-ahead segment") }
    // Everything up to the head mark was acknowledged: what is found of it nowhere is lost, and
    // says so, rather than the log ending quietly where the data file's records end.
    if let acknowledged { values.append((acknowledged, "the head mark")) }
    values = values.filter { $0.0 <= cap }
    values.sort { $0.0 < $1.0 }
    var top: UInt64 = 0
    var ignored: [String] = []
    for (index, (value, _)) in values.enumerated() {
      if value > top && value - top > Self.largestJump {
        ignored = values[index...].prefix(5).map { "sequence \($0.0) (\($0.1)), far beyond everything else" }
        if values.count - index > 5 { ignored.append("and \(values.count - index - 5) more such values") }
        break
      }
      top = max(top, value)
    }
    self.top = top
    self.ignored = ignored
    switch tree.compaction {
    case .never:
      (through, compacted, compactionSource) = (0, false, nil)
    case .at(let point, _):
      (through, compacted, compactionSource) = (min(point, top), true, "live tree")
    case .unknown:
      let point = scan.compactionRows.map(\.through).filter { $0 <= top }.max()
      (through, compacted, compactionSource) = (point ?? 0, point != nil, point == nil ? nil : "raw scan")
    }
  }

  /// Two different valid records claim one sequence: the live tree decided which, or it could not
  /// (the first found is kept).
  enum Conflict {
    case decided
    case undecided
  }

  /// What goes at `sequence`, and whether two different valid records claim it.
  func entry(_ sequence: UInt64) -> (Entry, conflict: Conflict?) {
    let copies = scan.records[sequence] ?? []
    if let held = tree.events[sequence] {
      let differs = copies.contains { $0 != held } || segment.events[sequence].map { $0 != held } == true
      return (.event(held, from: .tree), differs ? .decided : nil)
    }
    // Past the segment's checkpoint a chained frame is the acknowledged commit itself (what
    // `ferry recover` would replay); a raw copy that differs is an older page's.
    if let framed = segment.events[sequence] {
      return (.event(framed, from: .segment), copies.contains { $0 != framed } ? .decided : nil)
    }
    let conflict: Conflict? = copies.count > 1 ? .undecided : nil
    if compacted && sequence <= through && !tree.bad.contains(sequence) {
      // Removed by compaction when the tree was read here and holds nothing; unknown otherwise.
      // Either way no old copy comes back: it could be a finished task's partial history.
      return (tree.covered.contains(sequence) ? .compacted : .uncertain, nil)
    }
    if let first = copies.first { return (.event(first, from: .scan), conflict) }
    return (.lost, nil)
  }

  /// The report's counts (the file and output fields are filled in by the caller).
  func report() -> SalvageReport {
    var recoveredFromTree = 0
    var recoveredFromScan = 0
    var recoveredFromSegment = 0
    var conflicting = 0
    var undecided = 0
    var lost = SequenceRanges()
    var uncertain = SequenceRanges()
    var removed = 0
    var notResurrected = 0
    var sequence: UInt64 = 1
    while sequence <= top {
      let (entry, conflict) = entry(sequence)
      if let conflict {
        conflicting += 1
        if conflict == .undecided { undecided += 1 }
      }
      switch entry {
      case .event(_, .tree): recoveredFromTree += 1
      case .event(_, .segment): recoveredFromSegment += 1
      case .event(_, .scan): recoveredFromScan += 1
      case .lost: lost.insert(sequence)
      case .compacted:
        removed += 1
        if scan.records[sequence] != nil { notResurrected += 1 }
      case .uncertain: uncertain.insert(sequence)
      }
      if sequence == .max { break }
      sequence += 1
    }
    let lostCount = lost.count
    let uncertainCount = uncertain.count
    return SalvageReport(
      source: "", output: "", fileBytes: 0, pageSize: scan.pageSize, pageSizeSource: "",
      pageSizeGuessed: false,
      pagesScanned: scan.pagesScanned, recordsFound: scan.recordCopies, sequencesFound: scan.sequencesFound,
      liveTree: tree.summary, liveTreeRead: tree.readInFull,
      recovered: recoveredFromTree + recoveredFromScan + recoveredFromSegment,
      recoveredFromTree: recoveredFromTree,
      recoveredFromScan: recoveredFromScan, recoveredFromSegment: recoveredFromSegment,
      segment: segment.summary,
      conflicting: conflicting, conflictingUnresolved: undecided,
      lost: lostCount, lostRanges: lost.descriptions(limit: SalvageReport.rangesListed),
      uncertain: uncertainCount, uncertainRanges: uncertain.descriptions(limit: SalvageReport.rangesListed),
      compactedThrough: compacted ? through : nil, compactionSource: compactionSource,
      removedByCompaction: removed, notResurrected: notResurrected, ignored: ignored,
      unacknowledged: unacknowledged, highestSequence: top,
      markers: lostCount, interruptedRuns: 0, segmentUnread: segment.unread,
      complete: lostCount == 0 && uncertainCount == 0 && undecided == 0 && ignored.isEmpty && !segment.unread)
  }

  /// Writes the new log into a new store at `directory`, in sequence order: each recovered event
  /// with its original type, schema version, timestamp, id and payload; a `ferry.lost` marker at
  /// every other sequence. Markers at or below the compaction point where the old store had a gap
  /// are removed by a compaction at that point, so the new store has the same compaction point and
  /// gaps. Then every run under way is interrupted, the store closed and verified. Returns how many
  /// runs were interrupted.
  func write(into directory: String, storeId: EventID?, output: Output) async throws(ToolError) -> Int {
    do {
      let interrupted = try await append(into: directory, storeId: storeId, output: output)
      let check = try FerryStore.openReadOnly(at: directory)
      defer { check.close() }
      let verified = try check.log.verify()
      guard verified.isHealthy else {
        throw ToolError(
          .storageError,
          "the salvaged store did not verify (\(verified.problems.first.map { "\($0)" } ?? "")): nothing was written"
        )
      }
      let head = try check.log.head()
      guard head == top + UInt64(interrupted) else {
        throw ToolError(
          .storageError,
          "the salvaged store's head is \(head), not \(top) and \(interrupted) interruptions: nothing was written"
        )
      }
      return interrupted
    } catch let error as ToolError {
      throw error
    } catch {
      throw ToolError.from(error)
    }
  }

  private func append(into directory: String, storeId: EventID?, output: Output) async throws -> Int {
    var configuration = FerryStore.Configuration()
    configuration.storeIdAtCreation = storeId
    let store = try await FerryStore.open(at: directory, configuration: configuration)
    defer { store.close() }
    var batch: [NewEvent] = []
    var next: UInt64 = 1
    var gaps = SequenceRanges()
    var gapsSinceCompaction = 0
    func flush() async throws {
      if batch.isEmpty { return }
      let sequences = try await store.log.append(batch)
      guard sequences.first == next, sequences.last == next + UInt64(batch.count) - 1 else {
        throw ToolError(
          .storageError,
          "salvaged events landed at sequences \(sequences.first ?? 0)… instead of \(next)…: nothing was written"
        )
      }
      next += UInt64(batch.count)
      batch.removeAll(keepingCapacity: true)
      output.progress("salvage: write", Int(clamping: next - 1), Int(clamping: top))
    }
    func compact() async throws {
      try await flush()
      let removable = gaps
      _ = try await store.log.compact { event in
        event.type == EventLog.lostEventType && removable.contains(event.sequence)
      }
      gapsSinceCompaction = 0
    }
    if compacted && through == 0 { try await compact() }
    var sequence: UInt64 = 1
    while sequence <= top {
      switch entry(sequence).0 {
      case .event(let event, _):
        batch.append(
          NewEvent(
            type: event.type, schemaVersion: event.storedSchemaVersion, payload: event.payload, id: event.id,
            timestamp: event.timestamp))
      case .lost:
        batch.append(NewEvent(type: EventLog.lostEventType, payload: []))
      case .compacted, .uncertain:
        batch.append(NewEvent(type: EventLog.lostEventType, payload: []))
        gaps.insert(sequence)
        gapsSinceCompaction += 1
      }
      if batch.count == 2000 { try await flush() }
      // At the compaction point, and on the way there when many markers wait (so that a long run
      // of gaps never makes the file large).
      if compacted && (sequence == through || (sequence < through && gapsSinceCompaction >= 100_000)) {
        try await compact()
      }
      if sequence == .max { break }
      sequence += 1
    }
    try await flush()
    // Runs under way in the damaged store belong to its processes, never to this new one.
    return try await store.queue.interruptEveryRun().count
  }
}
