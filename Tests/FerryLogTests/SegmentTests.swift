import FerryLog
import Foundation
import LMDB
import Synchronization
import TestSupport
import Testing

/// The write-ahead segment (`Specs/one-sync-commit.md`) on real stores and real processes: what
/// a killed writer leaves is replayed, meta pages that reached the disk without their trees are
/// put back, a second process follows the store's mode, and a damaged segment is refused by name.
@Suite(.timeLimit(.minutes(20))) struct SegmentTests {
  /// A `ferry-test-worker segment-append` child (``SegmentRecoveryTests/Worker``): its
  /// acknowledged sequences, then killed.
  struct Writer {
    let worker: SegmentRecoveryTests.Worker

    init(_ directory: String, count: Int, on: Bool) throws {
      worker = try SegmentRecoveryTests.Worker(["segment-append", directory, "\(count)", on ? "ON" : "OFF"])
    }

    /// Waits (at most a minute) until it says `line`.
    func wait(for line: String) async throws { try await worker.wait(for: line) }

    /// SIGKILLs it and returns the sequences it acknowledged.
    func kill() -> [UInt64] {
      worker.kill().compactMap { $0.hasPrefix("ack ") ? UInt64($0.dropFirst(4)) : nil }
    }
  }

  func format(_ store: TemporaryStore) throws -> UInt32? {
    let env = try Environment.open(
      path: store.path,
      options: {
        var o = Environment.Options(); o.readOnly = true; return o
      }())
    defer { env.close() }
    try env.openDatabases(["meta"], create: false)
    let meta = try env.database("meta")
    return try env.read { try $0.get(meta, key: Array("format".utf8)) }.flatMap { UInt32(bigEndianBytes: $0) }
  }

  func segmentOn(_ configuration: inout EventLog.Configuration) { configuration.writeAheadSegment = true }

  @Test func concurrentCallersAreDurableAcrossReopenAndTheStoreRemembersItsMode() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open(configure: segmentOn)
    let sequences = try await withThrowingTaskGroup(of: [UInt64].self) { group in
      for caller in 0..<16 {
        group.addTask {
          var mine: [UInt64] = []
          for i in 0..<40 {
            mine.append(
              try await log.append(NewEvent(type: "c\(caller % 3)", payload: payload("\(caller)-\(i)"))))
          }
          return mine
        }
      }
      return try await group.reduce(into: []) { $0 += $1 }
    }
    log.close()
    #expect(Set(sequences).count == 640)
    #expect(FileManager.default.fileExists(atPath: store.path + "/ferry-segment"))
    #expect(try format(store) == EventLog.segmentFormatVersion)
    // Opened again asking for flushed commits: the store keeps its segment only for an open that
    // asks — alone, an open that does not turns it off (flushed first, then the segment removed).
    let again = try store.open { $0.writeAheadSegment = false }
    #expect(try again.head() == 640)
    #expect(try counts(again).values.reduce(0, +) == 640)
    #expect(try again.verify().problems.isEmpty)
    again.close()
    #expect(!FileManager.default.fileExists(atPath: store.path + "/ferry-segment"))
    #expect(try format(store) == EventLog.storeFormatVersion)
  }

  /// A segment half-made when its creator died (`ferry-segment.new`, never renamed into place) is
  /// removed by the next read-write open alone, whether it turns the segment on or not; a
  /// read-only open leaves it.
  @Test(arguments: [false, true]) func aHalfMadeSegmentIsRemovedByTheNextOpenAlone(segment: Bool) async throws
  {
    let store = TemporaryStore()
    defer { store.remove() }
    do {
      let log = try store.open()
      _ = try await log.append(NewEvent(type: "t", payload: payload("one")))
      log.close()
    }
    let stale = store.path + "/ferry-segment.new"
    #expect(FileManager.default.createFile(atPath: stale, contents: Data(repeating: 7, count: 4096)))
    let reader = try store.open([]) { $0.readOnly = true }
    reader.close()
    #expect(FileManager.default.fileExists(atPath: stale), "a read-only open removed a file")
    let log = try store.open { $0.writeAheadSegment = segment }
    defer { log.close() }
    #expect(!FileManager.default.fileExists(atPath: stale))
    #expect(FileManager.default.fileExists(atPath: store.path + "/ferry-segment") == segment)
    #expect(try log.head() == 1)
  }

  @Test func whatAKilledWriterAcknowledgedIsReplayedAndAReadOnlyOpenAloneIsRefusedFirst() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let writer = try Writer(store.path, count: 300, on: true)
    try await writer.wait(for: "holding")
    let acknowledged = writer.kill()
    #expect(acknowledged.count == 300)
    // Alone and read-only: the frames past the checkpoint cannot be replayed, so it refuses.
    do {
      _ = try store.open([]) { $0.readOnly = true }
      Issue.record("a read-only open read a store whose segment holds unreplayed commits")
    } catch FerryLogError.needsRecovery {}
    let log = try store.open(configure: segmentOn)
    defer { log.close() }
    #expect(try log.head() == 300)
    for sequence in acknowledged {
      #expect(try log.event(at: sequence)?.payload == payload("worker \(sequence - 1)"))
    }
    #expect(try log.verify().problems.isEmpty)
  }

  @Test func metaPagesOnDiskWithoutTheirTreesAreReplacedByTheCheckpoint() async throws {
    // A power cut may leave a newer meta page on disk whose pages never got there: here the two
    // meta pages are overwritten with a transaction id far ahead and a main root past the file's
    // end, as such a meta would read. LMDB alone would refuse the file (or read garbage); the
    // open puts the checkpoint's pages back and replays the frames.
    let store = TemporaryStore()
    defer { store.remove() }
    let writer = try Writer(store.path, count: 200, on: true)
    try await writer.wait(for: "holding")
    let acknowledged = writer.kill()
    let data = store.path + "/data.mdb"
    let handle = try FileHandle(forUpdating: URL(fileURLWithPath: data))
    let pageSize = 4096
    for page in 0..<2 {
      try handle.seek(toOffset: UInt64(page * pageSize + 144))
      try handle.write(contentsOf: withUnsafeBytes(of: UInt64(1_000_000 + page)) { Data($0) })
      try handle.seek(toOffset: UInt64(page * pageSize + 88 + 40))  // the main database's root page
      try handle.write(contentsOf: withUnsafeBytes(of: UInt64(9_999_999)) { Data($0) })
    }
    try handle.close()
    let log = try store.open(configure: segmentOn)
    defer { log.close() }
    #expect(try log.head() == UInt64(acknowledged.count))
    #expect(try log.verify().problems.isEmpty)
  }

  @Test func aSecondProcessFollowsTheSegmentAndNeitherLosesWhatItAcknowledged() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open(configure: segmentOn)
    _ = try await log.append(NewEvent(type: "here", payload: payload("first")))
    // The worker does not ask for the segment; sharing the store, it follows it (frames, no
    // flush of LMDB) — and is killed with its frames past any checkpoint.
    let writer = try Writer(store.path, count: 150, on: false)
    var mine: [UInt64] = []
    for i in 0..<100 { mine.append(try await log.append(NewEvent(type: "here", payload: payload("\(i)")))) }
    try await writer.wait(for: "holding")
    let theirs = writer.kill()
    for i in 100..<150 { mine.append(try await log.append(NewEvent(type: "here", payload: payload("\(i)")))) }
    // A read-only open from another process beside a live writer reads the live state (it is not
    // alone, so the frames past the checkpoint are not its business).
    let (status, output) = try await runProduct("ferry-test-worker", ["log-head", store.path])
    #expect(status == 0)
    #expect(output.contains("head 301"))
    log.close()
    let again = try store.open(configure: segmentOn)
    #expect(try again.head() == 301)
    for sequence in mine { #expect(try again.event(at: sequence)?.type == "here") }
    for sequence in theirs { #expect(try again.event(at: sequence)?.type == "worker.event") }
    #expect(try again.verify().problems.isEmpty)
    again.close()
    #expect(try format(store) == EventLog.segmentFormatVersion)
  }

  @Test func aDamagedSegmentHeaderIsRefusedByNameAndNothingIsWritten() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let writer = try Writer(store.path, count: 20, on: true)
    try await writer.wait(for: "holding")
    _ = writer.kill()
    let segment = store.path + "/ferry-segment"
    let handle = try FileHandle(forUpdating: URL(fileURLWithPath: segment))
    try handle.write(contentsOf: Data(repeating: 0xA5, count: 1024))  // both header slots
    try handle.close()
    let before = try Data(contentsOf: URL(fileURLWithPath: store.path + "/data.mdb"))
    do {
      _ = try store.open(configure: segmentOn)
      Issue.record("a store whose segment lost both headers was opened")
    } catch FerryLogError.damagedStore(_, let reason) {
      #expect(reason.contains("write-ahead segment"))
    }
    #expect(try Data(contentsOf: URL(fileURLWithPath: store.path + "/data.mdb")) == before)
  }

  @Test func aFlippedFrameEndsTheChainThereAndLaterFramesAreNotReplayed() async throws {
    // Damage inside a frame: the chain ends at that frame, so neither it nor any frame after it
    // is replayed — the log stays gap-free, and the head mark (written after each commit) tells
    // the open that acknowledged events are missing instead of handing their sequences out again.
    let store = TemporaryStore()
    defer { store.remove() }
    let writer = try Writer(store.path, count: 50, on: true)
    try await writer.wait(for: "holding")
    _ = writer.kill()
    let segment = store.path + "/ferry-segment"
    var bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: segment)))
    let tenth = 4096 + 9 * 63 + 40  // inside an early frame (each about 63 bytes here)
    bytes[tenth] ^= 0x40
    try Data(bytes).write(to: URL(fileURLWithPath: segment))
    do {
      let log = try store.open(configure: segmentOn)
      Issue.record("opened with head \(try log.head()) although acknowledged events are missing")
      log.close()
    } catch FerryLogError.lostCommits(_, let acknowledged, let found) {
      #expect(acknowledged == 50)
      #expect(found < 50)
    }
  }

  @Test func aFirstOpenKilledAfterTakingTheOpenLockLeavesADirectoryThatStillOpens() async throws {
    // What the kill harness found: killed after the open lock's file was made and before LMDB
    // made data.mdb, a first open left `ferry-open.lock` (and the creation mark) alone in the
    // directory, and every later open called it "not a Ferry store".
    let store = TemporaryStore()
    defer { store.remove() }
    try FileManager.default.createDirectory(atPath: store.path, withIntermediateDirectories: false)
    _ = FileManager.default.createFile(atPath: store.path + "/ferry-open.lock", contents: Data())
    let log = try store.open()
    _ = try await log.append(NewEvent(type: "t", payload: []))
    #expect(try log.head() == 1)
    log.close()
  }

  @Test func aCheckpointEveryFewCommitsKeepsEverythingAndReusesTheSegment() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open {
      $0.writeAheadSegment = true
      $0.segmentCheckpointCommits = 7
    }
    for i in 0..<200 { _ = try await log.append(NewEvent(type: "t", payload: payload("\(i)"))) }
    let size = try FileManager.default.attributesOfItem(atPath: store.path + "/ferry-segment")[.size] as? Int
    #expect(size == 8 << 20)
    log.close()
    let again = try store.open { $0.writeAheadSegment = true }
    defer { again.close() }
    #expect(try again.head() == 200)
    #expect(try again.verify().problems.isEmpty)
  }
}
