import CFerryLMDB

/// The version of an LMDB library, and whether Ferry can run on it.
///
/// Ferry reads LMDB's pages itself — the checks before a data file is mapped, the free-page list
/// check, the write-ahead segment's checkpoints, `ferry salvage` — and those reads know LMDB 0.9's
/// layout only: a 16-byte page header, the meta page's fields at fixed offsets. LMDB's 1.0 line
/// widens the page header to 24 bytes and calls itself 0.9.90 while in development, so the patch
/// number counts too: 0.9.0 up to 0.9.89 (the releases and the 0.9 development branch, 0.9.70)
/// share the layout, 0.9.90 and later, 1.x and anything else do not.
public struct LMDBVersion: Sendable, Hashable, Comparable, CustomStringConvertible {
  /// The major version.
  public let major: Int
  /// The minor version.
  public let minor: Int
  /// The patch number.
  public let patch: Int

  /// A version from its three numbers.
  public init(major: Int, minor: Int, patch: Int) {
    self.major = major
    self.minor = minor
    self.patch = patch
  }

  /// The LMDB this process runs on (`mdb_version`): the library linked, not the header compiled.
  public static let linked: LMDBVersion = {
    var major: Int32 = 0
    var minor: Int32 = 0
    var patch: Int32 = 0
    _ = mdb_version(&major, &minor, &patch)
    return LMDBVersion(major: Int(major), minor: Int(minor), patch: Int(patch))
  }()

  /// The versions whose page layout Ferry's own reads were written for, as people say it.
  public static let supportedRange =
    "LMDB 0.9.0 to 0.9.89 (the 0.9 releases; not the 1.0 line, whose pages are laid out otherwise)"

  /// The first patch of the 0.9 line that is LMDB 1.0 in development (`mdb.master3`: 24-byte page headers).
  static let firstPatchOfTheNextLayout = 90

  /// Whether Ferry's reads of LMDB's pages fit this version's layout.
  public var isSupported: Bool {
    major == 0 && minor == 9 && (0..<Self.firstPatchOfTheNextLayout).contains(patch)
  }

  /// `major.minor.patch`.
  public var description: String { "\(major).\(minor).\(patch)" }

  /// Orders by major, then minor, then patch.
  public static func < (lhs: LMDBVersion, rhs: LMDBVersion) -> Bool {
    (lhs.major, lhs.minor, lhs.patch) < (rhs.major, rhs.minor, rhs.patch)
  }

  /// Throws ``LMDBError/versionMismatch``, with a message naming `running` and the versions
  /// supported, unless Ferry's reads of LMDB's pages fit `running` (``isSupported``).
  package static func requireSupported(_ running: LMDBVersion = .linked) throws(LMDBError) {
    guard running.isSupported else {
      throw LMDBError(
        code: MDB_VERSION_MISMATCH,
        message:
          "this process runs on LMDB \(running), whose page layout Ferry's checks of its files were not "
          + "written for; Ferry supports \(supportedRange): build it with one of those (nothing was opened)")
    }
  }
}
