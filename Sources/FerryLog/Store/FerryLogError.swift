import Foundation
import LMDB

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Everything that can go wrong with an event log, each case with what a person needs to act on it.
///
/// ```swift
/// do { _ = try log.event(at: 42) }
/// catch FerryLogError.corruptRecord(let sequence, let reason) { print("record \(sequence): \(reason)") }
/// ```
public enum FerryLogError: Error, CustomStringConvertible {
  /// There is no directory at the path (and it was not to be created).
  case noSuchStore(path: String)
  /// The path exists but does not hold a Ferry store.
  case notAStore(path: String, reason: String)
  /// The store was written by a newer Ferry; this code refuses to touch it.
  case newerFormat(path: String, found: UInt32, supported: UInt32)
  /// The process runs on an LMDB whose page layout Ferry's own reads of the store's files were
  /// not written for (LMDB's 1.0 line, say): nothing was opened. `found` is the version linked,
  /// `supported` the versions Ferry reads. The app must be built with a supported LMDB.
  case unsupportedLMDB(found: String, supported: String)
  /// The store is already open in this process; close that log before opening it again.
  case alreadyOpen(path: String)
  /// The process may not read or write the store.
  case permissionDenied(path: String, detail: String)
  /// The record at `sequence` failed its CRC or is malformed. Nothing else is read past it.
  case corruptRecord(sequence: UInt64, reason: String)
  /// The record at `sequence` uses a record format newer than this code reads.
  case unsupportedRecordFormat(sequence: UInt64, version: UInt8, supported: UInt8)
  /// The event type is not in the log's ``EventCatalog`` (`sequence` is nil for an event being appended).
  case unknownEventType(type: String, sequence: UInt64?)
  /// The event's schema version is newer than the catalog knows, or has no upcaster path.
  case unsupportedSchemaVersion(type: String, version: UInt16, supported: UInt16, sequence: UInt64?)
  /// An event offered to ``EventLog/append(_:)->UInt64`` is not valid (bad type name, payload too large, ...).
  case invalidEvent(reason: String)
  /// A projection threw while applying the event at `sequence`. In an append, nothing of that
  /// append call was written; other callers in the same group commit were retried without it.
  case projectionFailed(projection: String, sequence: UInt64, underlying: any Error)
  /// A projection or configuration is not valid (duplicate names, bad table names, ...).
  case invalidConfiguration(reason: String)
  /// A projection is missing, stored at another version, or behind the log, and this call could
  /// not bring it to the head: a read-only store, a read nested in another read or on the writer's
  /// thread, a writer held up past the read's wait (``EventLog/read(_:)``), or — for appends too —
  /// a projection another process keeps at another version.
  case projectionNotCurrent(projection: String, reason: String)
  /// A projection table was asked for that the projection did not declare.
  case unknownTable(projection: String, table: String)
  /// The sequence numbers of the log are not contiguous: `expected` is missing and `found` follows
  /// it (nil when the log ends early).
  case sequenceGap(expected: UInt64, found: UInt64?)
  /// The state asked for lies before the newest compaction: the events it needs were removed.
  case historyCompacted(through: UInt64)
  /// A snapshot cannot be used (missing, of another version, or failing its CRC) where the log
  /// was compacted, so the projection cannot be rebuilt exactly.
  case snapshotUnusable(projection: String, reason: String)
  /// The log was closed; no more appends are taken.
  case closed
  /// The store is suspended (`EventLog.suspend()`, `FerryStore.suspend()`): it holds no lock and
  /// has no environment open, so nothing is read or written until it is resumed. A call made
  /// while suspended, or overtaken by the suspension, fails with this at once; call it again
  /// after resuming.
  case suspended
  /// The store's files are damaged in a way that makes reading them unsafe or untrustworthy (a
  /// data file shorter than its meta page says, meta pages that disagree, a read that crashed).
  /// `ferry salvage` builds a new store from what is left.
  case damagedStore(path: String, reason: String)
  /// The store holds fewer events than it acknowledged before: its newest commits were lost (an
  /// LMDB meta page rolled back, or a data file restored from an older copy). Nothing is written
  /// to such a store; `ferry salvage` recovers what is left into a new one.
  case lostCommits(path: String, acknowledged: UInt64, found: UInt64)
  /// The store's write-ahead segment holds commits past its last checkpoint, which only a
  /// read-write open can replay (`Specs/one-sync-commit.md`): the process that wrote them died,
  /// or the machine lost power. Open it read-write once; nothing is lost.
  case needsRecovery(path: String)
  /// A read-only open asked for a recovered copy of a store that needs recovery
  /// (``EventLog/Configuration/recoveredCopyIfNeeded``), and none could be made: no room in the
  /// temporary directory, a copy or replay that failed. The store itself was neither read as it
  /// stands nor written; `reason` says what failed.
  case recoveredCopyFailed(path: String, reason: String)
  /// The disk is full (`ENOSPC`). Nothing acknowledged was lost: the failed write was not acknowledged.
  case diskFull(path: String)
  /// The user's disk quota is used up (`EDQUOT`). Nothing acknowledged was lost.
  case quotaExceeded(path: String)
  /// The device reported an input/output error (`EIO`): the disk or file system is failing.
  case ioError(path: String, detail: String)
  /// LMDB (or the operating system beneath it) failed in a way none of the cases above names.
  case storage(StorageFailure)

