import Foundation
import LMDB
import TestSupport
import Testing

@testable import FerryLog

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Raw access to a data file, to damage it the way disks, copies and people do.
struct DataFile {
  let path: String

  init(_ store: TemporaryStore) { path = store.path + "/data.mdb" }

  var bytes: [UInt8] { (try? [UInt8](Data(contentsOf: URL(fileURLWithPath: path)))) ?? [] }
  var size: Int { bytes.count }

  func check() throws -> DataFileCheck { try DataFileCheck.read(path) }

  func truncate(to length: Int) throws {
    #if canImport(Glibc)
      let truncated = Glibc.truncate(path, off_t(length))
    #else
      let truncated = Darwin.truncate(path, off_t(length))
    #endif
    guard truncated == 0 else { throw POSIXError(.EIO) }
  }

  func readU64(at offset: Int) -> UInt64 {
    bytes.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: offset, as: UInt64.self) }
  }

  func writeU64(_ value: UInt64, at offset: Int) throws {
    let fd = open(path, O_RDWR)
    guard fd >= 0 else { throw POSIXError(.EIO) }
    defer { close(fd) }
    var little = value.littleEndian
    guard pwrite(fd, &little, 8, off_t(offset)) == 8 else { throw POSIXError(.EIO) }
  }

  /// Byte offsets of the meta pages' fields (LMDB's layout, see `DataFileCheck`).
  func metaOffset(slot: Int) throws -> Int { slot * Int(try check().metas[0]?.pageSize ?? 4096) }
  static let lastPage = 136
  static let transaction = 144
}

