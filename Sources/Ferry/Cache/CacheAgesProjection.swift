import FerryLog
import Foundation

/// What the ledger knows about one cache key (`Specs/cache-events.md` §3).
public struct CacheRecord: Sendable, Equatable {
  /// The key.
  public let key: String
  /// When the last successful fetch finished, if any ever did.
  public var lastSuccess: Date? { lastSuccessMs.map(Date.init(unixMilliseconds:)) }
  /// Whether that successful fetch returned nothing.
  public internal(set) var lastSuccessWasEmpty: Bool
  /// When the last fetch, successful or not, finished.
  public var lastAttempt: Date? { lastAttemptMs.map(Date.init(unixMilliseconds:)) }
  /// When the last failed fetch finished, and its message.
  public var lastFailure: (at: Date, message: String)? {
    lastFailureMs.map { (Date(unixMilliseconds: $0.at), $0.message) }
  }
  /// Fetches recorded.
  public internal(set) var fetchCount: UInt64
  /// What the next page needs (the app's own encoding), when the key is paged.
  public internal(set) var nextPage: [UInt8]?
  /// Whether more pages are available.
  public internal(set) var morePagesAvailable: Bool
  /// Whether a task's success made the cache stale after its last successful fetch
  /// (``TaskResult/succeeded(output:invalidating:)``): its next refresh fetches, whatever its age.
  public var isInvalidated: Bool { (invalidatedAt ?? 0) > (lastSuccessAt ?? 0) }
  /// When the last refresh was skipped because tasks it waits for could still run, and how many.
  public var lastSkip: (at: Date, pendingTasks: UInt32)? {
    lastSkipMs.map { (Date(unixMilliseconds: $0.at), $0.pendingTasks) }
  }

  /// The sequence of the last success that made the key stale, and of the last successful fetch.
  package internal(set) var invalidatedAt: UInt64?
  package internal(set) var lastSuccessAt: UInt64?
  /// ``lastSkip`` as the log keeps it.
  package internal(set) var lastSkipMs: (at: Int64, pendingTasks: UInt32)?

  /// ``lastSuccess`` as the log keeps it (Unix milliseconds).
  package internal(set) var lastSuccessMs: Int64?
  /// ``lastAttempt`` as the log keeps it (Unix milliseconds).
  package internal(set) var lastAttemptMs: Int64?
  /// ``lastFailure`` as the log keeps it (Unix milliseconds).
  package internal(set) var lastFailureMs: (at: Int64, message: String)?

  /// Two records are equal when every field is.
  public static func == (lhs: CacheRecord, rhs: CacheRecord) -> Bool {
    lhs.key == rhs.key && lhs.lastSuccessMs == rhs.lastSuccessMs
      && lhs.lastSuccessWasEmpty == rhs.lastSuccessWasEmpty
      && lhs.lastAttemptMs == rhs.lastAttemptMs && lhs.lastFailureMs?.at == rhs.lastFailureMs?.at
      && lhs.lastFailureMs?.message == rhs.lastFailureMs?.message && lhs.fetchCount == rhs.fetchCount
      && lhs.nextPage == rhs.nextPage && lhs.morePagesAvailable == rhs.morePagesAvailable
      && lhs.invalidatedAt == rhs.invalidatedAt && lhs.lastSuccessAt == rhs.lastSuccessAt
      && lhs.lastSkipMs?.at == rhs.lastSkipMs?.at
      && lhs.lastSkipMs?.pendingTasks == rhs.lastSkipMs?.pendingTasks
  }

  init(key: String) {
    self.key = key
    lastSuccessWasEmpty = false
    fetchCount = 0
    morePagesAvailable = false
  }

  var bytes: [UInt8] {
    var writer = PayloadWriter()
    writer.write(lastSuccessMs)
    writer.write(lastSuccessWasEmpty)
    writer.write(lastAttemptMs)
    writer.write(lastFailureMs?.at)
    writer.write(lastFailureMs?.message)
    writer.write(fetchCount)
    writer.write(nextPage != nil)
    if let nextPage { writer.write(bytes: nextPage) }
    writer.write(morePagesAvailable)
    writer.write(invalidatedAt)
    writer.write(lastSuccessAt)
    writer.write(lastSkipMs?.at)
    writer.write(lastSkipMs?.pendingTasks ?? 0)
    return writer.bytes
  }

  init(key: String, bytes: [UInt8]) throws(PayloadError) {
    self.key = key
    var reader = PayloadReader(bytes)
    lastSuccessMs = try reader.readOptional(Int64.self, "lastSuccess")
    lastSuccessWasEmpty = try reader.readBool("lastSuccessWasEmpty")
    lastAttemptMs = try reader.readOptional(Int64.self, "lastAttempt")
    let failureAt = try reader.readOptional(Int64.self, "lastFailureAt")
    let failureMessage = try reader.readOptionalString("lastFailureMessage")
    lastFailureMs = failureAt.map { ($0, failureMessage ?? "") }
    fetchCount = try reader.read(UInt64.self, "fetchCount")
    nextPage = try reader.readBool("hasNextPage") ? try reader.readBytes("nextPage") : nil
    morePagesAvailable = try reader.readBool("morePagesAvailable")
    invalidatedAt = try reader.readOptional(UInt64.self, "invalidatedAt")
    lastSuccessAt = try reader.readOptional(UInt64.self, "lastSuccessAt")
    let skipAt = try reader.readOptional(Int64.self, "lastSkipAt")
    let skipPending = try reader.read(UInt32.self, "lastSkipPendingTasks")
    lastSkipMs = skipAt.map { ($0, skipPending) }
    try reader.finish("a cache record")
  }
}

