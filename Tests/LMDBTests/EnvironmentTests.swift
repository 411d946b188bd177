import Foundation
import Testing

@testable import LMDB

@Suite(.timeLimit(.minutes(20))) struct EnvironmentTests {
  @Test func createsADirectoryOnlyItsOwnerCanOpen() throws {
    let scratch = ScratchDirectory()
    defer { scratch.remove() }
    let path = scratch.path
    let env = try Environment.open(path: path, databases: ["a", "b"])
    #expect(env.wasCreated)
    #expect(try permissions(of: path) == 0o700)
    #expect(try permissions(of: path + "/data.mdb") & 0o077 == 0)
    #expect(try permissions(of: path + "/lock.mdb") & 0o077 == 0)
    #expect(env.openDatabaseNames == ["a", "b"])
    #expect(try env.namedDatabases().sorted() == ["a", "b"])
    env.close()

    let again = try Environment.open(path: path, databases: ["a"])
    #expect(!again.wasCreated)
    again.close()
  }

  @Test func refusesAMissingDirectoryAFileAndAMissingParent() throws {
    let scratch = ScratchDirectory()
    defer { scratch.remove() }
    var options = Environment.Options()
    options.createIfMissing = false
    #expect(throws: LMDBError.noSuchFile) { try Environment.open(path: scratch.path, options: options) }

    var readOnly = Environment.Options()
    readOnly.readOnly = true
    #expect(throws: LMDBError.noSuchFile) { try Environment.open(path: scratch.path, options: readOnly) }

    #expect(throws: LMDBError.noSuchFile) { try Environment.open(path: scratch.child("no/such/parent")) }

    try FileManager.default.createDirectory(atPath: scratch.path, withIntermediateDirectories: true)
    #expect(FileManager.default.createFile(atPath: scratch.child("file"), contents: Data([1, 2, 3])))
    #expect(throws: LMDBError.notADirectory) { try Environment.open(path: scratch.child("file")) }
  }

  @Test func refusesAFileThatIsNotLMDB() throws {
    let scratch = ScratchDirectory()
    defer { scratch.remove() }
    try FileManager.default.createDirectory(atPath: scratch.path, withIntermediateDirectories: true)
    #expect(
      FileManager.default.createFile(
        atPath: scratch.child("data.mdb"), contents: Data(repeating: 0xAB, count: 16384)))
    #expect(throws: LMDBError.invalid) { try Environment.open(path: scratch.path) }
  }

  @Test func refusesASecondOpenInTheSameProcess() throws {
    let scratch = ScratchDirectory()
    defer { scratch.remove() }
    let env = try Environment.open(path: scratch.path)
    #expect(throws: LMDBError.alreadyOpen) { try Environment.open(path: scratch.path) }
    env.close()
    let reopened = try Environment.open(path: scratch.path)
    reopened.close()
  }

  @Test func aReadOnlyEnvironmentRefusesWritesAndMissingDatabases() throws {
    let scratch = ScratchDirectory()
    defer { scratch.remove() }
    let env = try Environment.open(path: scratch.path, databases: ["items"])
    try env.write { try $0.put(env.database("items"), key: [1], value: [2]) }
    env.close()

    var options = Environment.Options()
    options.readOnly = true
    let readOnly = try Environment.open(path: scratch.path, options: options, databases: ["items"])
    defer { readOnly.close() }
    let items = try readOnly.database("items")
    let read1 = try readOnly.read { try $0.get(items, key: [1]) }
    #expect(read1 == [2])
    #expect(throws: LMDBError.permissionDenied) {
      try readOnly.write { try $0.put(items, key: [3], value: [4]) }
    }
    #expect(throws: LMDBError.notFound) { try readOnly.openDatabases(["missing"]) }
  }

  @Test func operationsAfterCloseThrowInsteadOfCrashing() throws {
    let scratch = ScratchDirectory()
    defer { scratch.remove() }
    let env = try Environment.open(path: scratch.path, databases: ["items"])
    let items = try env.database("items")
    env.close()
    env.close()
    #expect(throws: LMDBError.badTransaction) { try env.read { try $0.get(items, key: [1]) } }
    #expect(throws: LMDBError.badTransaction) { try env.info() }
  }

  @Test func growsATinyMapThroughManyTransactionsAndOneLargeOne() throws {
    let scratch = ScratchDirectory()
    defer { scratch.remove() }
    var options = Environment.Options()
    options.initialMapSize = 64 << 10
    let env = try Environment.open(path: scratch.path, options: options, databases: ["items"])
    defer { env.close() }
    let items = try env.database("items")
    let value = [UInt8](repeating: 0x5A, count: 1000)
    for batch in 0..<40 {
      try env.write { txn throws in
        for i in 0..<100 { try txn.put(items, key: UInt32(batch * 100 + i).bigEndianBytes, value: value) }
      }
    }
    // One transaction far larger than the map it starts in: aborted, grown, run again.
    var runs = 0
    try env.write { txn throws in
      runs += 1
      for i in 0..<4000 { try txn.put(items, key: UInt32(100_000 + i).bigEndianBytes, value: value) }
    }
    #expect(runs > 1)
    #expect(env.counters.mapGrowths >= 4)  // 64 KiB to over 8 MiB, each step at least doubling
    #expect(env.mapSize > 8 << 20)
    let count = try env.read { try $0.statistics(items).entries }
    #expect(count == 8000)
    let read2 = try env.read { try $0.get(items, key: UInt32(3999).bigEndianBytes) }
    #expect(read2 == value)
  }

  @Test func aMapAtItsMaximumFailsWithMapFullAndKeepsWhatWasCommitted() throws {
    let scratch = ScratchDirectory()
    defer { scratch.remove() }
    var options = Environment.Options()
    options.initialMapSize = 64 << 10
    options.maxMapSize = 256 << 10
    let env = try Environment.open(path: scratch.path, options: options, databases: ["items"])
    defer { env.close() }
    let items = try env.database("items")
    try env.write { try $0.put(items, key: [0], value: [1, 2, 3]) }
    #expect(throws: LMDBError.mapFull) {
      try env.write { txn throws in
        for i in 0..<1000 {
          try txn.put(items, key: UInt32(i + 1).bigEndianBytes, value: [UInt8](repeating: 1, count: 1000))
        }
      }
    }
    #expect(env.mapSize == 256 << 10)
    let read3 = try env.read { try $0.get(items, key: [0]) }
    #expect(read3 == [1, 2, 3])
    let read4 = try env.read { try $0.statistics(items).entries }
    #expect(read4 == 1)
  }

  @Test func adoptsAMapGrownByAnotherProcess() throws {
    let scratch = ScratchDirectory()
    defer { scratch.remove() }
    var options = Environment.Options()
    options.initialMapSize = 128 << 10
    let env = try Environment.open(path: scratch.path, options: options, databases: ["data"])
    defer { env.close() }
    let data = try env.database("data")
    try env.write { try $0.put(data, key: [1], value: [1]) }

    let worker = try runProduct("ferry-test-worker", ["grow-map", scratch.path, String(4 << 20)])
    #expect(worker.status == 0)
    #expect(worker.output.hasPrefix("mapsize"))

    // The other process wrote past our map: LMDB reports MDB_MAP_RESIZED and we adopt its size.
    let count = try env.read { try $0.statistics(data).entries }
    #expect(count > 64)
    try env.write { try $0.put(data, key: [2], value: [2]) }
    #expect(env.counters.mapAdoptions >= 1)
    #expect(env.mapSize >= 4 << 20)
  }
}