/// One test per kind of damage issue 12 lists for the log itself: each asserts the typed error
/// and, where the file was not damaged, that nothing acknowledged was lost. The stores commit
/// flushed: the damage is to `data.mdb` itself, which a store with a write-ahead segment puts back
/// to its checkpoint or refuses as replaced (SegmentTests, SegmentRecoveryTests).
@Suite(.timeLimit(.minutes(20))) struct DamageTests {
  /// A store with `count` events appended one per commit (each commit its own LMDB transaction).
  func makeStore(_ store: TemporaryStore, count: Int, payload: Int = 200) async throws {
    let log = try store.open()
    for i in 0..<count {
      _ = try await log.append(NewEvent(type: "t", payload: Array(repeating: UInt8(i % 251), count: payload)))
    }
    log.close()
  }

  func expectDamaged(
    _ store: TemporaryStore, readOnly: Bool, allowDamage: Bool = false, _ fragment: String,
    sourceLocation: SourceLocation = #_sourceLocation
  ) {
    do {
      let log = try store.open { $0.readOnly = readOnly }
      log.close()
      Issue.record("a damaged store opened", sourceLocation: sourceLocation)
    } catch FerryLogError.damagedStore(let path, let reason) {
      #expect(path == store.path, sourceLocation: sourceLocation)
      #expect(reason.contains(fragment), "\(reason)", sourceLocation: sourceLocation)
    } catch {
      Issue.record("expected damagedStore, got \(error)", sourceLocation: sourceLocation)
    }
  }

  @Test(arguments: [8192, 16384, -2])
  func aTruncatedDataFileIsRefusedBeforeAnyPageIsRead(_ length: Int) async throws {
    let store = TemporaryStore(writeAheadSegment: false)
    defer { store.remove() }
    try await makeStore(store, count: 400)
    let file = DataFile(store)
    try file.truncate(to: length > 0 ? length : file.size / 2)
    let before = file.bytes
    expectDamaged(store, readOnly: true, "truncated")
    expectDamaged(store, readOnly: false, "truncated")
    #expect(file.bytes == before, "a refused open changed the file")
  }

  @Test func aLastPageFieldPastTheFileIsRefusedNotLoopedOn() async throws {
    let store = TemporaryStore(writeAheadSegment: false)
    defer { store.remove() }
    try await makeStore(store, count: 50)
    let file = DataFile(store)
    let check = try file.check()
    let newest = try #require(check.metas.firstIndex { $0 == check.newest })
    let offset = try file.metaOffset(slot: newest) + DataFile.lastPage
    try file.writeU64(file.readU64(at: offset) + (1 << 20), at: offset)
    expectDamaged(store, readOnly: false, "pages it uses")
    expectDamaged(store, readOnly: true, "pages it uses")
    // Opened anyway (salvage mode), the retry loop for the map size is bounded: an error, no hang
    // (a hang is caught by the suite's time limit).
    do {
      let log = try store.open {
        $0.readOnly = true
        $0.allowDamage = true
      }
      _ = try? log.head()
      log.close()
    } catch {
      #expect(error is FerryLogError, "\(error)")
    }
  }

  @Test func anOlderMetaPageDamagedOutOfSequenceIsRefused() async throws {
    let store = TemporaryStore(writeAheadSegment: false)
    defer { store.remove() }
    try await makeStore(store, count: 20)
    let file = DataFile(store)
    let check = try file.check()
    let newest = try #require(check.metas.firstIndex { $0 == check.newest })
    let older = 1 - newest
    let offset = try file.metaOffset(slot: older) + DataFile.transaction
    // A high bit flipped: LMDB alone would take this page as the newest state.
    try file.writeU64(file.readU64(at: offset) ^ (1 << 40), at: offset)
    expectDamaged(store, readOnly: true, "not consecutive")
    expectDamaged(store, readOnly: false, "not consecutive")
  }

  /// The hard case: the older meta page damaged into exactly the next transaction id (t−1 → t+1
  /// by one bit): both meta checks pass, LMDB picks the older state and the newest commit is gone.
  /// Only the head mark, kept outside LMDB's snapshot, can tell.
  @Test func anOlderMetaPageDamagedIntoTheNewestIsALostCommit() async throws {
    let store = TemporaryStore(writeAheadSegment: false)
    defer { store.remove() }
    let log = try store.open()
    var acknowledged: UInt64 = 0
    var slots: (older: Int, olderTxn: UInt64, newestTxn: UInt64)?
    for i in 0..<64 {
      acknowledged = try await log.append(NewEvent(type: "t", payload: [UInt8(i)]))
      let check = try DataFile(store).check()
      guard let zero = check.metas[0], let one = check.metas[1] else { continue }
      let (older, olderTxn, newestTxn) =
        zero.transaction < one.transaction
        ? (0, zero.transaction, one.transaction) : (1, one.transaction, zero.transaction)
      // t−1 + 2 is t−1 with bit 1 set when bit 1 is clear: one bit flip away.
      if olderTxn & 2 == 0 && newestTxn == olderTxn + 1 && i >= 4 {
        slots = (older, olderTxn, newestTxn)
        break
      }
    }
    log.close()
    let (older, olderTxn, newestTxn) = try #require(slots)
    let file = DataFile(store)
    let offset = try file.metaOffset(slot: older) + DataFile.transaction
    try file.writeU64(olderTxn ^ 2, at: offset)
    #expect(olderTxn ^ 2 == newestTxn + 1)
    #expect(try file.check().problem == nil, "the meta pages must look healthy: only the mark can tell")
    let before = file.bytes
    for readOnly in [true, false] {
      do {
        let reopened = try store.open { $0.readOnly = readOnly }
        reopened.close()
        Issue.record("a store that lost its newest commit opened (readOnly: \(readOnly))")
      } catch FerryLogError.lostCommits(_, let marked, let found) {
        #expect(marked == acknowledged)
        #expect(found < acknowledged)
      }
    }
    #expect(file.bytes == before, "nothing may be written to a store that lost commits")
    // Salvage mode still reads what is left.
    let salvage = try store.open {
      $0.readOnly = true
      $0.allowDamage = true
    }
    #expect(try salvage.head() < acknowledged)
    salvage.close()
  }

  @Test func aDataFileReplacedByAnOlderCopyIsALostCommit() async throws {
    let store = TemporaryStore(writeAheadSegment: false)
    defer { store.remove() }
    try await makeStore(store, count: 10)
    let copy = store.path + "/../" + URL(fileURLWithPath: store.path).lastPathComponent + ".old-data"
    defer { try? FileManager.default.removeItem(atPath: copy) }
    try FileManager.default.copyItem(atPath: store.path + "/data.mdb", toPath: copy)
    try await makeStore(store, count: 5)
    try FileManager.default.removeItem(atPath: store.path + "/data.mdb")
    try FileManager.default.copyItem(atPath: copy, toPath: store.path + "/data.mdb")
    #expect(throws: FerryLogError.self) { try store.open() }
    do {
      _ = try store.open { $0.readOnly = true }
    } catch FerryLogError.lostCommits(_, let acknowledged, let found) {
      #expect(acknowledged == 15)
      #expect(found == 10)
    }
  }

  @Test func anEmptyOrMissingDataFileNeverBecomesANewStore() async throws {
    let store = TemporaryStore(writeAheadSegment: false)
    defer { store.remove() }
    try await makeStore(store, count: 10)
    let file = DataFile(store)
    try file.truncate(to: 0)
    expectDamaged(store, readOnly: false, "empty (0 bytes) but this directory held a store")
    expectDamaged(store, readOnly: true, "empty (0 bytes)")
    #expect(file.size == 0, "no new store was made in its place")
    try FileManager.default.removeItem(atPath: file.path)
    expectDamaged(store, readOnly: false, "data.mdb is missing")
    #expect(!FileManager.default.fileExists(atPath: file.path))
  }

  @Test func aCreationKilledBeforeLMDBWroteItsMetaPagesIsFinished() throws {
    let store = TemporaryStore(writeAheadSegment: false)
    defer { store.remove() }
    // What a creation killed right after LMDB created data.mdb leaves: the creation mark, an empty
    // data file and the lock file.
    try FileManager.default.createDirectory(atPath: store.path, withIntermediateDirectories: false)
    HeadMark.write(HeadMark.Contents(storeId: HeadMark.creatingId, head: 0), in: store.path)
    #expect(FileManager.default.createFile(atPath: store.path + "/data.mdb", contents: Data()))
    let log = try store.open()
    #expect(log.wasCreated)
    #expect(try log.head() == 0)
    log.close()
    // Read-only, the same leftovers are not a store yet.
    let other = TemporaryStore(writeAheadSegment: false)
    defer { other.remove() }
    try FileManager.default.createDirectory(atPath: other.path, withIntermediateDirectories: false)
    #expect(FileManager.default.createFile(atPath: other.path + "/data.mdb", contents: Data()))
    expectDamaged(other, readOnly: true, "empty (0 bytes)")
  }

  @Test func aDataFileOfAnotherStoreIsRefused() async throws {
    let first = TemporaryStore(writeAheadSegment: false)
    let second = TemporaryStore(writeAheadSegment: false)
    defer {
      first.remove()
      second.remove()
    }
    try await makeStore(first, count: 3)
    try await makeStore(second, count: 3)
    try FileManager.default.removeItem(atPath: second.path + "/data.mdb")
    try FileManager.default.copyItem(atPath: first.path + "/data.mdb", toPath: second.path + "/data.mdb")
    expectDamaged(second, readOnly: true, "belongs to another store")
    expectDamaged(second, readOnly: false, "belongs to another store")
  }

  @Test func aRecordStoredUnderTheWrongKeyIsCaughtByEveryRead() async throws {
    let store = TemporaryStore(writeAheadSegment: false)
    defer { store.remove() }
    try await makeStore(store, count: 10)
    try store.withRawEnvironment(["events"]) { env in
      let events = try env.database("events")
      try env.write { txn in
        let five = try #require(try txn.get(events, key: UInt64(5).bigEndianBytes))
        try txn.put(events, key: UInt64(6).bigEndianBytes, value: five)
      }
    }
    let log = try store.open { $0.readOnly = true }
    defer { log.close() }
    #expect(throws: FerryLogError.self) { try log.event(at: 6) }
    #expect(throws: FerryLogError.self) { try log.forEachEvent { _ in } }
    #expect(throws: FerryLogError.self) { try log.forEachRecord { _ in } }
    #expect(throws: FerryLogError.self) { try log.events(after: 0) }
    let report = try log.verify()
    #expect(!report.isHealthy)
    #expect(report.problems.first?.sequence == 6)
    #expect("\(report.problems)".contains("written as sequence 5"))
  }

  @Test func aMissingEventIsCaughtByEveryScan() async throws {
    let store = TemporaryStore(writeAheadSegment: false)
    defer { store.remove() }
    try await makeStore(store, count: 10)
    try store.withRawEnvironment(["events"]) { env in
      let events = try env.database("events")
      try env.write { txn in _ = try txn.delete(events, key: UInt64(4).bigEndianBytes) }
    }
    // The open counts the records against the head and names the first missing one...
    do {
      try store.open { $0.readOnly = true }.close()
      Issue.record("a log with a missing record opened")
    } catch FerryLogError.sequenceGap(let expected, let found) {
      #expect(expected == 4)
      #expect(found == 5)
    }
    // ...and opened anyway, every scan finds it too.
    let log = try store.open {
      $0.readOnly = true
      $0.allowDamage = true
    }
    defer { log.close() }
    for scan in [
      { try log.forEachEvent { _ in } }, { try log.forEachRecord { _ in } }, { _ = try log.events(after: 2) },
    ] as [() throws -> Void] {
      do {
        try scan()
        Issue.record("a scan over a gap succeeded")
      } catch FerryLogError.sequenceGap(let expected, let found) {
        #expect(expected == 4)
        #expect(found == 5)
      }
    }
    #expect(try log.events(after: 4).first?.sequence == 5, "a read that starts past the gap is fine")
    let report = try log.verify()
    #expect(!report.isHealthy)
    #expect(report.problems.first?.sequence == 4)
  }

  /// Inside the compacted range gaps are legal, so a record lost there is caught by counting:
  /// the log holds exactly `head − removed` records.
  @Test func aRecordLostInsideTheCompactedRangeIsCaughtByCounting() async throws {
    let store = TemporaryStore(writeAheadSegment: false)
    defer { store.remove() }
    try await makeStore(store, count: 30)
    do {
      let log = try store.open()
      _ = try await log.compact { $0.sequence % 3 == 0 }  // removes 10 of 30 on purpose
      log.close()
    }
    try store.withRawEnvironment(["events"]) { env in
      let events = try env.database("events")
      try env.write { txn in _ = try txn.delete(events, key: UInt64(8).bigEndianBytes) }
    }
    do {
      try store.open { $0.readOnly = true }.close()
      Issue.record("a log missing a record it should hold opened")
    } catch FerryLogError.damagedStore(_, let reason) {
      #expect(reason.contains("holds 19 records"), "\(reason)")
    }
    let log = try store.open {
      $0.readOnly = true
      $0.allowDamage = true
    }
    defer { log.close() }
    do {
      try log.forEachEvent { _ in }
      Issue.record("a whole-log scan missed a record silently")
    } catch FerryLogError.damagedStore(_, let reason) {
      #expect(reason.contains("met 19 records"), "\(reason)")
    }
    let report = try log.verify()
    #expect(
      report.problems.contains { "\($0)".contains("holds 19 records") && $0.isDamage }, "\(report.problems)")
  }

  @Test func twoProcessesCreatingOneStoreBothSucceed() async throws {
    for round in 0..<5 {
      let store = TemporaryStore("create\(round)", writeAheadSegment: false)
      defer { store.remove() }
      let workers = try (0..<6).map { _ in
        let process = Process()
        process.executableURL = productURL("ferry-test-worker")
        process.arguments = ["append", store.path, "3"]
        process.standardOutput = FileHandle.nullDevice
        let errors = Pipe()
        process.standardError = errors
        try process.run()
        return (process, errors)
      }
      for (process, errors) in workers {
        process.waitUntilExit()
        let message = String(decoding: errors.fileHandleForReading.readAll(), as: UTF8.self)
        #expect(process.terminationStatus == 0, "round \(round): \(message)")
      }
      let log = try store.open()
      #expect(try log.head() == 18)
      #expect(try log.verify().isHealthy)
      log.close()
    }
  }

  @Test func aFormatOneStoreIsRaisedToFormatTwoOnlyByAWrite() async throws {
    let store = TemporaryStore(writeAheadSegment: false)
    defer { store.remove() }
    try await makeStore(store, count: 3)
    func format() throws -> UInt32? {
      var result: UInt32?
      try store.withRawEnvironment(["meta"]) { env in
        let meta = try env.database("meta")
        result = try env.read { txn in try txn.get(meta, key: Array("format".utf8)) }.flatMap {
          UInt32(bigEndianBytes: $0)
        }
      }
      return result
    }
    #expect(try format() == EventLog.storeFormatVersion)
    try store.withRawEnvironment(["meta"]) { env in
      let meta = try env.database("meta")
      try env.write { try $0.put(meta, key: Array("format".utf8), value: UInt32(1).bigEndianBytes) }
    }
    try store.open { $0.readOnly = true }.close()
    #expect(try format() == 1, "a read-only open writes nothing")
    try store.open().close()
    #expect(try format() == 2)
  }

  @Test func storageFailuresBecomeTypedErrorsWithAdvice() {
    let path = "/some/store"
    let full = FerryLogError(LMDBError(code: ENOSPC, message: "no space"), path: path)
    guard case .diskFull = full else {
      Issue.record("\(full)")
      return
    }
    #expect(full.description.contains("nothing acknowledged was lost"))
    #expect(full.description.contains("free some space"))
    let quota = FerryLogError(LMDBError(code: EDQUOT, message: "quota"), path: path)
    #expect(quota.description.contains("quota"))
    let io = FerryLogError(LMDBError(code: EIO, message: "Input/output error"), path: path)
    #expect(io.description.contains("input/output error"))
    let denied = FerryLogError(LMDBError(code: EACCES, message: "denied"), path: path)
    guard case .permissionDenied = denied else {
      Issue.record("\(denied)")
      return
    }
    let corrupted = FerryLogError(LMDBError.corrupted, path: path)
    guard case .damagedStore = corrupted else {
      Issue.record("\(corrupted)")
      return
    }
  }

  /// A real full disk: a tmpfs (root only; skipped, saying so, where mounting is not allowed). At
  /// 2 MiB the write-ahead segment's 8 MiB file does not fit and the store commits flushed; at
  /// 16 MiB it does, and the disk fills under the segment's unflushed LMDB commits.
  @Test(arguments: [2, 16]) func aFullDiskIsATypedErrorAndLosesNothing(mebibytes: Int) async throws {
    let mountPoint =
      FileManager.default.temporaryDirectory.path + "/ferry-full-\(UUID().uuidString.prefix(8))"
    try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: false)
    defer { try? FileManager.default.removeItem(atPath: mountPoint) }
    let mount = Process()
    mount.executableURL = URL(fileURLWithPath: "/bin/mount")
    mount.arguments = ["-t", "tmpfs", "-o", "size=\(mebibytes)m", "tmpfs", mountPoint]
    mount.standardError = FileHandle.nullDevice
    guard (try? mount.run()) != nil else {
      print("disk full: skipped (cannot run mount)")
      return
    }
    mount.waitUntilExit()
    guard mount.terminationStatus == 0 else {
      print("disk full: skipped (mounting a tmpfs is not allowed here)")
      return
    }
    defer {
      let unmount = Process()
      unmount.executableURL = URL(fileURLWithPath: "/bin/umount")
      unmount.arguments = [mountPoint]
      try? unmount.run()
      unmount.waitUntilExit()
    }
    let path = mountPoint + "/store"
    var configuration = EventLog.Configuration(projections: [CountByType()])
    configuration.initialMapSize = 64 << 10
    let log = try EventLog.open(at: path, configuration: configuration)
    #expect(EventLog.hasWriteAheadSegment(in: path) == (mebibytes > 8))
    var acknowledged: [UInt64] = []
    var failure: (any Error)?
    for i in 0..<10_000 {
      do {
        acknowledged.append(
          try await log.append(NewEvent(type: "t", payload: Array(repeating: UInt8(i % 256), count: 8_000))))
      } catch {
        failure = error
        break
      }
    }
    log.close()
    let error = try #require(failure)
    guard case FerryLogError.diskFull(let at) = error else {
      Issue.record("expected diskFull, got \(error)")
      return
    }
    #expect(at == path)
    #expect("\(error)".contains("nothing acknowledged was lost"))
    let reopened = try EventLog.open(
      at: path, configuration: EventLog.Configuration(projections: [CountByType()]))
    defer { reopened.close() }
    #expect(try reopened.head() == acknowledged.last)
    var seen = 0
    try reopened.forEachEvent { event in
      #expect(event.payload.first == UInt8((Int(event.sequence) - 1) % 256))
      seen += 1
    }
    #expect(seen == acknowledged.count)
    #expect(try reopened.verify().isHealthy)
    print(
      "disk full (\(mebibytes) MiB): \(acknowledged.count) events acknowledged before ENOSPC, all read back")
  }
}
