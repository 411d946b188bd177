import Ferry
import FerryLog
import Foundation
import LMDB

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// `ferry compact`: a snapshot of both sides and the removal of what the retention policy allows,
/// in one transaction; with `copy`, then a compacted copy of the file swapped in to give the freed
/// pages back to the file system (LMDB files never shrink in place).
public func compact(path: String, retentionMs: Int64, copy: Bool, output: Output) async throws(ToolError) {
  do {
    let sizeBefore = fileSize(path)
    let store = try await FerryStore.open(at: path)
    let report: CompactionReport
    do {
      report = try await store.compact(retention: .milliseconds(retentionMs))
    } catch {
      store.close()
      throw error
    }
    store.close()
    output.line(
      "compacted through sequence \(report.snapshotSequence): removed \(report.removed) events "
        + "(\(report.removedBytes) bytes of records), \(report.remaining) left; snapshot of \(report.snapshotRows) rows"
    )
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

private func fileSize(_ path: String) -> Int {
  (try? FileManager.default.attributesOfItem(atPath: path + "/data.mdb")[.size] as? NSNumber)?.intValue ?? 0
}

/// Whether another process has the environment open: LMDB keeps a shared lock on the first byte of
/// `lock.mdb` while open, so an exclusive lock on it can only be had when nobody else holds it.
/// (This process must not have it open: closing any descriptor would drop its own locks.)
private func anotherProcessHasItOpen(_ path: String) -> Bool {
  let fd = open(path + "/lock.mdb", O_RDWR)
  guard fd >= 0 else { return false }
  defer { close(fd) }
  var lock = flock()
  lock.l_type = Int16(F_WRLCK)
  lock.l_whence = Int16(SEEK_SET)
  lock.l_start = 0
  lock.l_len = 1
  if fcntl(fd, F_SETLK, &lock) != 0 { return true }
  lock.l_type = Int16(F_UNLCK)
  _ = fcntl(fd, F_SETLK, &lock)
  return false
}

private func copyCompacted(_ path: String) throws {
  if anotherProcessHasItOpen(path) {
    throw ToolError(
      .unavailable, "another process has the store open: close it before compacting with --copy")
  }
  let staging = path + "/.compact-\(getpid())"
  try? FileManager.default.removeItem(atPath: staging)
  try FileManager.default.createDirectory(atPath: staging, withIntermediateDirectories: false)
  defer { try? FileManager.default.removeItem(atPath: staging) }
  let environment = try Environment.open(path: path, options: Environment.Options())
  let before = try environment.info().lastTransaction
  try environment.copy(to: staging, compact: true)
  let after = try environment.info().lastTransaction
  environment.close()
  guard before == after, !anotherProcessHasItOpen(path) else {
    throw ToolError(
      .unavailable, "the store changed while it was being copied: nothing was swapped; run it again")
  }
  // The copy is complete and flushed by LMDB; one rename makes it the store, atomically.
  let copied = staging + "/data.mdb"
  let fd = open(copied, O_RDONLY)
  if fd >= 0 {
    fsync(fd)
    close(fd)
  }
  guard rename(copied, path + "/data.mdb") == 0 else {
    throw ToolError(
      .storageError, "could not move the compacted copy into place: \(String(cString: strerror(errno)))")
  }
  let directory = open(path, O_RDONLY)
  if directory >= 0 {
    fsync(directory)
    close(directory)
  }
}
