import Ferry
import FerryLog
import Foundation
import LMDB

/// The exit statuses of the `ferry` tool, one per kind of failure.
package enum ExitStatus: Int32, Sendable {
  /// Done, nothing wrong.
  case ok = 0
  /// The command ran and found problems (verify, replay).
  case problemsFound = 1
  /// No directory at the path.
  case noSuchStore = 3
  /// The path holds something that is not a Ferry store.
  case notAStore = 4
  /// The store was written by a newer Ferry.
  case newerFormat = 5
  /// The store is damaged: a record failed its CRC or did not decode, a sequence is missing, the
  /// files disagree with themselves, commits were lost, or reading it crashed.
  case corruptRecord = 6
  /// The store is open elsewhere in a way that prevents this command (already open, permission).
  case unavailable = 7
  /// Bad input: an export file that does not parse, a store that is not empty for import.
  case badInput = 8
  /// Anything else from the storage layer.
  case storageError = 9
  /// An operator command was refused because a run of the task is under way: a runner (in this
  /// process or another) holds it. Nothing was changed for that task; its run goes on and its
  /// outcome is logged as usual.
  case runUnderWay = 10
  /// An operator command was refused because the task is not in the queue, or not in the state
  /// the command needs (revive: dead; resolve: blocked by an error). Nothing was changed for it.
  case notApplicable = 11
  /// A flush to the disk failed (an I/O error, or a file system that refuses it): what the command
  /// wrote may not be on the disk. `compact --copy` then leaves the original store in place.
  case notFlushed = 12
  /// The store's writer died (or the machine lost power) with commits only its write-ahead segment
  /// holds, and the command cannot show them (the read commands read a recovered copy instead):
  /// `ferry recover` replays them. Nothing was read or written.
  case needsRecovery = 13
  /// The store needs recovery (as for 13) and the read command could not make the recovered copy
  /// it reads instead: no room in the temporary directory (`TMPDIR`), or the copy or its replay
  /// failed. The store itself was neither read nor written; `ferry recover` replays it in place.
  case recoveredCopyFailed = 14
  /// Flags that do not parse (the argument parser's own status).
  case badFlags = 64
}

/// A failure of a `ferry` command: a one-line message and its exit status.
package struct ToolError: Error, CustomStringConvertible, Sendable {
  /// The exit status.
  package let status: ExitStatus
  /// The one-line message.
  package let message: String

  /// A failure with a status and message.
  package init(_ status: ExitStatus, _ message: String) {
    self.status = status
    self.message = message
  }

  /// The message.
  package var description: String { message }

  /// Classifies any error from opening or reading a store.
  package static func from(_ error: any Error) -> ToolError {
    if let tool = error as? ToolError { return tool }
    if let log = error as? FerryLogError {
      switch log {
      case .noSuchStore: return ToolError(.noSuchStore, log.description)
      case .notAStore: return ToolError(.notAStore, log.description)
      case .newerFormat: return ToolError(.newerFormat, log.description)
      case .corruptRecord, .sequenceGap:
        return ToolError(.corruptRecord, log.description)
      case .unsupportedRecordFormat, .unknownEventType, .unsupportedSchemaVersion:
        // A record with a valid CRC this version cannot read: newer software wrote it, not damage.
        return ToolError(
          .newerFormat,
          log.description
            + " (written by a newer Ferry or by another application; its CRC holds: this is not damage)")
      case .damagedStore, .lostCommits, .ioError: return ToolError(.corruptRecord, log.description)
      case .diskFull, .quotaExceeded: return ToolError(.storageError, log.description)
      case .unsupportedLMDB: return ToolError(.storageError, log.description)
      case .alreadyOpen, .permissionDenied: return ToolError(.unavailable, log.description)
      // Not "unavailable": nothing conflicts and nothing is denied; one command settles it.
      case .needsRecovery: return ToolError(.needsRecovery, log.description)
      case .recoveredCopyFailed: return ToolError(.recoveredCopyFailed, log.description)
      case .historyCompacted: return ToolError(.badInput, log.description)
      case .storage(let failure) where failure.isDamage: return damaged(failure.message)
      case .projectionFailed(_, _, let underlying):
        if underlying is FerryError { return ToolError(.corruptRecord, log.description) }
        return ToolError(.storageError, log.description)
      default: return ToolError(.storageError, log.description)
      }
    }
    if let ferry = error as? FerryError {
      switch ferry {
      case .noSuchStore: return ToolError(.noSuchStore, ferry.description)
      case .notAStore: return ToolError(.notAStore, ferry.description)
      case .newerFormat(let path, _):
        // A record with a valid CRC this version cannot read: newer software wrote it, not damage.
        if path != nil { return ToolError(.newerFormat, ferry.description) }
        return ToolError(
          .newerFormat,
          ferry.description
            + " (written by a newer Ferry or by another application; its CRC holds: this is not damage)")
      case .damaged, .ioError: return ToolError(.corruptRecord, ferry.description)
      case .diskFull, .quotaExceeded, .unsupportedLMDB, .storage, .closed, .suspended, .cancelled,
        .notCurrent:
        return ToolError(.storageError, ferry.description)
      case .alreadyOpen, .permissionDenied: return ToolError(.unavailable, ferry.description)
      case .needsRecovery: return ToolError(.needsRecovery, ferry.description)
      case .recoveredCopyFailed: return ToolError(.recoveredCopyFailed, ferry.description)
      case .invalidArgument, .noSuchTask, .taskRunning, .payload, .unknownCollection, .malformedEvent: break
      }
      if case .malformedEvent = ferry { return ToolError(.corruptRecord, ferry.description) }
      if case .taskRunning = ferry { return ToolError(.runUnderWay, ferry.description) }
      if case .noSuchTask = ferry { return ToolError(.notApplicable, ferry.description) }
      return ToolError(.badInput, ferry.description)
    }
    if let payload = error as? PayloadError {
      // Stored bytes (a projection row, a payload) that do not decode: the store is damaged.
      return ToolError(
        .corruptRecord,
        "the store is damaged: stored bytes do not decode (\(payload.reason)); nothing was changed — "
          + "`ferry verify` names what differs, `ferry salvage` recovers what is left into a new store")
    }
    if let lmdb = error as? LMDBError {
      let failure = StorageFailure(lmdb)
      if failure.isDamage { return damaged(failure.message) }
      return ToolError(.storageError, "storage error: \(failure)")
    }
    return ToolError(.storageError, "\(error)")
  }
}

/// The failure for damage LMDB found in its own pages.
private func damaged(_ message: String) -> ToolError {
  ToolError(
    .corruptRecord,
    "the store is damaged: LMDB found a damaged page or gave up after one (\(message)); "
      + "nothing was changed — "
      + "`ferry salvage` recovers what is left into a new store")
}

/// Opens a store for a command that only reads: a store that needs recovery is read from a
/// recovered copy (its own files untouched), which is said on standard error.
package func openForReading(_ path: String) throws(ToolError) -> FerryStore {
  let store: FerryStore
  do {
    store = try FerryStore.openReadOnly(at: path, recoveredCopyIfNeeded: true)
  } catch {
    throw ToolError.from(error)
  }
  if store.isRecoveredCopy {
    FileHandle.standardError.write(
      Data(
        ("ferry: \(path) needs recovery (its writer died with commits only its write-ahead segment holds): "
          + "showing a recovered copy; the store itself is untouched (`ferry recover \(path)` replays it in place)\n")
          .utf8))
  }
  return store
}
