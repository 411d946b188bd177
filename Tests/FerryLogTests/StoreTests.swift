import Foundation
import LMDB
import Testing

@testable import FerryLog

@Suite(.timeLimit(.minutes(20))) struct StoreTests {
  @Test func aFlippedByteIsReportedWithItsSequenceNumber() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    var log = try store.open()
    for i in 1...20 {
      let text = i == 13 ? "the thirteenth payload" : "payload number \(i)"
      _ = try await log.append(NewEvent(type: "t", payload: payload(text)))
    }
    log.close()

    let offset = try flipByte(
      in: store.path + "/data.mdb", after: payload("the thirteenth payload"), offset: 4)
    #expect(offset != nil)

    log = try store.open()
    defer { log.close() }
    #expect(try log.event(at: 12)?.sequence == 12)
    do {
      _ = try log.event(at: 13)
      Issue.record("a corrupt record was decoded")
    } catch FerryLogError.corruptRecord(let sequence, let reason) {
      #expect(sequence == 13)
      #expect(reason.contains("CRC32C mismatch"))
    }
    #expect(throws: FerryLogError.self) { try log.forEachEvent { _ in } }
    let report = try log.verify()
    #expect(report.problems.count == 1)
    #expect(report.problems.first?.sequence == 13)
    #expect(report.recordsChecked == 12)
  }

  @Test func aStoreOfANewerFormatIsRefusedUntouched() async throws {
    let store = TemporaryStore(writeAheadSegment: false)  // the format is edited in data.mdb
    defer { store.remove() }
    let log = try store.open()
    _ = try await log.append(NewEvent(type: "t", payload: []))
    log.close()
    try store.withRawEnvironment(["meta"]) { env in
      try env.write {
        try $0.put(
          try env.database("meta"), key: Array("format".utf8),
          value: UInt32(EventLog.newestReadableFormat + 1).bigEndianBytes)
      }
    }
    let before = try Data(contentsOf: URL(fileURLWithPath: store.path + "/data.mdb"))
    do {
      _ = try store.open([CountByType(), PayloadsBySequence()])
      Issue.record("a newer store was opened")
    } catch FerryLogError.newerFormat(_, let found, let supported) {
      #expect(found == EventLog.newestReadableFormat + 1)
      #expect(supported == EventLog.newestReadableFormat)
    }
    let after = try Data(contentsOf: URL(fileURLWithPath: store.path + "/data.mdb"))
    #expect(before == after)
  }

  @Test func pathsThatAreNotStoresGetClearErrors() throws {
    let store = TemporaryStore()
    defer { store.remove() }
    #expect(throws: FerryLogError.self) { try store.open { $0.createIfMissing = false } }
    do {
      _ = try store.open { $0.readOnly = true }
    } catch FerryLogError.noSuchStore(let path) {
      #expect(path == store.path)
    }

    try FileManager.default.createDirectory(atPath: store.path, withIntermediateDirectories: true)
    #expect(FileManager.default.createFile(atPath: store.path + "/notes.txt", contents: Data("hello".utf8)))
    do {
      _ = try store.open()
      Issue.record("a directory of other files was taken for a store")
    } catch FerryLogError.notAStore(_, let reason) {
      #expect(reason.contains("notes.txt"))
    }
    #expect(FileManager.default.fileExists(atPath: store.path + "/data.mdb") == false)

    do {
      _ = try EventLog.open(at: store.path + "/notes.txt")
      Issue.record("a file was taken for a store")
    } catch FerryLogError.notAStore {}

    try FileManager.default.removeItem(atPath: store.path + "/notes.txt")
    #expect(
      FileManager.default.createFile(
        atPath: store.path + "/data.mdb", contents: Data(repeating: 7, count: 8192)))
    do {
      _ = try store.open()
      Issue.record("garbage was taken for a store")
    } catch FerryLogError.notAStore {}
  }

  @Test func aPlaceThatCannotBeWrittenIsReportedAsSuch() throws {
    // Root ignores file modes, so as root the store goes where even root may not create a
    // directory (sysfs); anyone else gets a parent directory without write permission.
    let parent = TemporaryStore()
    defer {
      chmod(parent.path, 0o700)
      parent.remove()
    }
    let path: String
    if getuid() == 0 {
      path = "/sys/ferry-test-store-\(getpid())"
    } else {
      try FileManager.default.createDirectory(atPath: parent.path, withIntermediateDirectories: true)
      chmod(parent.path, 0o500)
      path = parent.path + "/store"
    }
    do {
      _ = try EventLog.open(at: path)
      Issue.record("a store was created at \(path)")
    } catch FerryLogError.permissionDenied(let deniedPath, let detail) {
      #expect(deniedPath == path)
      #expect(!detail.isEmpty)
    }
  }

  @Test func anLMDBEnvironmentOfSomethingElseIsNotAStore() throws {
    let store = TemporaryStore()
    defer { store.remove() }
    try store.withRawEnvironment(["customers"]) { _ in }
    do {
      _ = try store.open()
      Issue.record("a foreign LMDB environment was taken for a store")
    } catch FerryLogError.notAStore(_, let reason) {
      #expect(reason.contains("customers"))
    }
  }

  @Test func aStoreOpenTwiceInOneProcessIsRefused() throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open()
    defer { log.close() }
    do {
      _ = try store.open()
      Issue.record("opened twice")
    } catch FerryLogError.alreadyOpen {}
  }

  @Test func aReadOnlyOpenReadsButNeverWrites() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    var log = try store.open([CountByType()])
    for _ in 0..<5 { _ = try await log.append(NewEvent(type: "r", payload: [])) }
    log.close()
    let before = try Data(contentsOf: URL(fileURLWithPath: store.path + "/data.mdb"))

    log = try store.open([CountByType(), PayloadsBySequence()]) { $0.readOnly = true }
    #expect(try log.head() == 5)
    #expect(try counts(log) == ["r": 5])
    #expect(log.staleProjections["payloads"] != nil)
    #expect(throws: FerryLogError.self) { try log.read { try $0.tables(of: "payloads").count("bySequence") } }
    await #expect(throws: FerryLogError.self) { try await log.append(NewEvent(type: "r", payload: [])) }
    let report = try log.verify()
    #expect(report.recordsChecked == 5)
    #expect(report.problems.count == 1)  // the projection this store never had, and nothing else
    #expect(report.problems.first?.description.contains("payloads") == true)
    log.close()
    let after = try Data(contentsOf: URL(fileURLWithPath: store.path + "/data.mdb"))
    #expect(before == after)
  }

  @Test func anotherProcessAppendingIsFoldedIntoThisProcessesProjections() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    var log = try store.open([])
    _ = try await log.append(NewEvent(type: "local", payload: []))
    log.close()

    let (status, output) = try await runProduct("ferry-test-worker", ["append", store.path, "25"])
    #expect(status == 0)
    #expect(output.split(separator: "\n").last == "ack 26")

    log = try store.open([CountByType()])
    defer { log.close() }
    #expect(log.eventsReplayedAtOpen == 26)
    #expect(try counts(log) == ["local": 1, "worker.event": 25])
  }

  @Test func aReadCatchesUpAProjectionAnotherProcessLeftBehind() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open([CountByType()]) { $0.rebuildChunkSize = 10 }
    defer { log.close() }
    _ = try await log.append(NewEvent(type: "local", payload: []))

    // Another process appends 25 events without this process's projection.
    let (status, output) = try await runProduct("ferry-test-worker", ["append", store.path, "25"])
    #expect(status == 0)
    #expect(output.split(separator: "\n").last == "ack 26")
    // Behind, as verify (which never catches up) says…
    let problems = try log.verify().problems
    #expect(problems.contains { "\($0)".contains("countByType") && "\($0)".contains("1") }, "\(problems)")
    // …and a read has this process's writer fold the 25 (in chunks of 10) before it reads.
    #expect(try counts(log) == ["local": 1, "worker.event": 25])
    #expect(try log.verify().isHealthy)
    let next = try await log.append(NewEvent(type: "local", payload: []))
    #expect(next == 27)
    #expect(try counts(log) == ["local": 2, "worker.event": 25])
  }

  /// A read on the writer's own thread outside any transaction (an exclusive job's code), its
  /// projection behind (another process appended without it): it must throw
  /// `projectionNotCurrent` at once, from its own snapshot. Its catch-up would be queued behind the
  /// job it runs in, and it would wait for itself until it gave up — which it did, while the writer
  /// thread was told by its name: on Linux, Foundation's `Thread.current.name` there is not that
  /// name. A read that gave up says so in its reason, so no clock is needed to tell the two apart;
  /// one that hung is ended by the suite's time limit.
  @Test func aReadOnTheWritersOwnThreadThrowsAtOnce() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open([CountByType()])
    defer { log.close() }
    _ = try await log.append(NewEvent(type: "local", payload: []))
    let (status, _) = try await runProduct("ferry-test-worker", ["append", store.path, "25"])
    #expect(status == 0)
    let writer = try #require(log.writer)
    let outcome = await withCheckedContinuation {
      (continuation: CheckedContinuation<Result<[String: UInt64], any Error>, Never>) in
      let accepted = writer.submit(.exclusive { continuation.resume(returning: Result { try counts(log) }) })
      if !accepted { continuation.resume(returning: .failure(FerryLogError.closed)) }
    }
    guard case .failure(FerryLogError.projectionNotCurrent(let projection, let reason)) = outcome else {
      Issue.record("the read on the writer's thread gave \(outcome)")
      return
    }
    #expect(projection == "countByType")
    #expect(
      !reason.contains("did not get to the read"), "the read on the writer's thread waited for it: \(reason)")
    // Off the writer's thread, the same read catches up.
    #expect(try counts(log) == ["local": 1, "worker.event": 25])
  }

  @Test func aProjectionAnotherProcessLeftBehindIsCaughtUpByTheNextAppendOrRead() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open([CountByType()]) { $0.rebuildChunkSize = 10 }
    defer { log.close() }
    _ = try await log.append(NewEvent(type: "local", payload: []))

    // Another process appends 25 events without this process's projection.
    var (status, output) = try await runProduct("ferry-test-worker", ["append", store.path, "25"])
    #expect(status == 0)
    #expect(output.split(separator: "\n").last == "ack 26")
    // 25 behind is more than one chunk of 10: caught up in chunks before the next batch.
    let next = try await log.append(NewEvent(type: "local", payload: []))
    #expect(next == 27)
    #expect(try counts(log) == ["local": 2, "worker.event": 25])

    // Again, and now a read comes first: it has the writer catch the projection up (in chunks)
    // and reads again, rather than refusing (EventLog.read; a read-only open still refuses).
    (status, output) = try await runProduct("ferry-test-worker", ["append", store.path, "25"])
    #expect(status == 0)
    #expect(output.split(separator: "\n").last == "ack 52")
    #expect(try counts(log) == ["local": 2, "worker.event": 50])
    #expect(try log.verify().isHealthy)
  }

  @Test func aCatchUpThatMeetsADamagedRecordFailsTheReadWithItsTypedError() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open([CountByType()])
    defer { log.close() }
    _ = try await log.append(NewEvent(type: "local", payload: []))
    // Another process appends 25 events without this process's projection…
    let (status, _) = try await runProduct("ferry-test-worker", ["append", store.path, "25"])
    #expect(status == 0)
    // …and one of them (sequence 14, "worker 12") is then damaged in place, under this open's map.
    let file = store.path + "/data.mdb"
    let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: file)))
    let needle = Array("worker 12".utf8)
    let offsets = (0...(bytes.count - needle.count)).filter {
      Array(bytes[$0..<($0 + needle.count)]) == needle
    }
    try #require(!offsets.isEmpty)
    let handle = try FileHandle(forUpdating: URL(fileURLWithPath: file))
    for offset in offsets {
      try handle.seek(toOffset: UInt64(offset + 7))
      try handle.write(contentsOf: [bytes[offset + 7] ^ 0xFF])
    }
    try handle.close()

    // The read's catch-up meets it: the read fails with the record's typed error, never serves
    // the rows, and the log around it still reads; verify names it.
    do {
      _ = try counts(log)
      Issue.record("a read was served over a damaged record")
    } catch FerryLogError.corruptRecord(let sequence, _) {
      #expect(sequence == 14)
    }
    #expect(try log.event(at: 13)?.sequence == 13)
    #expect(try log.verify().problems.contains { $0.sequence == 14 })
  }

  @Test func aReadOnlyOpenStillRefusesAProjectionBehindTheLog() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open([CountByType()])
    _ = try await log.append(NewEvent(type: "local", payload: []))
    log.close()
    let (status, _) = try await runProduct("ferry-test-worker", ["append", store.path, "25"])
    #expect(status == 0)
    let reader = try store.open([CountByType()]) { $0.readOnly = true }
    defer { reader.close() }
    do {
      _ = try counts(reader)
      Issue.record("a read-only open served a projection behind the log")
    } catch FerryLogError.projectionNotCurrent(let projection, _) {
      #expect(projection == "countByType")
    }
  }

  @Test func aFirstOpenThatDiedBeforeCreatingDataLeavesAStoreThatOpens() throws {
    let store = TemporaryStore()
    defer { store.remove() }
    try FileManager.default.createDirectory(atPath: store.path, withIntermediateDirectories: true)
    #expect(FileManager.default.createFile(atPath: store.path + "/lock.mdb", contents: Data(count: 8192)))
    let log = try store.open()
    defer { log.close() }
    #expect(log.wasCreated)
    #expect(try log.head() == 0)
  }

  @Test func aTailDeliversThePastThenEachNewEventAndEndsOnClose() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open()
    for i in 0..<3 { _ = try await log.append(NewEvent(type: "old", payload: payload("\(i)"))) }

    let reader = Task { () -> [UInt64] in
      var seen: [UInt64] = []
      for try await event in log.tail(after: 1, chunkSize: 2) {
        seen.append(event.sequence)
      }
      return seen
    }
    for i in 0..<20 { _ = try await log.append(NewEvent(type: "new", payload: payload("\(i)"))) }
    // Let the tail drain what is committed, then close: the sequence ends.
    while true {
      let seen = try log.read { try $0.head() }
      if seen == 23 { break }
    }
    try await Task.sleep(for: .milliseconds(50))
    log.close()
    let seen = try await reader.value
    #expect(seen == Array(2...23))
  }

  @Test func cancellingATailEndsIt() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open()
    defer { log.close() }
    let reader = Task { () -> Int in
      var count = 0
      for try await _ in log.tail() { count += 1 }
      return count
    }
    _ = try await log.append(NewEvent(type: "one", payload: []))
    try await Task.sleep(for: .milliseconds(50))
    reader.cancel()
    let count = try await reader.value
    #expect(count <= 1)
  }
}
