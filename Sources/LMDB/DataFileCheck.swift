import CFerryLMDB

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// What the two meta pages of an LMDB data file say, read with plain file reads before LMDB maps
/// the file — so that a file LMDB would crash on (a truncated one faults when a mapped page past
/// its end is touched) or silently misread (a meta page damaged into looking newest) is refused
/// with a reason instead.
///
/// Meta page 0 starts at byte 0, meta page 1 one page in (`PageLayout` names the fields).
/// Transaction t writes its meta into page t & 1, so in a healthy file the two transaction ids
/// differ by one and each matches its page's parity (a new file has 0 in both; a compacted copy
/// has 0 and 1).
public struct DataFileCheck: Sendable, Equatable {
  /// One meta page.
  public struct Meta: Sendable, Equatable {
    /// `mm_magic`: LMDB's magic number when the page is a meta page.
    public var magic: UInt32
    /// `mm_version`: the data format version.
    public var version: UInt32
    /// The page size the file was written with.
    public var pageSize: UInt32
    /// `mm_mapsize`: the map size the writer last set.
    public var mapSize: UInt64
    /// `mm_last_pg`: the last page in use.
    public var lastPage: UInt64
    /// `mm_txnid`: the transaction that wrote this meta page.
    public var transaction: UInt64
    /// The root pages of LMDB's free-page database and of its main database (which names every
    /// other database); `~0` when empty.
    public var freeRoot: UInt64
    /// The main database's root page (see `freeRoot`).
    public var mainRoot: UInt64
    /// The `md_flags` of those two databases.
    public var freeFlags: UInt16 = 0
    /// The main database's `md_flags` (see `freeFlags`).
    public var mainFlags: UInt16 = 0
  }

  /// The data file's length in bytes.
  public let fileSize: Int
  /// The two meta pages, as read (nil when the file is too short to hold one).
  public let metas: [Meta?]

  /// LMDB's magic number, at the start of each meta page's fields.
  public static let magic = PageLayout.magic
  /// The data format version LMDB 0.9 writes.
  public static let dataVersion = PageLayout.dataVersion

  /// Reads the meta pages of the data file at `file`. Throws ``LMDBError`` with the OS error when
  /// the file cannot be opened or read (`EACCES` for permission, for example).
  public static func read(_ file: String) throws -> DataFileCheck {
    let fd = try openDataFile(file)
    defer { close(fd) }
    return try read(fd, file: file)
  }

