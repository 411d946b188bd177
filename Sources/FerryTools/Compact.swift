@_spi(Experimental) import Ferry
import FerryLog
import Foundation
import LMDB

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// The stable JSON form of `ferry compact --json`.
package struct CompactJSON: Codable, Sendable, Equatable {
  /// The sequence the snapshot was taken at.
  package var snapshotSequence: UInt64
  /// Events removed.
  package var removed: Int
  /// Bytes of the removed records.
  package var removedBytes: Int
  /// Events left.
  package var remaining: Int
  /// Rows in the snapshot.
  package var snapshotRows: Int
  /// The data file's size before.
  package var dataFileBytesBefore: Int
  /// Its size after (the same without `copied`: freed pages are reused, not given back).
  package var dataFileBytesAfter: Int
  /// Whether a compacted copy was swapped in (`--copy`).
  package var copied: Bool
  /// The projections of another version (or not configured here) behind the head that kept the
  /// compaction from removing anything; empty when none did.
  package var heldBackBy: [String]
}

/// `ferry compact`: a snapshot of both sides and the removal of what the retention policy allows,
/// in one transaction; with `copy`, then a compacted copy of the file swapped in to give the freed
/// pages back to the file system (LMDB files never shrink in place).
///
/// Never creates a store: a missing directory, one without `data.mdb` and an empty `data.mdb`
/// are refused before anything is written. With `copy`, a store another process has open is
/// refused before anything is written too (the copy could not be swapped in).
package func compact(
  path: String, retentionMs: Int64, copy: Bool, json: Bool = false, output: Output
) async throws(ToolError) {
  try refuseEmptyDataFile(path)
  if copy {
    try refuseWhileOpenElsewhere(
      path,
      "another process has the store at \(path) open: close it before compacting with --copy "
        + "(nothing was changed)")
  }
  do {
    let sizeBefore = fileSize(path)
    // A store's write-ahead segment is kept — except by `--copy`, whose swapped-in file the
    // segment's checkpoint (LMDB's meta pages of the old file) does not describe: that open, alone,
    // settles the segment and turns it off first; the app's next open alone turns it on again.
    var configuration = toolConfiguration(for: path)
    if copy { configuration.writeAheadSegment = false }
    let store = try await FerryStore.open(at: path, configuration: configuration)
    let report: FerryStore.CompactionReport
    do {
      let shown = json ? output.withoutProgress : output
      report = try await store.compact(
        retention: .milliseconds(retentionMs),
        progress: { read, head in shown.progress("compact", Int(clamping: read), Int(clamping: head)) })
    } catch {
      store.close()
      throw error
    }
    store.close()
    if json {
      if copy { try copyCompacted(path) }
      output.line(
        jsonLine(
          CompactJSON(
            snapshotSequence: UInt64(report.snapshotSequence), removed: Int(report.removed),
            removedBytes: Int(report.removedBytes), remaining: Int(report.remaining),
            snapshotRows: Int(report.snapshotRows), dataFileBytesBefore: Int(sizeBefore),
            dataFileBytesAfter: Int(fileSize(path)), copied: copy, heldBackBy: report.heldBackBy)))
      return
    }
    output.line(
      "compacted through sequence \(report.snapshotSequence): removed \(report.removed) events "
        + "(\(report.removedBytes) bytes of records), \(report.remaining) left; snapshot of \(report.snapshotRows) rows"
    )
    if !report.heldBackBy.isEmpty {
      output.line(
        "nothing was removed: a projection another version of the app keeps is behind the log, and its code "
          + "folds the events past it: " + report.heldBackBy.joined(separator: ", ")
          + " (an app of that version catches it up when it opens the store)")
    }
    guard copy else {
      output.line(
        "data file: \(sizeBefore) bytes (freed pages are reused; --copy gives them back to the file system)")
      return
    }
    try copyCompacted(path)
    output.line("data file: \(sizeBefore) → \(fileSize(path)) bytes (compacted copy swapped in)")
  } catch let error as ToolError {
    throw error
  } catch {
    throw ToolError.from(error)
  }
}