  /// A one-line message for people.
  public var description: String {
    switch self {
    case .noSuchStore(let path):
      return "no Ferry store at \(path): the directory (or its parent) does not exist"
    case .notAStore(let path, let reason): return "\(path) is not a Ferry store: \(reason)"
    case .newerFormat(let path, let found, let supported):
      return
        "the store at \(path) has format \(found), newer than the \(supported) this version of Ferry reads; upgrade Ferry to open it"
    case .unsupportedLMDB(let found, let supported):
      return
        "this process runs on LMDB \(found), whose page layout Ferry's checks of a store's files were not "
        + "written for; Ferry supports \(supported): build the app with one of those (nothing was opened)"
    case .alreadyOpen(let path): return "the store at \(path) is already open in this process"
    case .permissionDenied(let path, let detail): return "permission denied for \(path): \(detail)"
    case .corruptRecord(let sequence, let reason): return "corrupt record at sequence \(sequence): \(reason)"
    case .unsupportedRecordFormat(let sequence, let version, let supported):
      return
        "record at sequence \(sequence) has format \(version), newer than the \(supported) this version of Ferry reads"
    case .unknownEventType(let type, let sequence):
      return "unknown event type '\(type)'" + (sequence.map { " at sequence \($0)" } ?? "")
    case .unsupportedSchemaVersion(let type, let version, let supported, let sequence):
      return
        "event type '\(type)' schema version \(version) is not readable (this code knows up to \(supported))"
        + (sequence.map { " at sequence \($0)" } ?? "")
    case .invalidEvent(let reason): return "invalid event: \(reason)"
    case .projectionFailed(let projection, let sequence, let underlying):
      return "projection '\(projection)' failed on the event at sequence \(sequence): \(underlying)"
    case .invalidConfiguration(let reason): return "invalid configuration: \(reason)"
    case .projectionNotCurrent(let projection, let reason):
      return "projection '\(projection)' is not current: \(reason)"
    case .unknownTable(let projection, let table):
      return "projection '\(projection)' has no table '\(table)' (declare it in `tables`)"
    case .sequenceGap(let expected, let found):
      return "the log has a gap: sequence \(expected) is missing"
        + (found.map { ", \($0) follows" } ?? " and the log ends")
    case .historyCompacted(let through):
      return
        "history up to sequence \(through) was compacted: the earliest state that can be shown is as of \(through)"
    case .snapshotUnusable(let projection, let reason):
      return "the snapshot of '\(projection)' cannot be used: \(reason)"
    case .closed: return "the event log is closed"
    case .suspended: return "the store is suspended: resume it before reading or writing"
    case .damagedStore(let path, let reason):
      if reason.contains("data.mdb is missing") {
        return
          "the store at \(path) is damaged: \(reason); restore data.mdb from a copy (there is nothing to salvage)"
      }
      return
        "the store at \(path) is damaged: \(reason); `ferry salvage \(path) NEW_DIR` recovers what is left into a new store"
    case .needsRecovery(let path):
      return
        "the store at \(path) has commits that only its write-ahead segment holds (its writer died or the machine lost power), which a read-only open cannot show: run `ferry recover \(path)` to replay them (it writes; on read-only media recover a copy, or `ferry salvage` it)"
    case .recoveredCopyFailed(let path, let reason):
      return
        "the store at \(path) has commits that only its write-ahead segment holds (its writer died or the machine lost power), and no recovered copy of it could be made to read: \(reason); the store is untouched: `ferry recover \(path)` replays it in place"
    case .lostCommits(let path, let acknowledged, let found):
      return
        "the store at \(path) lost its newest commits: it had acknowledged events up to sequence \(acknowledged), "
        + "its log now ends at \(found) (a meta page rolled back, the data file was replaced by an older copy, "
        + "or a copy took data.mdb before ferry-head while an app was writing); nothing was written to it — "
        + "for a copy, copy the store again with the app closed (or `ferry export` it); "
        + "`ferry salvage \(path) NEW_DIR` recovers what is left"
    case .diskFull(let path):
      return
        "the disk holding \(path) is full: free some space and try again; nothing acknowledged was lost"
    case .quotaExceeded(let path):
      return
        "the disk quota for \(path) is used up: free some space or raise the quota and try again; nothing acknowledged was lost"
    case .ioError(let path, let detail):
      return
        "the disk holding \(path) reported an input/output error (\(detail)): the device or file system is failing; "
        + "copy the store elsewhere (`ferry export`) and check the disk"
    case .storage(let error): return "storage error: \(error)"
    }
  }
}

