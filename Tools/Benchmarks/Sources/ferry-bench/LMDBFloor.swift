import FerryLog
import Foundation
import LMDB

/// The bare LMDB floor: the same records put straight into a database, no Ferry in between.
final class LMDBFloor {
  let environment: Environment
  let events: Database
  var next: UInt64 = 1

  init(path: String) throws {
    environment = try Environment.open(path: path, databases: ["events"])
    events = try environment.database("events")
  }

  /// One record per durable commit.
  func singleCommits(_ count: Int, recordSize: Int) throws {
    let value = [UInt8](repeating: 0x5A, count: recordSize)
    for _ in 0..<count {
      try environment.write { txn in
        try txn.put(events, key: next.bigEndianBytes, value: value, flags: .append)
      }
      next += 1
    }
  }

  /// `count` records in durable commits of `batch` records each.
  func batches(_ count: Int, batch: Int, recordSize: Int) throws {
    let value = [UInt8](repeating: 0x5A, count: recordSize)
    try Self.inCommits(environment, count: count, batch: batch) { txn in
      try txn.put(events, key: next.bigEndianBytes, value: value, flags: .append)
      next += 1
    }
  }

  /// `count` items in durable commits of `batch` items each: `item` writes one, `end` closes each
  /// commit's transaction.
  static func inCommits(
    _ environment: Environment, count: Int, batch: Int, item: (Transaction) throws -> Void,
    end: (Transaction) throws -> Void = { _ in }
  ) throws {
    var left = count
    while left > 0 {
      let size = min(batch, left)
      try environment.write { txn in
        for _ in 0..<size { try item(txn) }
        try end(txn)
      }
      left -= size
    }
  }

  /// The same commits with what a Ferry add writes beside its record (`Specs/task-events.md`,
  /// storage-layout.md): the record appended to `events`, two 12-byte projection positions
  /// rewritten in `meta`, a task row of about the record's size appended to `tasks` and a 9-byte
  /// key to `ready` — four B-trees in one commit where the plain floor has one. `batch` adds a
  /// commit (1: one durable commit per add).
  static func addShapedCommits(path: String, count: Int, batch: Int, recordSize: Int) throws -> Double {
    let environment = try Environment.open(path: path, databases: ["events", "meta", "tasks", "ready"])
    defer { environment.close() }
    let events = try environment.database("events")
    let meta = try environment.database("meta")
    let tasks = try environment.database("tasks")
    let ready = try environment.database("ready")
    let record = [UInt8](repeating: 0x5A, count: recordSize)
    let position = [UInt8](repeating: 0x01, count: 12)
    var next: UInt64 = 1
    let start = ContinuousClock.now
    try inCommits(environment, count: count, batch: batch) { txn in
      try txn.put(events, key: next.bigEndianBytes, value: record, flags: .append)
      try txn.put(tasks, key: next.bigEndianBytes, value: record, flags: .append)
      try txn.put(ready, key: [2] + next.bigEndianBytes, value: [], flags: .append)
      next += 1
    } end: { txn in
      try txn.put(meta, key: Array("projection:taskQueue".utf8), value: position)
      try txn.put(meta, key: Array("projection:cacheAges".utf8), value: position)
    }
    let elapsed = ContinuousClock.now - start
    let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    return Double(count) / max(seconds, 1e-9)
  }

  /// Walks every record with a cursor, touching each value; returns how many.
  static func scan(path: String) throws -> Int {
    var options = Environment.Options()
    options.readOnly = true
    let environment = try Environment.open(path: path, options: options, databases: ["events"])
    defer { environment.close() }
    let events = try environment.database("events")
    var count = 0
    var checksum = 0
    try environment.read { txn in
      try txn.withCursor(events) { cursor in
        try cursor.scan(from: nil) { _, value in
          count += 1
          checksum &+= Int(value[0])
          return true
        }
      }
    }
    return checksum == -1 ? 0 : count
  }

  func close() { environment.close() }
}

/// The disk's own floor for a one-flush commit: `count` frames of `size` bytes written one after
/// another into a preallocated file, each followed by `fdatasync` — what a write-ahead segment's
/// commit (or a SQLite WAL commit) cannot beat. Returns frames a second.
func bareFlushes(path: String, count: Int, size: Int) throws -> Double {
  let fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
  guard fd >= 0 else { throw POSIXError(.EIO) }
  defer {
    close(fd)
    unlink(path)
  }
  let frame = [UInt8](repeating: 0x5A, count: max(1, size))
  #if canImport(Darwin)
    // No `posix_fallocate` there: the file is written whole once; and `F_FULLFSYNC` is the flush
    // that reaches the medium, as Ferry's segment uses it.
    for index in 0..<count {
      let wrote = frame.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(index * frame.count)) }
      guard wrote == frame.count else { throw POSIXError(.EIO) }
    }
    guard fsync(fd) == 0 else { throw POSIXError(.EIO) }
    let flush = { fcntl(fd, F_FULLFSYNC) == 0 }
  #else
    guard posix_fallocate(fd, 0, off_t(frame.count * count)) == 0, fsync(fd) == 0 else {
      throw POSIXError(.EIO)
    }
    let flush = { fdatasync(fd) == 0 }
  #endif
  let start = ContinuousClock.now
  for index in 0..<count {
    let wrote = frame.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(index * frame.count)) }
    guard wrote == frame.count, flush() else { throw POSIXError(.EIO) }
  }
  let elapsed = ContinuousClock.now - start
  return Double(count) / (Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
}
