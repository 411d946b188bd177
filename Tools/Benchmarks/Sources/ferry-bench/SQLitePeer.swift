import Foundation
import GRDB

/// The same queue on SQLite through GRDB, as Wendy-Android and Wendy classic keep theirs: WAL,
/// `synchronous = FULL`, one transaction per add and per run result. A head-of-group flag kept up
/// to date and a partial index make finding the next runnable task one index probe.
final class SQLitePeer: Sendable {
  let pool: DatabasePool

  /// `durable: false` leaves the writer as GRDB sets up a pool (`synchronous = NORMAL`), for the
  /// one reference line that shows what that costs and buys.
  init(path: String, durable: Bool = true) throws {
    var configuration = Configuration()
    configuration.prepareDatabase { db in
      try db.execute(sql: "PRAGMA synchronous = FULL")  // readers; the writer is set below
    }
    pool = try DatabasePool(path: path, configuration: configuration)
    // GRDB turns a pool's writer to `synchronous = NORMAL` when it sets up WAL mode, after
    // `prepareDatabase` ran: a WAL commit is then flushed only at checkpoints, not durable when it
    // returns. Set FULL again on the writer (one flush of the WAL per commit, like Ferry's flushes)
    // and check that it holds; the benchmark refuses to compare against anything less.
    try pool.writeWithoutTransaction { db in
      if durable { try db.execute(sql: "PRAGMA synchronous = FULL") }
      let level = try Int.fetchOne(db, sql: "PRAGMA synchronous")
      guard level == (durable ? 2 : 1) else {
        throw DatabaseError(
          message:
            "the SQLite peer's writer runs synchronous = \(level.map(String.init) ?? "?"), not \(durable ? "FULL (2)" : "NORMAL (1)")"
        )
      }
    }
    try pool.write { db in
      try db.execute(
        sql: """
          CREATE TABLE IF NOT EXISTS tasks (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            tag TEXT NOT NULL, payload BLOB NOT NULL, dataId TEXT, groupId TEXT,
            manual INTEGER NOT NULL, status INTEGER NOT NULL, attempts INTEGER NOT NULL,
            eligibleAt INTEGER, addedAt INTEGER NOT NULL, isHead INTEGER NOT NULL);
          CREATE INDEX IF NOT EXISTS tasks_runnable ON tasks(id) WHERE status = 0 AND manual = 0 AND isHead = 1;
          CREATE INDEX IF NOT EXISTS tasks_group ON tasks(groupId, id) WHERE groupId IS NOT NULL;
          CREATE INDEX IF NOT EXISTS tasks_unique ON tasks(tag, dataId) WHERE dataId IS NOT NULL;
          CREATE TABLE IF NOT EXISTS errors (taskId INTEGER PRIMARY KEY, message TEXT NOT NULL, recordedAt INTEGER NOT NULL);
          CREATE TABLE IF NOT EXISTS cache (key TEXT PRIMARY KEY, lastSuccess INTEGER, lastAttempt INTEGER, fetchCount INTEGER);
          """)
    }
  }

  private static func insert(_ db: Database, tag: String, payload: Data, groupId: String?) throws -> Int64 {
    let isHead: Bool
    if let groupId {
      isHead =
        try Bool.fetchOne(
          db, sql: "SELECT NOT EXISTS (SELECT 1 FROM tasks WHERE groupId = ?)", arguments: [groupId]) ?? true
    } else {
      isHead = true
    }
    try db.execute(
      sql: """
        INSERT INTO tasks (tag, payload, dataId, groupId, manual, status, attempts, eligibleAt, addedAt, isHead)
        VALUES (?, ?, NULL, ?, 0, 0, 0, NULL, ?, ?)
        """,
      arguments: [tag, payload, groupId, Int64(Date().timeIntervalSince1970 * 1000), isHead])
    return db.lastInsertedRowID
  }

