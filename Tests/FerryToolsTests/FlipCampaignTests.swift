import Ferry
import FerryLog
import FerryTools
import Foundation
import LMDB
import Synchronization
import TestSupport
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// The kinds of page a flip can land in, read from the data file's own structure.
enum PageKind: String, CaseIterable, Sendable {
  case meta, branch, leaf, overflow, free
}

/// Classifies every page of an LMDB data file (64-bit layout, see `DataFileCheck`) by walking the
/// trees from the newest meta page: branch and leaf pages of every database, the overflow pages
/// big records live in, and free pages (listed in the free database, or reachable from nothing).
struct PageMap {
  let pageSize: Int
  var kinds: [Int: PageKind] = [:]

  init(file: [UInt8]) throws {
    func u16(_ at: Int) -> Int { Int(file[at]) | Int(file[at + 1]) << 8 }
    func u32(_ at: Int) -> Int { u16(at) | u16(at + 2) << 16 }
    func u64(_ at: Int) -> UInt64 { UInt64(u32(at)) | UInt64(u32(at + 4)) << 32 }
    pageSize = u32(40)
    guard (512...65536).contains(pageSize), file.count >= 2 * pageSize else { throw POSIXError(.EINVAL) }
    let metas = [0, pageSize].map { (offset: $0, txn: u64($0 + 144)) }
    let newest = metas.max { $0.txn < $1.txn }?.offset ?? 0
    let pages = file.count / pageSize
    kinds[0] = .meta
    kinds[1] = .meta
    var freeListed: Set<Int> = []
    var queue: [(page: UInt64, main: Bool, freeDB: Bool)] = [
      (u64(newest + 40 + 40), false, true), (u64(newest + 88 + 40), true, false),
    ]
    var seen: Set<Int> = []
    while let (raw, main, freeDB) = queue.popLast() {
      guard raw < UInt64(pages), raw >= 2 else { continue }
      let page = Int(raw)
      guard seen.insert(page).inserted else { continue }
      let base = page * pageSize
      let flags = u16(base + 10)
      let lower = u16(base + 12)
      let count = max(0, (lower - 16) / 2)
      if flags & 0x01 != 0 {
        kinds[page] = .branch
        for index in 0..<count {
          let node = base + u16(base + 16 + 2 * index)
          guard node + 8 <= base + pageSize else { continue }
          let child = UInt64(u16(node)) | UInt64(u16(node + 2)) << 16 | UInt64(u16(node + 4)) << 32
          queue.append((child, main, freeDB))
        }
      } else if flags & 0x02 != 0 {
        kinds[page] = .leaf
        for index in 0..<count {
          let node = base + u16(base + 16 + 2 * index)
          guard node + 8 <= base + pageSize else { continue }
          let size = u16(node) | u16(node + 2) << 16
          let nodeFlags = u16(node + 4)
          let keySize = u16(node + 6)
          let data = node + 8 + keySize
          if nodeFlags & 0x01 != 0, data + 8 <= file.count {  // F_BIGDATA: an overflow page number
            let first = Int(u64(data))
            guard first >= 2, first < pages else { continue }
            let run = max(1, u32(first * pageSize + 12))
            for overflow in first..<min(pages, first + run) { kinds[overflow] = .overflow }
            _ = size
          } else if main, nodeFlags & 0x02 != 0, data + 48 <= file.count {  // F_SUBDATA: a database
            queue.append((u64(data + 40), false, false))
          } else if freeDB, data + 8 <= file.count {  // the free list: count, then page numbers
            let listed = Int(u64(data))
            for entry in 0..<min(listed, max(0, (size - 8) / 8)) {
              let free = Int(u64(data + 8 + 8 * entry))
              if free >= 2 && free < pages { freeListed.insert(free) }
            }
          }
        }
      }
    }
    for page in 2..<pages where kinds[page] == nil || freeListed.contains(page) { kinds[page] = .free }
  }

  func pages(of kind: PageKind) -> [Int] { kinds.filter { $0.value == kind }.map(\.key).sorted() }
}

/// How a run of `ferry` ended, with a time limit: a signal that reached the caller, a hang, or an
/// exit status with what it printed.
enum Outcome {
  case exited(Int32, Data)
  case signalled(Int32)
  case hung
}

