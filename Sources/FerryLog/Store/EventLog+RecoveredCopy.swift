import CoreMetrics
import Foundation

/// A private copy of a store that needed recovery, replayed and read in its place
/// (``EventLog/Configuration/recoveredCopyIfNeeded``): removed when the session that reads it ends.
final class RecoveredCopy: Sendable {
  let directory: String

  init(directory: String) { self.directory = directory }

  func remove() {
    try? FileManager.default.removeItem(atPath: directory)
  }
}

extension EventLog {
  /// Whether this log reads a private, recovered copy of a store that needed recovery instead of
  /// the store itself (``Configuration/recoveredCopyIfNeeded``): the store's writer died with
  /// commits only its write-ahead segment held, and this open replayed them into the copy. The
  /// store's own files are untouched until a read-write open replays them in place.
  public var isRecoveredCopy: Bool { session.recoveredCopy != nil }

  static func wantsCopy(_ configuration: Configuration) -> Bool {
    configuration.readOnly && configuration.recoveredCopyIfNeeded && !configuration.allowDamage
  }

  /// Copies the store's files into a new directory under the temporary directory (mode 0700)
  /// while `lock` — the store's open lock, held shared — keeps any read-write open from settling
  /// or writing the store, then lets go of it (the caller's to release no more), replays the copy
  /// there with the usual alone read-write open, and opens the copy read-only with
  /// `configuration`. Nothing is written to `path`.
  static func openRecoveredCopy(
    of path: String, configuration: Configuration, lock: StoreOpenLock
  ) throws
    -> Opened
  {
    let copy: String
    do {
      defer { lock.release() }
      copy = try StoreCopy.makeCopyDirectory(for: path)
      do {
        try StoreCopy.copyStore(from: path, to: copy)
      } catch {
        RecoveredCopy(directory: copy).remove()
        throw error
      }
    }
    do {
      var replay = configuration
      replay.readOnly = false
      replay.createIfMissing = false
      replay.recoveredCopyIfNeeded = false
      // Kept as the store had it, so the view says what the store does; with the segment kept the
      // replay ends in a checkpoint, and the read-only open of the copy finds nothing to replay.
      replay.writeAheadSegment = WriteAheadSegment.exists(in: copy)
      replay.storeIdAtCreation = nil
      replay.logger = nil
      replay.metricsFactory = NOOPMetricsHandler.instance
      let recovered = try EventLog.open(at: copy, configuration: replay)
      recovered.close()
      var view = configuration
      view.recoveredCopyIfNeeded = false
      var opened = try openStore(at: copy, configuration: view)
      opened.recoveredCopy = RecoveredCopy(directory: copy)
      return opened
    } catch {
      RecoveredCopy(directory: copy).remove()
      throw copyFailure(error, copy: copy, path: path)
    }
  }

  /// An error of the copy or its replay, said of the store: damage the replay found is the
  /// store's own (the same a read-write open would find); any other failure is the copy's.
  private static func copyFailure(_ error: any Error, copy: String, path: String) -> any Error {
    guard let log = error as? FerryLogError else {
      return FerryLogError.recoveredCopyFailed(path: path, reason: "replaying a copy in \(copy): \(error)")
    }
    switch log {
    case .recoveredCopyFailed: return log
    case .damagedStore(_, let reason): return FerryLogError.damagedStore(path: path, reason: reason)
    case .lostCommits(_, let acknowledged, let found):
      return FerryLogError.lostCommits(path: path, acknowledged: acknowledged, found: found)
    case .newerFormat(_, let found, let supported):
      return FerryLogError.newerFormat(path: path, found: found, supported: supported)
    case .corruptRecord, .sequenceGap, .unsupportedRecordFormat, .unsupportedLMDB, .invalidConfiguration:
      return log
    case .diskFull, .quotaExceeded:
      return FerryLogError.recoveredCopyFailed(
        path: path, reason: "no room in the temporary directory to replay a copy (\(copy))")
    default:
      return FerryLogError.recoveredCopyFailed(path: path, reason: "replaying a copy in \(copy): \(log)")
    }
  }
}

