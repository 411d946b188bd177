import Foundation
import PropertyBased
import Testing

@testable import FerryLog

/// A projection whose events are small programs over its tables: every kind of read and write
/// `apply` can make, with what the reads return written back, so that a fold that reads wrongly
/// (through a batch overlay, say) writes different rows.
struct TableProgram: Projection {
  let name = "program"
  let version: UInt32 = 1
  let tables = ["a", "b", "results"]

  /// One operation: `kind`, a table (0 or 1), a key of 1–2 bytes from a small space (so keys
  /// meet), and a value.
  struct Operation {
    var kind: UInt8
    var table: UInt8
    var key: [UInt8]
    var value: UInt8

    var bytes: [UInt8] { [kind, table, UInt8(key.count)] + key + [value] }
  }

  static func encode(_ operations: [Operation]) -> [UInt8] { operations.flatMap(\.bytes) }

  func apply(_ event: LoggedEvent, to tables: ProjectionTables) throws {
    var index = 0
    var number: UInt8 = 0
    let bytes = event.payload
    while index + 3 <= bytes.count {
      let kind = bytes[index] % 8
      let table = bytes[index + 1] % 2 == 0 ? "a" : "b"
      let length = Int(bytes[index + 2])
      guard index + 3 + length + 1 <= bytes.count else { return }
      let key = Array(bytes[(index + 3)..<(index + 3 + length)])
      let byte = bytes[index + 3 + length]
      let value = [byte]
      index += 4 + length
      let resultKey = event.sequence.bigEndianBytes + [number]
      number &+= 1
      func result(_ bytes: [UInt8]) throws { try tables.putLast("results", key: resultKey, value: bytes) }
      switch kind {
      case 0: try tables.put(table, key: key, value: value)
      case 1: try tables.putLast(table, key: key, value: value)
      case 2: try result([try tables.putIfAbsent(table, key: key, value: value) ? 1 : 0])
      case 3: try result([try tables.delete(table, key: key) ? 1 : 0])
      case 4: try result(try tables.get(table, key: key) ?? [0xFF, 0xFF])
      case 5:
        // Up to `value % 5` entries from `key`: keys and values as the walk meets them.
        var seen: [UInt8] = []
        var left = Int(byte % 5)
        let visited = try tables.scan(table, from: key) { k, v in
          guard left > 0 else { return false }
          left -= 1
          seen += [UInt8(k.count)] + Array(k) + Array(v)
          return left > 0
        }
        try result(seen + [UInt8(truncatingIfNeeded: visited)])
      case 6: try result(UInt32(try tables.count(table)).bigEndianBytes)
      default:
        if byte % 4 == 0 { try tables.removeAll(table) }  // rarely, so that tables grow
      }
    }
  }
}

/// Every row of the program's tables.
func programRows(_ log: EventLog) throws -> [String: [[UInt8]]] {
  try log.read { view in
    let tables = try view.tables(of: "program")
    var rows: [String: [[UInt8]]] = [:]
    for table in ["a", "b", "results"] {
      rows[table] = try tables.entries(table).map { $0.key + [0xEE] + $0.value }
    }
    return rows
  }
}