func runFerry(_ arguments: [String], limit: Double) throws -> Outcome {
  let process = Process()
  process.executableURL = productURL("ferry")
  process.arguments = arguments
  let out = Pipe()
  process.standardOutput = out
  process.standardError = FileHandle.nullDevice
  try process.run()
  let timedOut = Mutex(false)
  // Held weakly: a strong hold kept each of the campaign's processes and its pipe open until
  // the limit passed, hundreds at a time.
  DispatchQueue.global().asyncAfter(deadline: .now() + limit) { [weak process] in
    if let process, process.isRunning {
      timedOut.withLock { $0 = true }
      kill(process.processIdentifier, SIGKILL)
    }
  }
  let stdout = out.fileHandleForReading.readAll()
  process.waitUntilExit()
  if timedOut.withLock({ $0 }) { return .hung }
  if process.terminationReason == .uncaughtSignal { return .signalled(process.terminationStatus) }
  return .exited(process.terminationStatus, stdout)
}

enum WriteOutcome {
  case kept, refused, lostOnWrite
  case crashedWriting(String)
}

/// Appends three events to the store at `path` from another process (as an app would), then
/// exports it: the events it had must all still be there, unless the write was refused.
func writeThenExport(_ path: String) throws -> WriteOutcome {
  guard case .exited(0, let before) = try runFerry(["export", path], limit: 120) else { return .refused }
  let process = Process()
  process.executableURL = productURL("ferry-test-worker")
  process.arguments = ["append", path, "3"]
  process.standardOutput = FileHandle.nullDevice
  process.standardError = FileHandle.nullDevice
  process.environment = ProcessInfo.processInfo.environment.merging(["SWIFT_BACKTRACE": "enable=no"]) { $1 }
  try process.run()
  process.waitUntilExit()
  if process.terminationReason == .uncaughtSignal {
    return .crashedWriting("signal \(process.terminationStatus)")
  }
  guard process.terminationStatus == 0 else { return .refused }
  guard case .exited(0, let after) = try runFerry(["export", path], limit: 120) else { return .lostOnWrite }
  let old = String(decoding: before, as: UTF8.self).split(separator: "\n").dropFirst()
  let new = String(decoding: after, as: UTF8.self).split(separator: "\n").dropFirst()
  return Array(new.prefix(old.count)) == Array(old) && new.count == old.count + 3 ? .kept : .lostOnWrite
}

