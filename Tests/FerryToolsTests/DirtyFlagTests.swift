import Ferry
import FerryLog
import Foundation
import TestSupport
import Testing

/// The pages of one named database's tree in an LMDB data file (64-bit layout, see
/// `DataFileCheck`), read from the newest meta page: enough to find the pages a write touches.
struct NamedTree {
  let pageSize: Int
  /// The rightmost leaf of the tree: where an append (a key after every other) lands.
  let lastLeaf: Int

  init?(file: [UInt8], name: String) {
    func u16(_ at: Int) -> Int { at + 2 <= file.count ? Int(file[at]) | Int(file[at + 1]) << 8 : 0 }
    func u32(_ at: Int) -> Int { u16(at) | u16(at + 2) << 16 }
    func u64(_ at: Int) -> Int { u32(at) | u32(at + 4) << 32 }
    let pageSize = u32(40)
    guard (512...65536).contains(pageSize), file.count >= 2 * pageSize else { return nil }
    let newest = u64(144) >= u64(pageSize + 144) ? 0 : pageSize
    /// Follows the last child of each branch page from `root` down to a leaf.
    func rightmostLeaf(_ root: Int) -> Int? {
      var page = root
      for _ in 0..<32 {
        let base = page * pageSize
        guard page >= 2, base + pageSize <= file.count else { return nil }
        if u16(base + 10) & 0x02 != 0 { return page }
        let count = (u16(base + 12) - 16) / 2
        guard count > 0 else { return nil }
        let node = base + u16(base + 16 + 2 * (count - 1))
        page = u32(node) | u16(node + 4) << 32
      }
      return nil
    }
    // The main database's leaves name every other database (F_SUBDATA nodes, an MDB_db each).
    var stack = [u64(newest + 88 + 40)]
    var seen: Set<Int> = []
    var found: Int?
    while let page = stack.popLast() {
      let base = page * pageSize
      guard found == nil, page >= 2, base + pageSize <= file.count, seen.insert(page).inserted else {
        continue
      }
      let count = max(0, (u16(base + 12) - 16) / 2)
      for index in 0..<count {
        let node = base + u16(base + 16 + 2 * index)
        if u16(base + 10) & 0x01 != 0 {
          stack.append(u32(node) | u16(node + 4) << 32)
          continue
        }
        let keySize = u16(node + 6)
        guard u16(node + 4) & 0x02 != 0, node + 8 + keySize + 48 <= file.count,
          String(decoding: file[(node + 8)..<(node + 8 + keySize)], as: UTF8.self) == name,
          let leaf = rightmostLeaf(u64(node + 8 + keySize + 40))
        else { continue }
        found = leaf
      }
    }
    guard let found else { return nil }
    self.pageSize = pageSize
    lastLeaf = found
  }
}

/// P_DIRTY (0x10 in a page header's flags, byte 10) is never on disk: LMDB clears it as it writes
/// a page. Found on a page a write touches, LMDB would take the mapped page for its own dirty copy
/// and write into the read-only map, a SIGSEGV. The open check refuses the store instead.
@Suite(.timeLimit(.minutes(20)), .serialized) struct DirtyFlagTests {
  enum Writer: String, CaseIterable { case append, addTasks = "add-tasks" }

  /// Flips P_DIRTY on the rightmost leaf of `tree` in a copy of a campaign store, then writes
  /// with `writer` from another process and opens the store to write in this one: both refused
  /// with a typed error, nothing written, every event still there once the bit is cleared.
  func refused(tree: String, writer: Writer) async throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let store = scratch.path + "/store"
    try await FlipCampaignTests().makeStore(at: store)
    let before = try ferry(["export", store])
    #expect(before.status == 0)
    let dataFile = URL(fileURLWithPath: store + "/data.mdb")
    var bytes = try [UInt8](Data(contentsOf: dataFile))
    let found = NamedTree(file: bytes, name: tree)
    #expect(found != nil, "no tree named \(tree)")
    guard let found else { return }
    let flagsByte = found.lastLeaf * found.pageSize + 10
    #expect(bytes[flagsByte] == 0x02, "page \(found.lastLeaf) is not a plain leaf page")
    bytes[flagsByte] ^= 0x10
    try Data(bytes).write(to: dataFile)

    let arguments = writer == .append ? ["append", store, "3"] : ["add-tasks", store, "3"]
    let (process, out, err) = try start(
      productURL("ferry-test-worker"), arguments, extra: ["SWIFT_BACKTRACE": "enable=no"])
    let ended = finish(process, out, err)
    #expect(!ended.signaled, "the write from another process died by signal \(ended.status)")
    #expect(ended.status != 0)
    #expect(ended.stderr.contains("P_DIRTY"), "\(ended.stderr)")
    #expect(!ended.out.contains("ack"))

    do {
      let log = try EventLog.open(at: store)
      log.close()
      Issue.record("a store with a P_DIRTY leaf opened for writing")
    } catch FerryLogError.damagedStore(_, let reason) {
      #expect(reason.contains("page \(found.lastLeaf)"), "\(reason)")
    }
    await #expect(throws: FerryError.self) {
      let opened = try await FerryStore.open(at: store)
      opened.close()
    }
    let damagedExport = try ferry(["export", store])
    #expect(damagedExport.status == 6, "\(damagedExport.stderr)")

    // Nothing was written: the file is the damaged one byte for byte, and with the bit cleared
    // again it exports exactly what it held.
    #expect(try [UInt8](Data(contentsOf: dataFile)) == bytes)
    bytes[flagsByte] ^= 0x10
    try Data(bytes).write(to: dataFile)
    let after = try ferry(["export", store])
    #expect(after.status == 0)
    #expect(after.stdout == before.stdout)
  }

  @Test func aDirtyFlagOnTheEventsTreesLastLeafIsRefusedNotASignal() async throws {
    try await refused(tree: "events", writer: .append)
  }

  @Test func aDirtyFlagOnTheTasksTablesLastLeafIsRefusedNotASignal() async throws {
    try await refused(tree: "p:taskQueue:tasks", writer: .addTasks)
  }
}