extension FerryLogError {
  /// Wraps any error from the storage layer, passing Ferry's own errors through.
  static func wrap(_ error: any Error, path: String) -> any Error {
    if let lmdb = error as? LMDBError { return FerryLogError(lmdb, path: path) }
    return error
  }

  /// The typed error for a storage failure: damage, a full disk, a used-up quota and I/O errors
  /// get their own cases (with advice); anything else stays ``storage(_:)``.
  package init(_ error: LMDBError, path: String) {
    switch error.code {
    case LMDBError.corrupted.code, LMDBError.pageNotFound.code, LMDBError.cursorFull.code:
      self = .damagedStore(path: path, reason: error.message)
    case ENOSPC: self = .diskFull(path: path)
    case EDQUOT: self = .quotaExceeded(path: path)
    case EIO:
      // LMDB reports a short write (what a full disk gives part-way through a commit's pages) as
      // EIO: a file system with next to no space left was full, not failing.
      var info = statvfs()
      if statvfs(path, &info) == 0, UInt64(info.f_bavail) * UInt64(info.f_frsize) < 1 << 20 {
        self = .diskFull(path: path)
      } else {
        self = .ioError(path: path, detail: error.message)
      }
    case EACCES, EPERM, EROFS: self = .permissionDenied(path: path, detail: error.message)
    default: self = .storage(StorageFailure(error))
    }
  }
}

extension FerryLogError: LocalizedError {
  /// The one-line message, so that `localizedDescription` carries it.
  public var errorDescription: String? { description }
}

/// A failure of the storage engine beneath the log (LMDB, or the operating system under it) that
/// no case of ``FerryLogError`` names: its code and message, as the engine gave them. FerryLog's
/// API shows this instead of the engine's own error type, so an app depends on Ferry's types only.
public struct StorageFailure: Error, Sendable, Equatable, CustomStringConvertible {
  /// The engine's return code (LMDB's `MDB_*`, negative) or an `errno` value (positive).
  public let code: Int32
  /// The code's symbolic name (`MDB_MAP_FULL`, `ENOENT`, …).
  public let name: String
  /// The engine's message, with what Ferry was doing.
  public let message: String

  /// A failure with these parts.
  public init(code: Int32, name: String, message: String) {
    self.code = code
    self.name = name
    self.message = message
  }

  package init(_ error: LMDBError) {
    self.init(code: error.code, name: error.name, message: error.message)
  }

  /// Whether LMDB said its pages are damaged: a page that points nowhere or holds what no page
  /// can (`MDB_PAGE_NOTFOUND`, `MDB_CORRUPTED`), as a scribbled-over page gives — or a transaction
  /// it gave up on (`MDB_BAD_TXN`), which in a read is what follows one of those caught on the way.
  public var isDamage: Bool {
    code == LMDBError.corrupted.code || code == LMDBError.badTransaction.code
      || code == LMDBError.pageNotFound.code
  }

  /// The name, the code and the message.
  public var description: String { "\(name) (\(code)): \(message)" }
}
