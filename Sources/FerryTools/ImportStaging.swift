import Foundation
import LMDB

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// The directory `ferry import` (or `ferry salvage`) fills: it must be missing or empty, and it gets
/// a store only by one atomic rename of a complete one, so that no other writer ever shares it with
/// the import and a killed import leaves nothing there.
struct ImportTarget {
  /// The command building the store, for messages: "import" or "salvage".
  let verb: String
  /// The absolute path of the target directory (a symbolic link at the end resolved).
  let path: String
  /// The directory holding the target, where the store is built.
  let parent: String
  /// How the names of this target's temporary directories begin: `.<name>.ferry-import-`.
  let stagingPrefix: String

  /// The target at `given`, which may be relative; refuses the root directory. `verb` names the
  /// command in messages. Temporary directories are named alike for both commands, so that either
  /// removes what a killed one left.
  init(_ given: String, verb: String = "import") throws(ToolError) {
    self.verb = verb
    var url = URL(fileURLWithPath: given).standardizedFileURL
    var info = stat()
    if lstat(url.path, &info) == 0 && (info.st_mode & S_IFMT) == S_IFLNK {
      url = url.resolvingSymlinksInPath()
    }
    let name = url.lastPathComponent
    guard !name.isEmpty, name != "/", name != ".", name != ".." else {
      throw ToolError(.badInput, "cannot \(verb) into \(given): name a directory to create or an empty one")
    }
    path = url.path
    parent = url.deletingLastPathComponent().path
    // Short enough that the temporary names stay within a file name's 255 bytes.
    let short = String(decoding: name.utf8.prefix(96), as: UTF8.self)
    stagingPrefix = ".\(short).ferry-import-"
  }

  /// Refuses, before anything is written, a target that is a file or a non-empty directory.
  func refuseUnlessEmpty() throws(ToolError) {
    var info = stat()
    guard stat(path, &info) == 0 else {
      let code = errno
      if code == ENOENT {
        // Nothing there, unless a symbolic link pointing nowhere (rename would replace the link).
        guard lstat(path, &info) == 0 else { return }
        throw ToolError(
          .notAStore, "\(path) is a symbolic link to nothing; \(verb) into a missing or empty directory")
      }
      throw ToolError(.unavailable, "cannot read \(path): \(String(cString: strerror(code)))")
    }
    guard (info.st_mode & S_IFMT) == S_IFDIR else {
      throw ToolError(
        .notAStore, "\(path) is a file, not a directory; \(verb) into a missing or empty directory")
    }
    let entries: [String]
    do {
      entries = try FileManager.default.contentsOfDirectory(atPath: path)
    } catch {
      throw ToolError(.unavailable, "cannot list \(path): \(error.localizedDescription)")
    }
    guard entries.isEmpty else {
      var data = stat()
      let what: String
      if !entries.contains("data.mdb") {
        what = "it holds \(entries.sorted().prefix(3).joined(separator: ", "))"
      } else if stat(path + "/data.mdb", &data) == 0 && data.st_size == 0 {
        // An empty data.mdb is a damaged store, not an empty directory: importing over it would
        // hide the damage under a store with other contents.
        what = "it holds a store whose data.mdb is empty (0 bytes), a damaged store"
      } else {
        what = "it holds a store"
      }
      throw ToolError(
        .badInput, "\(path) is not empty (\(what)); \(verb) only into a missing or empty directory")
    }
  }

  /// Removes the temporary directories of imports into this target whose process is gone (a killed
  /// import): those whose lock file nobody holds. Returns how many were removed.
  func removeStaleStagings() -> Int {
    guard let entries = try? FileManager.default.contentsOfDirectory(atPath: parent) else { return 0 }
    var removed = 0
    for entry in entries where entry.hasPrefix(stagingPrefix) && entry.hasSuffix(ImportStaging.lockSuffix) {
      let lockPath = parent + "/" + entry
      let descriptor = open(lockPath, O_RDWR | O_CLOEXEC)
      guard descriptor >= 0 else { continue }
      defer { close(descriptor) }
      // Held by a running import: not stale. Unlinked or replaced since listed: not ours to judge.
      guard flock(descriptor, LOCK_EX | LOCK_NB) == 0, isSameFile(descriptor, lockPath) else { continue }
      let directory = String(lockPath.dropLast(ImportStaging.lockSuffix.count))
      let existed = FileManager.default.fileExists(atPath: directory)
      try? FileManager.default.removeItem(atPath: directory)
      // The lock file goes last, so that a directory is never left without one.
      guard !FileManager.default.fileExists(atPath: directory) else { continue }
      unlink(lockPath)
      if existed { removed += 1 }
    }
    return removed
  }

  /// Builds a store for the target: removes the temporary directories killed runs left (saying so),
  /// lets `body` build and close a store in a fresh one, then renames it onto the target. Whatever
  /// fails, the temporary directory is removed and the target left as it was.
  func build<Result>(
    output: Output, _ body: (_ directory: String) async throws(ToolError) -> Result
  ) async throws(ToolError) -> Result {
    let stale = removeStaleStagings()
    if stale > 0 {
      output.line(
        "removed \(stale) temporary directories left beside \(path) by \(verb)s that did not finish")
    }
    let staging = try stage()
    do {
      let result = try await body(staging.directory)
      try staging.moveIntoPlace(self)
      return result
    } catch {
      staging.discard()
      throw error
    }
  }