/// Refuses a store whose `data.mdb` is empty: LMDB would take it for a new environment and a
/// writable open would create a store in it, task ids starting again at 1.
private func refuseEmptyDataFile(_ path: String) throws(ToolError) {
  var info = stat()
  guard stat(path + "/data.mdb", &info) == 0, (info.st_mode & S_IFMT) == S_IFREG, info.st_size == 0 else {
    return
  }
  throw ToolError(
    .corruptRecord,
    "the store at \(path) is damaged: its data.mdb is empty (0 bytes), whatever it held is gone; "
      + "nothing was changed and no store was created")
}

private func fileSize(_ path: String) -> Int {
  (try? FileManager.default.attributesOfItem(atPath: path + "/data.mdb")[.size] as? NSNumber)?.intValue ?? 0
}

/// Takes the exclusive lock LMDB's openers ask for on the first byte of `lock.mdb` (while a
/// process has the store open it holds a shared one, so this fails); returns its descriptor, nil
/// when another process has the store open. Held, it makes an opener wait (LMDB blocks for the
/// shared lock before it opens `data.mdb`). This process must not have the store open: closing any
/// descriptor of the file would drop its own locks.
private func lockOutOtherProcesses(_ path: String) -> Int32? {
  let fd = open(path + "/lock.mdb", O_RDWR | O_CLOEXEC)
  guard fd >= 0 else { return -1 }  // no lock file: nobody has it open
  var lock = flock()
  lock.l_type = Int16(F_WRLCK)
  lock.l_whence = Int16(SEEK_SET)
  lock.l_start = 0
  lock.l_len = 1
  if fcntl(fd, F_SETLK, &lock) != 0 {
    close(fd)
    return nil
  }
  return fd
}

