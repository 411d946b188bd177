import CFerryLMDB

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// An error from LMDB or from the operating system while working on an LMDB environment.
///
/// The `code` is LMDB's `MDB_*` return code, or an `errno` value for system errors, exactly as LMDB
/// reported it. Match on the static constants:
///
/// ```swift
/// do { try env.write { try $0.put(db, key: k, value: v) } }
/// catch let error as LMDBError where error == .mapFull { ... }
/// ```
public struct LMDBError: Error, Hashable, Sendable, CustomStringConvertible {
  /// LMDB's return code (`MDB_*`, negative) or an `errno` value (positive).
  public let code: Int32
  /// LMDB's own message for the code (`mdb_strerror`), plus what Ferry was doing when it happened.
  public let message: String

  /// Wraps a return code, keeping LMDB's message and an optional note on the operation.
  public init(code: Int32, operation: String? = nil) {
    self.code = code
    let base = String(cString: mdb_strerror(code))
    self.message = operation.map { "\($0): \(base)" } ?? base
  }

  /// Builds an error with an explicit message (used for checks Ferry makes before calling LMDB).
  public init(code: Int32, message: String) {
    self.code = code
    self.message = message
  }

  /// Two errors are equal when their codes are, so `error == .mapFull` matches whatever the message.
  public static func == (lhs: LMDBError, rhs: LMDBError) -> Bool { lhs.code == rhs.code }
  /// Hashes the code only, consistent with `==`.
  public func hash(into hasher: inout Hasher) { hasher.combine(code) }

  /// A short description: the symbolic name of the code and the message.
  public var description: String { "LMDBError.\(name) (\(code)): \(message)" }

  /// The symbolic name of the code (`MDB_MAP_FULL`, `ENOENT`, ...).
  public var name: String {
    switch code {
    case MDB_KEYEXIST: return "MDB_KEYEXIST"
    case MDB_NOTFOUND: return "MDB_NOTFOUND"
    case MDB_PAGE_NOTFOUND: return "MDB_PAGE_NOTFOUND"
    case MDB_CORRUPTED: return "MDB_CORRUPTED"
    case MDB_PANIC: return "MDB_PANIC"
    case MDB_VERSION_MISMATCH: return "MDB_VERSION_MISMATCH"
    case MDB_INVALID: return "MDB_INVALID"
    case MDB_MAP_FULL: return "MDB_MAP_FULL"
    case MDB_DBS_FULL: return "MDB_DBS_FULL"
    case MDB_READERS_FULL: return "MDB_READERS_FULL"
    case MDB_TLS_FULL: return "MDB_TLS_FULL"
    case MDB_TXN_FULL: return "MDB_TXN_FULL"
    case MDB_CURSOR_FULL: return "MDB_CURSOR_FULL"
    case MDB_PAGE_FULL: return "MDB_PAGE_FULL"
    case MDB_MAP_RESIZED: return "MDB_MAP_RESIZED"
    case MDB_INCOMPATIBLE: return "MDB_INCOMPATIBLE"
    case MDB_BAD_RSLOT: return "MDB_BAD_RSLOT"
    case MDB_BAD_TXN: return "MDB_BAD_TXN"
    case MDB_BAD_VALSIZE: return "MDB_BAD_VALSIZE"
    case MDB_BAD_DBI: return "MDB_BAD_DBI"
    case ENOENT: return "ENOENT"
    case EACCES: return "EACCES"
    case EPERM: return "EPERM"
    case EROFS: return "EROFS"
    case ENOTDIR: return "ENOTDIR"
    case ENOSPC: return "ENOSPC"
    case EAGAIN: return "EAGAIN"
    case EINVAL: return "EINVAL"
    case EBUSY: return "EBUSY"
    case EIO: return "EIO"
    case ENOMEM: return "ENOMEM"
    default: return code > 0 ? "errno(\(code))" : "MDB(\(code))"
    }
  }

