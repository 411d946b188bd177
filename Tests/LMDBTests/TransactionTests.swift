import Testing

@testable import LMDB

@Suite(.timeLimit(.minutes(20))) struct TransactionTests {
  let scratch = ScratchDirectory()

  func withEnvironment(_ body: (Environment, Database) throws -> Void) throws {
    defer { scratch.remove() }
    let env = try Environment.open(path: scratch.path, databases: ["items"])
    defer { env.close() }
    try body(env, try env.database("items"))
  }

  @Test func putGetOverwriteDelete() throws {
    try withEnvironment { env, items in
      try env.write { txn throws in
        try txn.put(items, key: [1], value: [10])
        try txn.put(items, key: [1], value: [11])
        try txn.put(items, key: [2], value: [])
      }
      try env.read { txn throws in
        #expect(try txn.get(items, key: [1]) == [11])
        #expect(try txn.get(items, key: [2]) == [])
        #expect(try txn.get(items, key: [3]) == nil)
      }
      let deleted = try env.write { txn in (try txn.delete(items, key: [1]), try txn.delete(items, key: [9]))
      }
      #expect(deleted == (true, false))
      try env.write { try $0.empty(items) }
      let read1 = try env.read { try $0.statistics(items).entries }
      #expect(read1 == 0)
    }
  }

  @Test func noOverwriteAndOutOfOrderAppendAreRefused() throws {
    try withEnvironment { env, items in
      try env.write { txn throws in
        try txn.put(items, key: [5], value: [1], flags: .append)
        try txn.put(items, key: [6], value: [1], flags: .append)
      }
      #expect(throws: LMDBError.keyExists) {
        try env.write { try $0.put(items, key: [5], value: [2], flags: .noOverwrite) }
      }
      #expect(throws: LMDBError.keyExists) {
        try env.write { try $0.put(items, key: [4], value: [2], flags: .append) }
      }
      let read2 = try env.read { try $0.get(items, key: [5]) }
      #expect(read2 == [1])
    }
  }

  @Test func keysLMDBCannotHoldGetAClearError() throws {
    try withEnvironment { env, items in
      #expect(env.maxKeySize == 511)
      let long = [UInt8](repeating: 1, count: env.maxKeySize + 1)
      do {
        try env.write { try $0.put(items, key: long, value: [1]) }
        Issue.record("a 512-byte key was accepted")
      } catch let error as LMDBError {
        #expect(error == .badValueSize)
        #expect(error.message.contains("512 bytes"))
        #expect(error.message.contains("'items'"))
      }
      #expect(throws: LMDBError.badValueSize) { try env.read { try $0.get(items, key: []) } }
      try env.write { try $0.put(items, key: [UInt8](repeating: 1, count: env.maxKeySize), value: [1]) }
    }
  }

  @Test func aThrowingWriteLeavesNothingBehind() throws {
    struct Boom: Error {}
    try withEnvironment { env, items in
      #expect(throws: Boom.self) {
        try env.write { txn throws in
          try txn.put(items, key: [1], value: [1])
          throw Boom()
        }
      }
      let read3 = try env.read { try $0.get(items, key: [1]) }
      #expect(read3 == nil)
      #expect(env.counters.aborts == 1)
      #expect(env.counters.commits == 1)  // opening the database handles
    }
  }

  @Test func aWriteInsideAWriteIsRefusedInsteadOfHanging() throws {
    try withEnvironment { env, items in
      #expect(throws: LMDBError.badTransaction) {
        try env.write { _ in try env.write { try $0.put(items, key: [1], value: [1]) } }
      }
      // Reading inside a read (a nested snapshot) is fine.
      let nested = try env.read { _ in try env.read { try $0.get(items, key: [1]) } }
      #expect(nested == nil)
      try env.write { try $0.put(items, key: [1], value: [1]) }
    }
  }

  @Test func aTransactionKeptPastItsClosureIsInert() throws {
    try withEnvironment { env, items in
      var escaped: Transaction?
      try env.write { txn in escaped = txn }
      let txn = try #require(escaped)
      #expect(throws: LMDBError.badTransaction) { try txn.put(items, key: [1], value: [1]) }
      #expect(throws: LMDBError.badTransaction) { try txn.get(items, key: [1]) }
    }
  }

  @Test func cursorsWalkInKeyOrder() throws {
    try withEnvironment { env, items in
      try env.write { txn throws in
        for k in [UInt8](arrayLiteral: 30, 10, 20, 40) { try txn.put(items, key: [k], value: [k / 10]) }
      }
      try env.read { txn throws in
        try txn.withCursor(items) { cursor in
          #expect(try cursor.first()?.key == [10])
          #expect(try cursor.next()?.key == [20])
          #expect(try cursor.previous()?.key == [10])
          #expect(try cursor.last()?.key == [40])
          #expect(try cursor.next() == nil)
          #expect(try cursor.seek(atOrAfter: [25])?.key == [30])
          #expect(try cursor.currentKey() == [30])
          #expect(try cursor.seek(atOrAfter: [41]) == nil)
          var seen: [UInt8] = []
          let visited = try cursor.scan(from: [20]) { key, _ in
            seen.append(key[0])
            return seen.count < 2
          }
          #expect(seen == [20, 30])
          #expect(visited == 2)
        }
      }
      try env.write { txn throws in
        try txn.withCursor(items) { cursor in
          _ = try cursor.seek(atOrAfter: [20])
          try cursor.deleteCurrent()
        }
      }
      let read4 = try env.read { try $0.get(items, key: [20]) }
      #expect(read4 == nil)
    }
  }

  @Test func errorsNameTheirCode() {
    #expect(LMDBError.mapFull.name == "MDB_MAP_FULL")
    #expect(LMDBError(code: -30792, operation: "writing").description.contains("MDB_MAP_FULL"))
    #expect(LMDBError(code: -30792, operation: "writing").message.hasPrefix("writing: "))
    #expect(LMDBError(code: 2, operation: nil) == .noSuchFile)
  }
}