/// Takes Ferry's open lock (`ferry-open.lock`, which every Ferry open holds, shared or alone, for
/// as long as it has the store open) exclusively, without waiting; returns its descriptor (closing
/// it lets go), nil when a Ferry open holds it.
private func lockFerryOpens(_ path: String) -> Int32? {
  let fd = open(path + "/ferry-open.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
  guard fd >= 0 else { return nil }
  var lock = flock()
  lock.l_type = Int16(F_WRLCK)
  lock.l_whence = Int16(SEEK_SET)
  lock.l_start = 0
  lock.l_len = 0
  guard fcntl(fd, F_SETLK, &lock) == 0 else {
    close(fd)
    return nil
  }
  return fd
}

/// The newest transaction id committed to an LMDB data file, read from its meta pages with plain
/// reads (``DataFileCheck``), or nil when the file cannot be read as LMDB's. Read with the file
/// closed by LMDB: this process's environment on it is closed first.
private func lastCommittedTransaction(_ file: String) -> UInt64? {
  (try? DataFileCheck.read(file))?.newest?.transaction
}

/// Clears the header of the lock file `fd` (``lockOutOtherProcesses(_:)``'s, held: nobody uses
/// it), LMDB's magic number and lock format first, so that LMDB refuses to come up as a later user
/// of it (`MDB_INVALID`); a first user sets it up anew. Best effort: it only guards a process that
/// opened the removed file and waits for it.
private func invalidateLockFile(_ fd: Int32) {
  guard fd >= 0 else { return }
  let zeros = [UInt8](repeating: 0, count: 64)
  _ = zeros.withUnsafeBytes { pwrite(fd, $0.baseAddress, 64, 0) }
}

/// Throws `message` (exit status `unavailable`) when another process has the store open.
private func refuseWhileOpenElsewhere(_ path: String, _ message: String) throws(ToolError) {
  guard let probe = lockOutOtherProcesses(path) else { throw ToolError(.unavailable, message) }
  unlock(probe)
}

/// Gives the lock of ``lockOutOtherProcesses(_:)`` back.
private func unlock(_ fd: Int32) {
  guard fd >= 0 else { return }
  var lock = flock()
  lock.l_type = Int16(F_UNLCK)
  lock.l_whence = Int16(SEEK_SET)
  lock.l_start = 0
  lock.l_len = 1
  _ = fcntl(fd, F_SETLK, &lock)
  close(fd)
}

/// Writes a compacted copy of the environment at `path` into the empty directory `staging`
/// (`mdb_env_copy2` with `MDB_CP_COMPACT`) and returns the id of the committed transaction whose
/// state it holds; nil when a commit was published while it was made (which state it holds is then
/// not known). This process must not have the store open.
///
/// The copy is taken from the newest state LMDB has *published* (its id in `lock.mdb`, where every
/// read transaction starts), which can be older than the newest meta page in the data file: a
/// commit in another process writes its meta page — and flushes it, for milliseconds — before it
/// publishes its id. Read from the meta pages (`mdb_env_info`), the id already names that commit
/// while the copy lacks it; so the id returned is a read transaction's, taken before and after the
/// copy (ids only grow: equal, they are the copy's), and the caller compares it with the data
/// file's newest meta page, which is newer while a commit is unpublished or after one landed.
package func writeCompactedCopy(of path: String, into staging: String) throws -> UInt64? {
  let environment = try Environment.open(path: path, options: Environment.Options())
  defer { environment.close() }
  let before = try environment.pinSnapshot()
  environment.release(before)
  try environment.copy(to: staging, compact: true)
  let after = try environment.pinSnapshot()
  environment.release(after)
  return before.transaction == after.transaction ? before.transaction : nil
}

private func copyCompacted(_ path: String) throws {
  // It opened the store after the check before compacting: the compaction in place is done.
  try refuseWhileOpenElsewhere(
    path,
    "another process opened the store while it was compacted: the events were removed in place, "
      + "but the copy that gives the space back was not made; run it again with the store closed")
  removeStaleCompactionCopies(in: path)
  let staging = path + "/.compact-\(getpid())"
  try? FileManager.default.removeItem(atPath: staging)
  try FileManager.default.createDirectory(
    atPath: staging, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
  defer { try? FileManager.default.removeItem(atPath: staging) }
  let copied = try writeCompactedCopy(of: path, into: staging)
  CrashPoint.reach(CrashPoint.compactCopied)
  // From here to the rename no process may open the store: one that did would write into the
  // file about to be replaced, and what it wrote would be lost. One that wrote after the copy, or
  // was writing while it was made, committed a newer transaction than the state copied.
  guard let copied, lastCommittedTransaction(path + "/data.mdb") == copied else {
    throw ToolError(
      .unavailable, "the store changed while it was being copied: nothing was swapped; run it again")
  }
  // Ferry's open lock too, exclusively: a Ferry open that comes meanwhile waits for it before it
  // touches LMDB's files. (Waiting in LMDB's open instead, it came up as a later user of `lock.mdb`
  // trusting the old file's transaction counter, whose parity can name the copy's empty meta page:
  // it created a new store over the real one.) Released last on every return — but not when this
  // process is killed: the kernel then closes its descriptors lowest first, and this one, opened
  // before `lock.mdb`'s, goes first. So the old `lock.mdb` is removed before the rename (below).
  guard let openLock = lockFerryOpens(path) else {
    throw ToolError(
      .unavailable,
      "another process opened the store while it was being copied: nothing was swapped; run it again")
  }
  defer { close(openLock) }
  guard let held = lockOutOtherProcesses(path) else {
    throw ToolError(
      .unavailable, "the store changed while it was being copied: nothing was swapped; run it again")
  }
  defer { unlock(held) }
  // A write-ahead segment names meta pages of the file it was made beside (one-sync-commit.md):
  // the open above removed it, and one that is back was made by an app that opened the store
  // meanwhile. Swapping the file under it would have its next recovery restore the old file's
  // meta pages into the new one.
  guard !EventLog.hasWriteAheadSegment(in: path) else {
    throw ToolError(
      .unavailable,
      "the store started using a write-ahead segment while it was being copied: nothing was swapped; run it again with the store closed"
    )
  }
  guard lastCommittedTransaction(path + "/data.mdb") == copied else {
    throw ToolError(
      .unavailable, "the store changed while it was being copied: nothing was swapped; run it again")
  }
  // The copy is complete and flushed by LMDB; one rename makes it the store, atomically. LMDB
  // made it with mode 0644 less the umask: a store's files are 0600, whatever the umask.
  let copy = staging + "/data.mdb"
  let fd = open(copy, O_RDONLY | O_CLOEXEC)
  guard fd >= 0 else {
    throw ToolError(
      .storageError,
      "could not open the compacted copy: \(String(cString: strerror(errno))); nothing was swapped")
  }
  guard fchmod(fd, 0o600) == 0 else {
    let code = errno
    close(fd)
    throw ToolError(
      .storageError,
      "could not make the compacted copy private: \(String(cString: strerror(code))); nothing was swapped")
  }
  // LMDB's copy does not flush it: a failure here must stop the swap, or a power cut after the
  // rename could leave a data.mdb that never reached the disk in place of the old one.
  if let code = DiskFlush.flush(fd, label: DiskFlush.compactCopy) {
    close(fd)
    throw ToolError(
      .notFlushed,
      "could not flush the compacted copy to the disk: \(String(cString: strerror(code))); nothing was swapped: "
        + "the store keeps its own data.mdb (the events were removed from it in place)")
  }
  close(fd)
  // `lock.mdb` holds the old file's transaction counters, and a later user of a lock file trusts
  // them. This process holds it exclusively, so nobody uses it: removed now, before the rename, the
  // first to open the store after the rename makes a new one and, its first user, has LMDB set it
  // from the new file — also a Ferry open that got the open lock while this process, killed, still
  // held the old `lock.mdb` (its locks are dropped one descriptor at a time; the open then waited
  // for the old file in LMDB's open and came up as its later user: CompactCopyKillTests).
  guard unlink(path + "/lock.mdb") == 0 || errno == ENOENT else {
    throw ToolError(
      .storageError,
      "could not remove LMDB's lock file (lock.mdb) before the swap: \(String(cString: strerror(errno))); "
        + "nothing was swapped")
  }
  // A process that opened the old lock file before it was removed and waits for it in LMDB's
  // open (not a Ferry open, which waits for the open lock first: one of LMDB's own tools) would
  // come up as a later user of it, with the old counters on the new file: its header cleared,
  // LMDB refuses it instead (`MDB_INVALID`).
  invalidateLockFile(held)
  guard rename(copy, path + "/data.mdb") == 0 else {
    throw ToolError(
      .storageError, "could not move the compacted copy into place: \(String(cString: strerror(errno)))")
  }
  CrashPoint.reach(CrashPoint.compactSwapped)
  let directoryFlush = DiskFlush.flushDirectory(path, label: DiskFlush.compactDirectory)
  // Opened here, while Ferry's opens wait for the open lock, LMDB makes the new `lock.mdb` and,
  // this process its first user, sets it from the new file; the waiting opens then find it current.
  let fresh = try Environment.open(path: path, options: Environment.Options())
  fresh.close()
  if let code = directoryFlush {
    // Both files are whole stores (the events were removed from the old one in place first):
    // after a power cut the directory names one or the other.
    throw ToolError(
      .notFlushed,
      "the compacted copy is in place, but the store's directory could not be flushed to the disk: "
        + "\(String(cString: strerror(code))); after a power cut the store may come back with its old, "
        + "larger file (both hold the same events); run it again to be sure")
  }
}

/// Removes the staging directories (`.compact-<pid>`) that killed `compact --copy` runs left in the
/// store — whole copies of the store — when their process is gone.
func removeStaleCompactionCopies(in path: String) {
  guard let entries = try? FileManager.default.contentsOfDirectory(atPath: path) else { return }
  for entry in entries where entry.hasPrefix(".compact-") {
    guard let pid = Int32(entry.dropFirst(".compact-".count)), pid > 0 else { continue }
    if pid == getpid() { continue }
    if kill(pid, 0) == 0 || errno == EPERM { continue }  // still running (or not ours to judge)
    try? FileManager.default.removeItem(atPath: path + "/" + entry)
  }
}