/// The file work of a recovered copy, apart from `EventLog` (whose `open`, `close` and `read`
/// would hide the system calls).
private enum StoreCopy {
  /// The files a recovery reads; LMDB's and Ferry's lock files are made anew in the copy.
  static var copiedFiles: [String] { ["data.mdb", WriteAheadSegment.fileName, HeadMark.fileName] }

  static func makeCopyDirectory(for path: String) throws -> String {
    var template = Array(
      (FileManager.default.temporaryDirectory.path + "/ferry-recovered-XXXXXX").utf8CString)
    let made = template.withUnsafeMutableBufferPointer { buffer -> Bool in
      guard let base = buffer.baseAddress else { return false }
      return mkdtemp(base) != nil
    }
    guard made else {
      let code = errno
      throw FerryLogError.recoveredCopyFailed(
        path: path,
        reason:
          "cannot make a directory in the temporary directory \(FileManager.default.temporaryDirectory.path): \(String(cString: strerror(code)))"
      )
    }
    return String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
  }

  /// Copies the store's files; refuses up front when the temporary directory has no room for
  /// them, and afterwards when the segment's header changed meanwhile (a read-write open that
  /// took the store for live and checkpointed it: the copy may be torn).
  static func copyStore(from path: String, to copy: String) throws {
    var needed: UInt64 = 0
    for name in copiedFiles {
      var info = stat()
      if stat(path + "/" + name, &info) == 0 { needed += UInt64(info.st_size) }
    }
    var space = statvfs()
    if statvfs(copy, &space) == 0 {
      let available = UInt64(space.f_bavail) * UInt64(space.f_frsize)
      if available < needed {
        throw FerryLogError.recoveredCopyFailed(
          path: path,
          reason:
            "the temporary directory \(FileManager.default.temporaryDirectory.path) has \(available) bytes free, the copy needs \(needed) and more to replay (set TMPDIR to a roomier place)"
        )
      }
    }
    let headerBefore = segmentHeaders(in: path)
    for name in copiedFiles {
      try copyFile(path + "/" + name, to: copy + "/" + name, store: path)
    }
    if segmentHeaders(in: path) != headerBefore {
      throw FerryLogError.recoveredCopyFailed(
        path: path, reason: "another process checkpointed the store while it was being copied; try again")
    }
  }

  /// The segment's two header slots, as bytes (nil without a segment).
  static func segmentHeaders(in path: String) -> [UInt8]? {
    let fd = systemOpen(WriteAheadSegment.path(in: path), O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var bytes = [UInt8](repeating: 0, count: 1024)
    let count = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress, 1024, 0) }
    return count < 0 ? nil : Array(bytes.prefix(count))
  }

  static func copyFile(_ source: String, to target: String, store: String) throws {
    let input = systemOpen(source, O_RDONLY | O_CLOEXEC)
    guard input >= 0 else {
      let code = errno
      if code == ENOENT { return }
      throw copyError(code, doing: "reading \(source)", store: store)
    }
    defer { close(input) }
    let output = systemOpen(target, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
    guard output >= 0 else { throw copyError(errno, doing: "creating \(target)", store: store) }
    defer { close(output) }
    var buffer = [UInt8](repeating: 0, count: 1 << 20)
    while true {
      let count = buffer.withUnsafeMutableBytes { read(input, $0.baseAddress, $0.count) }
      if count < 0 {
        if errno == EINTR { continue }
        throw copyError(errno, doing: "reading \(source)", store: store)
      }
      if count == 0 { return }
      var written = 0
      while written < count {
        let step = buffer.withUnsafeBytes { bytes in
          bytes.baseAddress.map { write(output, $0 + written, count - written) } ?? -1
        }
        if step < 0 {
          if errno == EINTR { continue }
          throw copyError(errno, doing: "writing \(target)", store: store)
        }
        written += step
      }
    }
  }

  static func copyError(_ code: Int32, doing: String, store: String) -> FerryLogError {
    let why =
      code == ENOSPC || code == EDQUOT
      ? "no room in the temporary directory" : String(cString: strerror(code))
    return .recoveredCopyFailed(path: store, reason: "\(doing): \(why)")
  }
}
