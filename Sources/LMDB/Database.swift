import CFerryLMDB

/// A handle to one named database (a B-tree of sorted keys) inside an ``Environment``.
///
/// Handles are opened once, all in one committed transaction, by ``Environment/open(path:options:databases:)``
/// or ``Environment/openDatabases(_:)``, and stay valid while the environment is open.
public struct Database: Sendable, Hashable, CustomStringConvertible {
  let dbi: MDB_dbi
  /// The database's name in the environment.
  public let name: String

  /// The database's name.
  public var description: String { name }
}

/// Flags for ``Transaction/put(_:key:value:flags:)``.
public struct PutFlags: OptionSet, Sendable {
  /// The raw `MDB_*` write flags.
  public let rawValue: UInt32
  /// Creates flags from raw `MDB_*` write flags.
  public init(rawValue: UInt32) { self.rawValue = rawValue }

  /// Fail with ``LMDBError/keyExists`` instead of overwriting (`MDB_NOOVERWRITE`).
  public static let noOverwrite = PutFlags(rawValue: UInt32(MDB_NOOVERWRITE))
  /// The key sorts after every key already present: a fast append (`MDB_APPEND`).
  /// LMDB refuses a key out of order with ``LMDBError/keyExists``.
  public static let append = PutFlags(rawValue: UInt32(MDB_APPEND))
}

/// Statistics of one database (`mdb_stat`).
public struct DatabaseStatistics: Sendable, Equatable {
  /// Number of key/value pairs.
  public var entries: Int
  /// Depth of the B-tree.
  public var depth: Int
  /// Branch, leaf and overflow pages in use.
  public var pages: Int
}
