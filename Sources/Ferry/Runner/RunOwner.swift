import FerryLog
import Foundation
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A process's liveness token in a store: an exclusive `flock(2)` on `owners/<id>` in the store's
/// directory, held for as long as the process has the store open to run tasks. The operating system
/// releases it when the process dies, however it dies, so "the lock can be taken" means "the owner
/// is gone" (`Specs/task-events.md` §4, ownership).
///
/// `flock` locks belong to an open file description, not to a process: a second descriptor of the
/// same file, even in the owning process, cannot take the lock while the owner holds it.
final class RunOwner: Sendable {
  /// The owner id logged with every claim: the process id and 64 random bits, in hex.
  let id: String
  private let path: String
  private let descriptor = Mutex<Int32>(-1)

  /// Owner ids are written by Ferry as `<pid hex>-<16 hex digits>`; anything else read from a
  /// log is not an owner that can hold a token (a store from before owners, or damage).
  static func isValidId(_ id: String) -> Bool {
    let utf8 = id.utf8
    guard (3...40).contains(utf8.count) else { return false }
    return utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) || $0 == 0x2D }
  }

  static func directory(of storePath: String) -> String { storePath + "/owners" }

  /// Creates the token file and takes its lock; throws when the store's directory will not take it.
  init(storePath: String) throws {
    let random = UInt64.random(in: 0...UInt64.max)
    id = String(UInt32(truncatingIfNeeded: getpid()), radix: 16) + "-" + Self.hex16(random)
    let directory = Self.directory(of: storePath)
    if mkdir(directory, 0o700) != 0 && errno != EEXIST {
      throw FerryError.invalidArgument(
        "cannot create \(directory) for the runners' liveness tokens: \(String(cString: strerror(errno)))")
    }
    path = directory + "/" + id
    let fd = try Self.createLockedToken(at: path, id: id, directory: directory)
    descriptor.withLock { $0 = fd }
  }

  /// Creates the token file locked: locked under a temporary name, then renamed, so a file under
  /// an owner's name is always locked while its owner lives (a checker can never take the lock in
  /// between and call it dead). Another process's open may sweep the staging file away between its
  /// creation and its lock (to that sweep it is a killed process's leftover): then it tries again
  /// with a new one, a few times.
  private static func createLockedToken(at path: String, id: String, directory: String) throws -> Int32 {
    let staging = directory + "/." + id + ".new"
    var attempt = 0
    while true {
      attempt += 1
      unlink(staging)
      let fd = open(staging, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
      guard fd >= 0 else {
        throw FerryError.invalidArgument(
          "cannot create the liveness token \(staging): \(String(cString: strerror(errno)))")
      }
      CrashPoint.reach(CrashPoint.ownerTokenStaged)
      if flock(fd, LOCK_EX | LOCK_NB) == 0 && rename(staging, path) == 0 { return fd }
      let reason = String(cString: strerror(errno))
      close(fd)
      guard attempt < 5 else {
        unlink(staging)
        throw FerryError.invalidArgument("cannot set up the liveness token \(path): \(reason)")
      }
    }
  }

  /// Makes sure the token file is still there under its name (someone may have deleted it, or the
  /// whole `owners/` directory): a live owner re-creates it, so that a missing token can be read
  /// as a dead owner's. Called at every look for dead owners.
  func ensureToken() {
    let current = descriptor.withLock { $0 }
    guard current >= 0 else { return }
    var held = stat()
    var named = stat()
    let intact =
      fstat(current, &held) == 0 && held.st_nlink > 0 && stat(path, &named) == 0
      && named.st_ino == held.st_ino
      && named.st_dev == held.st_dev
    if intact { return }
    let ownersDirectory = (path as NSString).deletingLastPathComponent
    if mkdir(ownersDirectory, 0o700) != 0 && errno != EEXIST { return }
    guard let fresh = try? Self.createLockedToken(at: path, id: id, directory: ownersDirectory) else {
      return
    }
    let old = descriptor.withLock { fd -> Int32 in
      defer { fd = fresh }
      return fd
    }
    if old >= 0 { close(old) }
  }

  private static func hex16(_ value: UInt64) -> String {
    let digits = String(value, radix: 16)
    return String(repeating: "0", count: 16 - digits.count) + digits
  }

  /// Gives the token up (the process is done running this store's tasks). The file stays,
  /// unlocked: a claim this owner left (or one still in the writer's queue as it closed) is then
  /// seen as a dead owner's and interrupted; the sweep at the next open removes the file once no
  /// claim names it. With `remove` (an owner that never claimed) it goes at once.
  func release(remove: Bool = false) {
    let fd = descriptor.withLock { fd -> Int32 in
      defer { fd = -1 }
      return fd
    }
    guard fd >= 0 else { return }
    if remove { unlink(path) }
    // Unlocked before it is closed: a process being spawned meanwhile (between its fork and its
    // exec) shares this open file, and close() alone would leave the lock held until it execs.
    flock(fd, LOCK_UN)
    close(fd)
  }

  deinit { release() }

  /// What a look at another owner's token found.
  enum Liveness: Equatable {
    /// Its lock is held: the owner is alive. Also the answer when the token cannot be examined
    /// (another user's file, say): a run that may be live is never taken away.
    case alive
    /// No token, or a lock that could be taken: the owner is gone.
    case dead
  }

  /// Whether the owner `id` of a store is alive.
  ///
  /// A token whose lock can be taken belongs to a dead owner. A token that is missing (removed by
  /// hand, or by a checker that found its owner dead) counts as dead only when no process has the
  /// owner's pid — a live owner whose file someone deleted keeps its runs.
  static func liveness(of id: String, storePath: String) -> Liveness {
    guard isValidId(id) else { return .dead }
    let path = directory(of: storePath) + "/" + id
    let fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
    guard fd >= 0 else {
      // No token (no file, or no owners/ directory at all): its owner is gone unless its process
      // lives (a live owner re-creates a deleted token at its next look). Anything else: cannot
      // look, and a run that may be live is never taken.
      guard errno == ENOENT || errno == ENOTDIR else { return .alive }
      return processExists(of: id) ? .alive : .dead
    }
    defer { close(fd) }
    var info = stat()
    guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else { return .alive }
    guard flock(fd, LOCK_EX | LOCK_NB) == 0 else { return .alive }
    flock(fd, LOCK_UN)  // never left held by a process spawned before the close
    return .dead
  }

  /// Whether a process with the pid written in an owner id exists (on this machine).
  static func processExists(of id: String) -> Bool {
    guard let hex = id.split(separator: "-").first, let pid = UInt32(hex, radix: 16), pid > 0,
      pid <= UInt32(Int32.max)
    else { return false }
    return kill(Int32(pid), 0) == 0 || errno == EPERM
  }

  /// Removes the tokens of dead owners that no claim names any more (`claimed`): the files a
  /// closed or killed process left behind.
  static func sweep(storePath: String, claimed: Set<String>, except mine: String?) {
    let directory = directory(of: storePath)
    guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return }
    for name in names where name != mine {
      // A token no claim names, or a staging file of a process killed while it made its token.
      let staging = name.hasPrefix(".") && name.hasSuffix(".new")
      guard staging || (isValidId(name) && !claimed.contains(name)) else { continue }
      if let mine, staging && name == "." + mine + ".new" { continue }
      removeIfUnlocked(directory + "/" + name)
    }
  }

  /// Removes a token file whose lock can be taken (its owner is gone).
  private static func removeIfUnlocked(_ path: String) {
    let fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
    guard fd >= 0 else { return }
    if flock(fd, LOCK_EX | LOCK_NB) == 0 {
      unlink(path)
      flock(fd, LOCK_UN)
    }
    close(fd)
  }

  /// Removes the token of an owner found dead, once its runs were interrupted.
  static func forget(_ id: String, storePath: String) {
    guard isValidId(id) else { return }
    removeIfUnlocked(directory(of: storePath) + "/" + id)
  }
}