  /// Adds a task in its own durable transaction.
  @discardableResult
  func add(tag: String, payload: Data, groupId: String? = nil) async throws -> Int64 {
    try await pool.write { db in try Self.insert(db, tag: tag, payload: payload, groupId: groupId) }
  }

  /// Adds many tasks in one transaction (for setting up large queues quickly).
  func addMany(_ count: Int, groupOf: @Sendable (Int) -> String?) async throws {
    try await pool.write { db in
      for i in 0..<count {
        _ = try Self.insert(db, tag: "t", payload: Data("{\"n\":\(i)}".utf8), groupId: groupOf(i))
      }
    }
  }

  /// The next runnable task: ready, not manual, first in its group.
  func nextRunnable() throws -> Int64? {
    try pool.read { db in
      try Int64.fetchOne(
        db, sql: "SELECT id FROM tasks WHERE status = 0 AND manual = 0 AND isHead = 1 ORDER BY id LIMIT 1")
    }
  }

  /// A run succeeded: the task leaves, the next of its group becomes the head. One transaction.
  func complete(_ id: Int64) async throws {
    try await pool.write { db in
      let group = try String.fetchOne(db, sql: "SELECT groupId FROM tasks WHERE id = ?", arguments: [id])
      try db.execute(sql: "DELETE FROM tasks WHERE id = ?", arguments: [id])
      if let group {
        try db.execute(
          sql: "UPDATE tasks SET isHead = 1 WHERE id = (SELECT MIN(id) FROM tasks WHERE groupId = ?)",
          arguments: [group])
      }
    }
  }

  /// The serial loop's step at its cheapest: the outcome of one run and the look for the next
  /// runnable task in one write transaction (one flush), as Ferry's loop logs the outcome of one
  /// run and the claim of the next in one commit. Nil when nothing is left to run.
  func completeAndNext(_ id: Int64) async throws -> Int64? {
    try await pool.write { db in
      let group = try String.fetchOne(db, sql: "SELECT groupId FROM tasks WHERE id = ?", arguments: [id])
      try db.execute(sql: "DELETE FROM tasks WHERE id = ?", arguments: [id])
      if let group {
        try db.execute(
          sql: "UPDATE tasks SET isHead = 1 WHERE id = (SELECT MIN(id) FROM tasks WHERE groupId = ?)",
          arguments: [group])
      }
      return try Int64.fetchOne(
        db, sql: "SELECT id FROM tasks WHERE status = 0 AND manual = 0 AND isHead = 1 ORDER BY id LIMIT 1")
    }
  }

  /// Records a user-fixable error: the task (and so its group) is blocked.
  func recordError(_ id: Int64, message: String) async throws {
    try await pool.write { db in
      try db.execute(sql: "UPDATE tasks SET status = 3 WHERE id = ?", arguments: [id])
      try db.execute(
        sql: "INSERT OR REPLACE INTO errors (taskId, message, recordedAt) VALUES (?, ?, ?)",
        arguments: [id, message, Int64(Date().timeIntervalSince1970 * 1000)])
    }
  }

  /// Records the same error on many tasks in one transaction (for setting up large queues quickly).
  func recordErrors(_ ids: [Int64], message: String) async throws {
    try await pool.write { db in
      for id in ids {
        try db.execute(sql: "UPDATE tasks SET status = 3 WHERE id = ?", arguments: [id])
        try db.execute(
          sql: "INSERT OR REPLACE INTO errors (taskId, message, recordedAt) VALUES (?, ?, ?)",
          arguments: [id, message, Int64(Date().timeIntervalSince1970 * 1000)])
      }
    }
  }

  /// The ids of the first `count` tasks.
  func firstIDs(_ count: Int) throws -> [Int64] {
    try pool.read { db in
      try Int64.fetchAll(db, sql: "SELECT id FROM tasks ORDER BY id LIMIT ?", arguments: [count])
    }
  }

  func close() throws { try pool.close() }
}