  /// The key/data pair already exists (`MDB_KEYEXIST`).
  public static let keyExists = LMDBError(code: MDB_KEYEXIST, message: "key exists")
  /// No matching key/data pair (`MDB_NOTFOUND`).
  public static let notFound = LMDBError(code: MDB_NOTFOUND, message: "not found")
  /// A page a pointer led to is not in the file: the file is damaged (`MDB_PAGE_NOTFOUND`).
  public static let pageNotFound = LMDBError(code: MDB_PAGE_NOTFOUND, message: "page not found")
  /// A page had the wrong type: the file is damaged (`MDB_CORRUPTED`).
  public static let corrupted = LMDBError(code: MDB_CORRUPTED, message: "corrupted")
  /// A fatal error; the environment must be closed (`MDB_PANIC`).
  public static let panic = LMDBError(code: MDB_PANIC, message: "panic")
  /// The file was written by an incompatible LMDB version (`MDB_VERSION_MISMATCH`).
  public static let versionMismatch = LMDBError(code: MDB_VERSION_MISMATCH, message: "version mismatch")
  /// The file is not an LMDB file (`MDB_INVALID`).
  public static let invalid = LMDBError(code: MDB_INVALID, message: "invalid")
  /// The map size limit was reached (`MDB_MAP_FULL`).
  public static let mapFull = LMDBError(code: MDB_MAP_FULL, message: "map full")
  /// Too many named databases (`MDB_DBS_FULL`).
  public static let databasesFull = LMDBError(code: MDB_DBS_FULL, message: "databases full")
  /// Too many readers (`MDB_READERS_FULL`).
  public static let readersFull = LMDBError(code: MDB_READERS_FULL, message: "readers full")
  /// A transaction holds too many dirty pages (`MDB_TXN_FULL`).
  public static let transactionFull = LMDBError(code: MDB_TXN_FULL, message: "transaction full")
  /// A cursor's stack ran out: a B-tree deeper than any LMDB builds, so damage (`MDB_CURSOR_FULL`).
  public static let cursorFull = LMDBError(code: MDB_CURSOR_FULL, message: "cursor stack full")
  /// Another process grew the map beyond this one's size (`MDB_MAP_RESIZED`).
  public static let mapResized = LMDBError(code: MDB_MAP_RESIZED, message: "map resized")
  /// A database was opened with incompatible flags (`MDB_INCOMPATIBLE`).
  public static let incompatible = LMDBError(code: MDB_INCOMPATIBLE, message: "incompatible")
  /// The transaction cannot be used any more (`MDB_BAD_TXN`).
  public static let badTransaction = LMDBError(code: MDB_BAD_TXN, message: "bad transaction")
  /// A key or value has a size LMDB cannot hold (`MDB_BAD_VALSIZE`).
  public static let badValueSize = LMDBError(code: MDB_BAD_VALSIZE, message: "bad value size")
  /// The database handle is not valid (`MDB_BAD_DBI`).
  public static let badDatabase = LMDBError(code: MDB_BAD_DBI, message: "bad database")
  /// A file or directory does not exist (`ENOENT`).
  public static let noSuchFile = LMDBError(code: ENOENT, message: "no such file or directory")
  /// Permission denied (`EACCES`).
  public static let permissionDenied = LMDBError(code: EACCES, message: "permission denied")
  /// The operation is not permitted (`EPERM`).
  public static let notPermitted = LMDBError(code: EPERM, message: "operation not permitted")
  /// The file system is read-only (`EROFS`).
  public static let readOnlyFileSystem = LMDBError(code: EROFS, message: "read-only file system")
  /// The path exists but is not a directory (`ENOTDIR`).
  public static let notADirectory = LMDBError(code: ENOTDIR, message: "not a directory")
  /// The environment is already open in this process (`EBUSY`).
  public static let alreadyOpen = LMDBError(code: EBUSY, message: "already open in this process")
  /// No space left on the device (`ENOSPC`).
  public static let noSpace = LMDBError(code: ENOSPC, message: "no space left on device")
}

@inline(__always)
func check(_ rc: Int32, _ operation: @autoclosure () -> String) throws(LMDBError) {
  if rc != MDB_SUCCESS { throw LMDBError(code: rc, operation: operation()) }
}