  /// Creates a fresh temporary directory beside the target, with its lock file held.
  func stage() throws(ToolError) -> ImportStaging {
    for _ in 0..<8 {
      let directory = parent + "/" + stagingPrefix + String(UInt64.random(in: 0...UInt64.max), radix: 16)
      let lockPath = directory + ImportStaging.lockSuffix
      let descriptor = open(lockPath, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
      guard descriptor >= 0 else {
        let code = errno
        if code == EEXIST { continue }
        throw failure(code, "cannot create a temporary directory beside \(path)")
      }
      // A cleaner may have taken the new lock file for a stale one and removed it: start again.
      guard flock(descriptor, LOCK_EX) == 0, isSameFile(descriptor, lockPath) else {
        close(descriptor)
        continue
      }
      guard mkdir(directory, 0o700) == 0 else {
        let code = errno
        unlink(lockPath)
        close(descriptor)
        throw failure(code, "cannot create a temporary directory beside \(path)")
      }
      return ImportStaging(directory: directory, lockPath: lockPath, lock: descriptor)
    }
    throw ToolError(.storageError, "cannot create a temporary directory beside \(path)")
  }

  private func failure(_ code: Int32, _ what: String) -> ToolError {
    let reason = String(cString: strerror(code))
    switch code {
    case ENOENT: return ToolError(.noSuchStore, "\(what): no directory \(parent)")
    case EACCES, EPERM, EROFS: return ToolError(.unavailable, "\(what): \(reason)")
    default: return ToolError(.storageError, "\(what): \(reason)")
    }
  }
}

/// A temporary directory beside an import's target where the store is built, and the lock file
/// beside it (`<directory>.lock`, held with `flock` while the import runs) that tells a later import
/// whether the directory belongs to a running import or was left by a killed one.
struct ImportStaging {
  static let lockSuffix = ".lock"

  /// Where the store is built.
  let directory: String
  let lockPath: String
  let lock: Int32

  /// Flushes the built (and closed) store, renames it onto the target and flushes the rename.
  /// The rename fails, and nothing of the target is touched, when another process has put anything
  /// there meanwhile. Releases the lock when it succeeds; when it throws, call ``discard()`` (which
  /// releases it, once).
  func moveIntoPlace(_ target: ImportTarget) throws(ToolError) {
    try flushTree(directory)
    guard rename(directory, target.path) == 0 else {
      let code = errno
      switch code {
      case ENOTEMPTY, EEXIST:
        throw ToolError(
          .unavailable,
          "another process created a store (or files) at \(target.path) while the \(target.verb) ran: "
            + "nothing was \(target.verb)d and what is there was left as it is")
      case ENOTDIR:
        throw ToolError(
          .notAStore,
          "\(target.path) became a file while the \(target.verb) ran: nothing was \(target.verb)d")
      default:
        throw ToolError(
          .storageError,
          "cannot move the \(target.verb)d store to \(target.path): \(String(cString: strerror(code)))")
      }
    }
    do {
      try flush(target.parent, directory: true)
    } catch {
      throw ToolError(
        error.status,
        "the store is at \(target.path), but its directory entry may not survive a power loss: \(error)")
    }
    release()
  }

  /// Removes the temporary directory (whatever it holds) and releases the lock.
  func discard() {
    try? FileManager.default.removeItem(atPath: directory)
    release()
  }

  private func release() {
    unlink(lockPath)
    close(lock)
  }

  /// Flushes every file under `path` (a store: its LMDB files, the runners' token directory),
  /// then the directories holding them.
  private func flushTree(_ path: String) throws(ToolError) {
    var info = stat()
    guard lstat(path, &info) == 0 else {
      let code = errno
      throw ToolError(.storageError, "cannot read \(path) to flush it: \(String(cString: strerror(code)))")
    }
    switch info.st_mode & S_IFMT {
    case S_IFREG:
      try flush(path, directory: false)
    case S_IFDIR:
      let entries: [String]
      do {
        entries = try FileManager.default.contentsOfDirectory(atPath: path)
      } catch {
        throw ToolError(.storageError, "cannot list \(path) to flush it: \(error.localizedDescription)")
      }
      for entry in entries { try flushTree(path + "/" + entry) }
      try flush(path, directory: true)
    default:
      return
    }
  }

  private func flush(_ path: String, directory: Bool) throws(ToolError) {
    let descriptor = open(path, directory ? O_RDONLY | O_DIRECTORY | O_CLOEXEC : O_RDONLY | O_CLOEXEC)
    guard descriptor >= 0 else {
      let code = errno
      throw ToolError(.storageError, "cannot open \(path) to flush it: \(String(cString: strerror(code)))")
    }
    defer { close(descriptor) }
    if let code = DiskFlush.flush(descriptor) {
      throw ToolError(.storageError, "cannot flush \(path): \(String(cString: strerror(code)))")
    }
  }
}

/// Whether an open file is still the one at `path` (not unlinked or replaced since it was opened).
private func isSameFile(_ descriptor: Int32, _ path: String) -> Bool {
  var opened = stat()
  var named = stat()
  guard fstat(descriptor, &opened) == 0, stat(path, &named) == 0 else { return false }
  return opened.st_dev == named.st_dev && opened.st_ino == named.st_ino
}