/// Keys of the cache tables: `keys` by the key's UTF-8, `bySuccess` by time then key.
enum CacheKey {
  static func key(_ key: String) -> [UInt8] { Array(key.utf8) }
  static func bySuccess(_ at: Int64, _ key: String) -> [UInt8] {
    (UInt64(bitPattern: at) ^ (1 << 63)).bigEndianBytes + Array(key.utf8)
  }
  static func decodeBySuccess(_ raw: UnsafeRawBufferPointer) -> (at: Int64, key: String)? {
    guard raw.count > 8, let flipped = UInt64(bigEndianBytes: raw[0..<8]) else { return nil }
    return (Int64(bitPattern: flipped ^ (1 << 63)), String(decoding: raw[8...], as: UTF8.self))
  }
}

/// Cache ages folded from the log: per key its record, and an index of keys by last success.
struct CacheAgesProjection: InPlaceFolding {
  static let projectionName = "cacheAges"
  static let tableNames = ["keys", "bySuccess"]
  // Computed, not stored: a projection with no stored properties fits in its existential's
  // inline buffer, and every fold reaches it through one without copying a box.
  var name: String { Self.projectionName }
  /// 2: a task's success makes keys stale (`task.runSucceeded` v2), and skipped refreshes
  /// (`cache.refreshSkipped`) are kept.
  var version: UInt32 { 2 }
  var tables: [String] { Self.tableNames }

  /// A replay's fold: the other side's events pass without their payload copied.
  func apply(_ header: RecordHeader, payload: UnsafeRawBufferPointer, to tables: ProjectionTables) throws {
    guard Self.folds(header.type) else { return }
    try apply(LoggedEvent(header, payload: Array(payload)), to: tables)
  }

  /// Whether an event of `type` changes the cache's tables: every cache type starts with "c" (one
  /// byte read, where the set's lookup hashed each task event's type).
  private static func folds(_ type: String) -> Bool {
    switch type.utf8.first {
    case UInt8(ascii: "c"): return CacheEvent.typeSet.contains(type)
    case UInt8(ascii: "t"): return type == "task.runSucceeded"
    default: return false
    }
  }

  func apply(_ event: LoggedEvent, to tables: ProjectionTables) throws {
    // The other side's events pass.
    guard Self.folds(event.type) else { return }
    if event.type == "task.runSucceeded" {
      // A push that makes keys stale: their next refresh fetches, whatever their age.
      guard case .runSucceeded(_, let details) = try TaskEvent(event) else { return }
      for key in details.invalidates where Self.isValidKey(key) {
        var record = try Self.record(key, in: tables) ?? CacheRecord(key: key)
        let old = record
        record.invalidatedAt = event.sequence
        try Self.save(record, replacing: old, in: tables)
      }
      return
    }
    switch try CacheEvent(event) {
    case .refreshSkipped(let key, let pendingTasks):
      var record = try Self.record(key, in: tables) ?? CacheRecord(key: key)
      let old = record
      record.lastSkipMs = (event.timestamp, pendingTasks)
      try Self.save(record, replacing: old, in: tables)
    case .fetched(let key, let at, let outcome):
      var record = try Self.record(key, in: tables) ?? CacheRecord(key: key)
      let old = record
      record.lastAttemptMs = at
      record.fetchCount &+= 1
      switch outcome {
      case .success(let isEmpty):
        record.lastSuccessMs = at
        record.lastSuccessWasEmpty = isEmpty
        record.lastSuccessAt = event.sequence
        record.lastSkipMs = nil
      case .failure(let message):
        record.lastFailureMs = (at, message)
      }
      try Self.save(record, replacing: old, in: tables)
    case .forgotten(let key):
      guard let old = try Self.record(key, in: tables) else { return }
      if let at = old.lastSuccessMs { try tables.delete("bySuccess", key: CacheKey.bySuccess(at, key)) }
      try tables.delete("keys", key: CacheKey.key(key))
    case .paging(let key, let next, let more):
      var record = try Self.record(key, in: tables) ?? CacheRecord(key: key)
      let old = record
      record.nextPage = next
      record.morePagesAvailable = more
      try Self.save(record, replacing: old, in: tables)
    }
  }

  /// Whether a cache key named by a task can be a row's key (the ledger validates its own; a
  /// handler's list is checked here, so one bad name never fails a success's commit).
  static func isValidKey(_ key: String) -> Bool { !key.isEmpty && key.utf8.count <= CacheLedger.maxKeyLength }

  static func record(_ key: String, in tables: some ProjectionTableReading) throws -> CacheRecord? {
    try tables.get("keys", key: CacheKey.key(key)).map { try CacheRecord(key: key, bytes: $0) }
  }

  static func save(_ record: CacheRecord, replacing old: CacheRecord, in tables: ProjectionTables) throws {
    if let at = old.lastSuccessMs, at != record.lastSuccessMs {
      try tables.delete("bySuccess", key: CacheKey.bySuccess(at, record.key))
    }
    if let at = record.lastSuccessMs {
      try tables.put("bySuccess", key: CacheKey.bySuccess(at, record.key), value: [])
    }
    try tables.put("keys", key: CacheKey.key(record.key), value: record.bytes)
  }
}