@Suite(.timeLimit(.minutes(60)), .serialized) struct FlipCampaignTests {
  /// A store of more than a thousand events with every kind of page: big payloads (overflow pages),
  /// a compaction that frees pages, cache fetches, tasks run, and more events after.
  ///
  /// It commits flushed: the campaign damages `data.mdb` alone, and a segment store's data file
  /// is vouched for by its segment's checkpoint, which an open restores over such damage
  /// (`Specs/one-sync-commit.md` §5) — the data file's own checks are this campaign's subject.
  func makeStore(at path: String) async throws {
    var configuration = FerryStore.Configuration()
    configuration.writeAheadSegment = false
    let store = try await FerryStore.open(at: path, configuration: configuration)
    do {
      var ids: [TaskID] = []
      for i in 0..<500 {
        let big = i % 9 == 0 ? String(repeating: "payload \(i) ", count: 600) : "note \(i)"
        ids.append(
          try await store.queue.add(
            tag: "note", payload: ["text": big], groupId: i % 3 == 0 ? "g\(i % 4)" : nil))
      }
      for id in ids.prefix(200) { try await store.queue.cancel(id) }
      for i in 0..<100 {
        try await store.ledger.recordFetch(key: "list-\(i % 20)", outcome: .success(isEmpty: false))
      }
      try await Task.sleep(for: .milliseconds(5))
      _ = try await store.compact(retention: .zero)
      for i in 0..<800 {
        let big = i % 7 == 0 ? String(repeating: "later \(i) ", count: 500) : "later \(i)"
        _ = try await store.queue.add(tag: "later", payload: ["text": big])
      }
    } catch {
      store.close()
      throw error
    }
    store.close()
  }

  @Test func aSeededByteFlipCampaignNeverCrashesHangsOrLies() async throws {
    let root = FileManager.default.temporaryDirectory.path + "/ferry-flips-\(UUID().uuidString.prefix(8))"
    try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: false)
    defer { try? FileManager.default.removeItem(atPath: root) }
    let pristine = root + "/pristine"
    try await makeStore(at: pristine)
    guard case .exited(0, let expected) = try runFerry(["export", pristine], limit: 120) else {
      Issue.record("the undamaged store does not export")
      return
    }
    let events = String(decoding: expected, as: UTF8.self).split(separator: "\n").count - 1
    #expect(events >= 1000)
    let original = try [UInt8](Data(contentsOf: URL(fileURLWithPath: pristine + "/data.mdb")))
    let map = try PageMap(file: original)
    let flipsPerKind = Int(ProcessInfo.processInfo.environment["FERRY_FLIPS_PER_KIND"] ?? "") ?? 110
    var generator = SeededRandom(
      seed: UInt64(ProcessInfo.processInfo.environment["FERRY_FLIP_SEED"] ?? "") ?? 12)
    var plan: [(kind: PageKind, offset: Int, mask: UInt8)] = []
    for kind in PageKind.allCases {
      let pages = map.pages(of: kind)
      #expect(!pages.isEmpty, "the store has no \(kind) page")
      guard !pages.isEmpty else { continue }
      for _ in 0..<flipsPerKind {
        let page = pages[Int.random(in: 0..<pages.count, using: &generator)]
        // Most flips where the page's bytes are in use: a meta page's fields; a tree page's header,
        // node pointers and nodes (not the free gap between them); anywhere in the rest.
        let base = page * map.pageSize
        let lower = Int(original[base + 12]) | Int(original[base + 13]) << 8
        let upper = Int(original[base + 14]) | Int(original[base + 15]) << 8
        let within: Int
        switch kind {
        case .meta: within = Int.random(in: 0..<152, using: &generator)
        case .branch, .leaf:
          let inUse = lower >= 16 && lower <= upper && upper < map.pageSize
          if inUse && Int.random(in: 0..<4, using: &generator) != 0 {
            within =
              Bool.random(using: &generator)
              ? Int.random(in: 0..<lower, using: &generator)
              : Int.random(in: upper..<map.pageSize, using: &generator)
          } else {
            within = Int.random(in: 0..<map.pageSize, using: &generator)
          }
        case .overflow, .free: within = Int.random(in: 0..<map.pageSize, using: &generator)
        }
        plan.append(
          (kind, page * map.pageSize + within, UInt8(1) << UInt8.random(in: 0...7, using: &generator)))
      }
    }

    var detected = 0
    var harmless = 0
    var crashed: [String] = []
    var hung: [String] = []
    var silent: [String] = []
    var statuses: [Int32: Int] = [:]
    var byKind: [PageKind: (detected: Int, harmless: Int)] = [:]
    let work = root + "/work"
    for (index, flip) in plan.enumerated() {
      try? FileManager.default.removeItem(atPath: work)
      try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: false)
      var damaged = original
      damaged[flip.offset] ^= flip.mask
      try Data(damaged).write(to: URL(fileURLWithPath: work + "/data.mdb"))
      try FileManager.default.copyItem(atPath: pristine + "/ferry-head", toPath: work + "/ferry-head")
      let label =
        "flip \(index): \(flip.kind) page \(flip.offset / map.pageSize), byte \(flip.offset % map.pageSize), mask \(flip.mask)"
      switch try runFerry(["export", work], limit: 120) {
      case .hung: hung.append(label)
      case .signalled(let signal): crashed.append(label + " (signal \(signal))")
      case .exited(0, let output):
        if output == expected {
          // Harmless to read; it must be harmless to write too: an app appending to this store
          // either is refused (a typed error) or keeps every event it had.
          switch try writeThenExport(work) {
          case .kept, .refused:
            harmless += 1
            byKind[flip.kind, default: (0, 0)].harmless += 1
          case .crashedWriting(let how): crashed.append(label + " (the app's write: \(how))")
          case .lostOnWrite: silent.append(label + " (an app's write destroyed acknowledged events)")
          }
        } else {
          silent.append(label)
          if let keep = ProcessInfo.processInfo.environment["FERRY_FLIP_KEEP"] {
            try? FileManager.default.copyItem(atPath: work, toPath: keep + "/silent-\(index)")
            try? output.write(to: URL(fileURLWithPath: keep + "/silent-\(index).jsonl"))
            try? expected.write(to: URL(fileURLWithPath: keep + "/expected.jsonl"))
          }
        }
      case .exited(let status, _):
        if status == 9, ProcessInfo.processInfo.environment["FERRY_FLIP_DEBUG"] != nil {
          print(label, (try? ferry(["export", work]).stderr) ?? "")
        }
        detected += 1
        statuses[status, default: 0] += 1
        byKind[flip.kind, default: (0, 0)].detected += 1
      }
    }
    let line =
      "flips: \(plan.count), detected \(detected), harmless \(harmless), crashed \(crashed.count), hung \(hung.count), silent \(silent.count)"
    print(line)
    print(
      "  by page: "
        + PageKind.allCases.map { "\($0) \(byKind[$0]?.detected ?? 0)/\(byKind[$0]?.harmless ?? 0)" }.joined(
          separator: ", ") + " (detected/harmless); exit statuses: "
        + statuses.sorted { $0.key < $1.key }.map { "\($0.key)×\($0.value)" }.joined(separator: ", "))
    for problem in (crashed + hung + silent).prefix(10) { print("  " + problem) }
    #expect(plan.count >= 500)
    #expect(crashed.isEmpty)
    #expect(hung.isEmpty)
    #expect(silent.isEmpty)
    #expect(statuses.keys.allSatisfy { $0 != 0 })
  }
}