  /// Opens the data file for plain reads (never blocking on a FIFO put in its place); only a
  /// regular file is accepted.
  private static func openDataFile(_ file: String) throws -> Int32 {
    let fd = open(file, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
    guard fd >= 0 else {
      let code = errno
      throw LMDBError(code: code, operation: "opening \(file) to check its meta pages")
    }
    var kind = stat()
    guard fstat(fd, &kind) == 0, (kind.st_mode & S_IFMT) == S_IFREG else {
      close(fd)
      throw LMDBError(code: MDB_CORRUPTED, message: "data.mdb is not a regular file")
    }
    return fd
  }

  private static func read(_ fd: Int32, file: String) throws -> DataFileCheck {
    // The meta pages are read before the length: another process committing meanwhile only ever
    // makes the file longer than the pages they name.
    let first = try readMeta(fd, at: 0, file: file)
    // The page size comes from meta page 0; when that page is damaged, try the usual sizes so
    // that meta page 1 is still described.
    var candidates = [Int(sysconf(Int32(_SC_PAGESIZE)))] + PageLayout.commonPageSizes
    if let first, first.magic == magic, PageLayout.pageSizeRange.contains(Int(first.pageSize)) {
      candidates = [Int(first.pageSize)]
    }
    var second: Meta?
    for pageSize in candidates where PageLayout.pageSizeRange.contains(pageSize) {
      if let meta = try readMeta(fd, at: pageSize, file: file), meta.magic == magic {
        second = meta
        break
      }
    }
    if second == nil, let pageSize = candidates.first {
      second = try readMeta(fd, at: pageSize, file: file)
    }
    var info = stat()
    guard fstat(fd, &info) == 0 else {
      let code = errno
      throw LMDBError(code: code, operation: "reading the size of \(file)")
    }
    return DataFileCheck(fileSize: Int(info.st_size), metas: [first, second])
  }

  private static func readMeta(_ fd: Int32, at offset: Int, file: String) throws -> Meta? {
    var buffer = [UInt8](repeating: 0, count: PageLayout.metaSize)
    let got = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, PageLayout.metaSize, off_t(offset)) }
    guard got == PageLayout.metaSize,
      let fields = buffer.withUnsafeBytes({ PageLayout.metaFields($0) })
    else {
      if got < 0 {
        let code = errno
        throw LMDBError(code: code, operation: "reading the meta page at byte \(offset) of \(file)")
      }
      return nil
    }
    return Meta(
      magic: fields.magic, version: fields.version, pageSize: fields.pageSize, mapSize: fields.mapSize,
      lastPage: fields.lastPage, transaction: fields.transaction, freeRoot: fields.freeRoot,
      mainRoot: fields.mainRoot, freeFlags: fields.freeFlags, mainFlags: fields.mainFlags)
  }

  /// Checks LMDB's free-page list against the live trees, and any pages past the end of the file,
  /// for the state of transaction `transaction` (which the caller keeps pinned with a read
  /// transaction, so that no page of it is reused meanwhile). Nil when healthy, or when the meta
  /// page of that transaction is no longer on disk (later commits replaced it: the check is skipped).
  public static func freeListProblem(_ file: String, transaction: UInt64) throws -> String? {
    try freeListProblem(file, transaction: transaction, parallelAbove: FreeListCheck.parallelWalkPages)
  }

  /// As above; the named databases' trees are walked on several threads when their records count at
  /// least `parallelAbove` pages (tests set 0, to take that path with small files).
  package static func freeListProblem(
    _ file: String, transaction: UInt64, parallelAbove: UInt64
  ) throws -> String? {
    let fd = try openDataFile(file)
    defer { close(fd) }
    let check = try read(fd, file: file)
    guard
      let meta = check.metas.compactMap({ $0 }).first(where: {
        $0.magic == magic && $0.transaction == transaction
      }),
      PageLayout.pageSizeRange.contains(Int(meta.pageSize))
    else { return nil }
    let pageSize = Int(meta.pageSize)
    // The whole pages of the file, mapped read-only: the walk touches each tree page once with no
    // read call per page. Only pages inside the file as measured are ever touched (LMDB never
    // shortens a data file it has open).
    let length = check.fileSize / pageSize * pageSize
    // No whole page (an empty file): nothing to map, and the walk reads nothing.
    var address: UnsafeMutableRawPointer?
    if length > 0 {
      guard let mapped = mmap(nil, length, PROT_READ, MAP_SHARED, fd, 0), mapped != MAP_FAILED else {
        let code = errno
        throw LMDBError(code: code, operation: "mapping \(file) to check its free-page list")
      }
      address = mapped
    }
    defer { if let address { munmap(address, length) } }
    return FreeListCheck(
      map: UnsafeRawBufferPointer(start: address, count: address == nil ? 0 : length), pageSize: pageSize,
      meta: meta, fileSize: check.fileSize, parallelAbove: parallelAbove
    )
    .problem
  }

  /// The meta page LMDB would use: the valid one with the larger transaction id.
  public var newest: Meta? {
    metas.compactMap { $0 }.filter { $0.magic == Self.magic }.max { $0.transaction < $1.transaction }
  }

  /// Whether either meta page carries LMDB's magic number: a file without it is not LMDB's at all
  /// (LMDB reports `MDB_INVALID`), rather than a damaged one.
  public var isLMDB: Bool { metas.contains { $0?.magic == Self.magic } }

  /// Why this data file is not safe to hand to LMDB, or nil when its meta pages agree with each
  /// other and with the file's length.
  public var problem: String? {
    if fileSize == 0 { return "its data file is empty (0 bytes)" }
    guard let zero = metas[0], let one = metas[1] else {
      return "its data file is \(fileSize) bytes, too short to hold LMDB's two meta pages"
    }
    if zero.magic != Self.magic && one.magic != Self.magic { return nil }  // not LMDB's: see isLMDB
    for (slot, meta) in [(0, zero), (1, one)] {
      if meta.magic != Self.magic {
        return
          "meta page \(slot) does not start with LMDB's magic number (found 0x\(String(meta.magic, radix: 16)))"
      }
      if meta.version != Self.dataVersion {
        return "meta page \(slot) has LMDB data version \(meta.version), not \(Self.dataVersion)"
      }
    }
    let pageSize = UInt64(zero.pageSize)
    guard PageLayout.isPlausiblePageSize(Int(zero.pageSize)) else {
      return "meta page 0 gives a page size of \(zero.pageSize) bytes"
    }
    if one.pageSize != zero.pageSize {
      return "the meta pages disagree on the page size (\(zero.pageSize) and \(one.pageSize) bytes)"
    }
    let (t0, t1) = (zero.transaction, one.transaction)
    let fresh = t0 == 0 && t1 == 0
    if !fresh {
      if t0 & 1 != 0 || t1 & 1 != 1 {
        return
          "a meta page holds a transaction id of the wrong parity (page 0: \(t0), page 1: \(t1)): one was damaged"
      }
      let gap = t0 > t1 ? t0 - t1 : t1 - t0
      if gap != 1 {
        return
          "the meta pages' transaction ids \(t0) and \(t1) are not consecutive: one was damaged (or LMDB would pick a state that was never the newest)"
      }
    }
    let newest = t0 >= t1 ? zero : one
    let (pages, overflow) = newest.lastPage.addingReportingOverflow(1)
    let (needed, overflow2) = pages.multipliedReportingOverflow(by: pageSize)
    if overflow || overflow2 || needed > UInt64(Int.max) {
      return "the newest meta page gives an impossible last page (\(newest.lastPage))"
    }
    // A file shorter than `needed` may be healthy (pages allocated and freed in one transaction
    // are never written): ``FreeListCheck`` tells, once a read transaction pins the state. Only
    // a file that cannot even hold the trees' roots is refused here.
    let roots = [newest.freeRoot, newest.mainRoot].filter { $0 != .max }
    if let root = roots.max(), (root + 1) * pageSize > UInt64(fileSize) {
      return
        "its data file is \(fileSize) bytes but its newest meta page puts a root at page \(root), past its end: the file was truncated"
    }
    // No machine maps more than 2^47 bytes of user address space: a larger map size is damage.
    if newest.mapSize > 1 << 46 {
      return "the newest meta page gives an impossible map size (\(newest.mapSize) bytes)"
    }
    for (name, root) in [("free-page", newest.freeRoot), ("main", newest.mainRoot)] where root != .max {
      if root < 2 || root > newest.lastPage {
        return
          "the newest meta page puts the \(name) database's root at page \(root), outside the pages in use (2…\(newest.lastPage))"
      }
    }
    // LMDB stores the free database as MDB_INTEGERKEY (0 before the first commit) and Ferry
    // opens the main one with no flags; another bit (MDB_DUPSORT, say) sends a write down code
    // paths for a tree this is not, which ends in an assertion (SIGABRT) or a wild write.
    if newest.freeFlags & ~PageLayout.integerKey != 0 || newest.mainFlags != 0 {
      return
        "the newest meta page gives database flags LMDB never stores there (free-page database 0x\(String(newest.freeFlags, radix: 16)), main 0x\(String(newest.mainFlags, radix: 16)))"
    }
    if newest.mapSize < needed {
      return
        "the newest meta page's map size (\(newest.mapSize) bytes) is smaller than the pages it uses (\(needed) bytes)"
    }
    return nil
  }
}