@Suite(.timeLimit(.minutes(20))) struct BatchFoldTests {
  /// The batch fold (rebuild, verify) against the one-event-at-a-time fold of the live path,
  /// over random logs and chunk sizes.
  @Test func batchFoldEqualsOneEventAtATime() async {
    // One number per operation: kind, table, key (1 or 2 bytes) and value, in mixed radix.
    func operation(_ n: Int) -> TableProgram.Operation {
      let key = UInt8(n / 16 % 40 + 1)
      let value = UInt8(n / 1280 % 256)
      return TableProgram.Operation(
        kind: UInt8(n % 8), table: UInt8(n / 8 % 2), key: n / 640 % 2 == 1 ? [key, value % 3] : [key],
        value: value)
    }
    let events = Gen.int(in: 0...(1280 * 256 - 1)).array(of: 1...4).array(of: 1...120)
    await propertyCheck(count: 40, input: events, Gen.int(in: 1...50)) { numbers, chunk in
      let programs = numbers.map { $0.map(operation) }
      let store = TemporaryStore()
      defer { store.remove() }
      // The property swallows what its body throws: every error is recorded as a failure here.
      do {
        let live: [String: [[UInt8]]]
        do {
          let log = try store.open([TableProgram()])
          defer { log.close() }
          // One append: the live path still folds its events one at a time, in one commit.
          _ = try await log.append(
            programs.map { NewEvent(type: "program", payload: TableProgram.encode($0)) })
          live = try programRows(log)
          // verify folds the log into a scratch area in chunks and compares every row.
          let report = try log.verify()
          #expect(report.isHealthy, "\(report.problems.prefix(3))")
        }
        let log = try store.open([TableProgram()]) { $0.rebuildChunkSize = chunk }
        defer { log.close() }
        let report = try await log.rebuild()
        #expect(report.eventsReplayed == programs.count)
        let rebuilt = try programRows(log)
        #expect(rebuilt == live, "chunks of \(chunk) over \(programs.count) events")
      } catch {
        Issue.record("chunks of \(chunk) over \(programs.count) events threw: \(error)")
      }
    }
  }

  @Test func rowsAddedAndDeletedInsideAChunkNeverReachTheTable() throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open([TableProgram()])
    defer { log.close() }
    try log.environment.write { txn in
      let target = try #require(log.core.projections.first)
      let a = try #require(target.databases["a"])
      let tables = ProjectionTables(
        projection: target.name, transaction: txn, databases: target.databases, batched: true)
      for i in UInt8(1)...100 { try tables.put("a", key: [i], value: [i]) }
      for i in UInt8(1)...100 where i % 2 == 0 { try tables.delete("a", key: [i]) }
      #expect(tables.pendingRows == 100)  // 50 rows and 50 deletions, none written yet
      #expect(try txn.statistics(a).entries == 0)
      #expect(try tables.count("a") == 50)
      try tables.flush()
      #expect(try txn.statistics(a).entries == 50)
      #expect(tables.pendingRows == 0)
    }
  }

  /// The overlay keeps its bytes in blocks that never move: rows of every size (past a block's
  /// 64 KiB too), rows rewritten, and buffers a scan handed out stay right while the scan's body
  /// writes enough to open new blocks; what reaches the table is the last value of each key.
  @Test func overlayBytesStayPutAcrossBlocksAndRewrites() throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open([TableProgram()])
    defer { log.close() }
    var random = SeededRandom(seed: 0xFE44)
    func bytes(_ count: Int, _ fill: UInt8) -> [UInt8] {
      (0..<count).map { fill &+ UInt8(truncatingIfNeeded: $0) }
    }
    try log.environment.write { txn in
      let target = try #require(log.core.projections.first)
      let a = try #require(target.databases["a"])
      let tables = ProjectionTables(
        projection: target.name, transaction: txn, databases: target.databases, batched: true)
      var model: [[UInt8]: [UInt8]] = [:]
      for round in 0..<3 {
        for _ in 0..<400 {
          let key = [UInt8(random.next() % 200), UInt8(round)]
          let size = random.next() % 10 == 0 ? 70_000 + Int(random.next() % 5_000) : Int(random.next() % 300)
          let value = bytes(size, UInt8(truncatingIfNeeded: random.next()))
          try tables.put("a", key: key, value: value)
          model[key] = value
          if random.next() % 7 == 0 {
            #expect(try tables.delete("a", key: key))
            model[key] = nil
          }
        }
        // A scan whose body writes (new blocks open) while it holds what it was handed.
        var held: [(UnsafeRawBufferPointer, [UInt8])] = []
        var written = 0
        try tables.scan("a", from: nil) { key, value in
          held.append((value, Array(value)))
          let extra = [0xF0, UInt8(written % 250)]
          let bigger = bytes(40_000, UInt8(written % 256))
          try tables.put("a", key: extra, value: bigger)
          model[extra] = bigger
          written += 1
          return written < 50
        }
        for (buffer, copy) in held { #expect(Array(buffer) == copy) }
        for (key, value) in model { #expect(try tables.get("a", key: key) == value) }
        #expect(try tables.count("a") == model.count)
        try tables.flush()
        let stored = try txn.withCursor(a) { cursor in
          var rows: [[UInt8]: [UInt8]] = [:]
          try cursor.scan(from: nil) { k, v in
            rows[Array(k)] = Array(v)
            return true
          }
          return rows
        }
        #expect(stored == model, "round \(round)")
      }
    }
  }

  /// A row rewritten thousands of times in one chunk (a task claimed and interrupted again and
  /// again, its row carrying a 60 KB failure message) keeps about one copy in the overlay, not
  /// one per write (found by a hostile review: 4,000 rewrites held 245 MiB until the chunk ended);
  /// rows that keep growing are compacted; rewrites during a scan leave the scan's bytes alone.
  @Test func rewritesOfABigRowKeepAboutOneCopy() {
    let overlay = TableOverlay()
    let key: [UInt8] = [1, 2, 3]
    var last: [UInt8] = []
    for round in 0..<4_000 {
      // A claimed row is a little longer than an unclaimed one.
      last = [UInt8](repeating: UInt8(round % 251), count: 60_000 + (round % 2) * 12)
      overlay.set(key, last)
    }
    #expect(overlay.lookup(key) == .some(last))
    #expect(overlay.arenaBytes < 2 << 20, "\(overlay.arenaBytes) bytes held for one 60 KB row")
    // Rows that grow on every write cannot be written over: the arena is compacted instead.
    for round in 0..<3_000 {
      last = [UInt8](repeating: UInt8(round % 251), count: 1_000 + round * 10)
      overlay.set(key, last)
      overlay.set([9, UInt8(round % 50)], [UInt8(round % 256)])
    }
    #expect(overlay.lookup(key) == .some(last))
    for small in 0..<50 { #expect(overlay.lookup([9, UInt8(small)]) != nil) }
    #expect(overlay.arenaBytes < 8 << 20, "\(overlay.arenaBytes) bytes held for 51 rows")
    // During a scan nothing is written over: the bytes handed to the body stay as they were.
    overlay.set([5], [UInt8](repeating: 7, count: 100))
    var handed: [(UnsafeRawBufferPointer, [UInt8])] = []
    let store = TemporaryStore()
    defer { store.remove() }
    do {
      let log = try store.open([TableProgram()])
      defer { log.close() }
      try log.environment.write { txn in
        let target = try #require(log.core.projections.first)
        let a = try #require(target.databases["a"])
        _ = try overlay.scan(base: a, txn, from: nil) { k, v in
          handed.append((v, Array(v)))
          overlay.set(Array(k), [UInt8](repeating: 0xEE, count: min(v.count, 10)))
          return true
        }
      }
    } catch {
      Issue.record("\(error)")
    }
    #expect(handed.count == 52)
    for (buffer, copy) in handed { #expect(Array(buffer) == copy) }
    #expect(overlay.lookup([5]) == .some([UInt8](repeating: 0xEE, count: 10)))
  }
}
