/// LMDB 0.9's on-disk page layout (64-bit builds, from `mdb.c`), named once for everything in Ferry
/// that reads a data file without LMDB: the meta-page check before an open, the free-list check,
/// and `ferry salvage`'s page reader. LMDB writes its fields in the host's byte order, which is
/// little-endian on every machine Ferry runs on (x86-64, arm64).
package enum PageLayout {
  // MARK: Page header: mp_pgno u64 @0, mp_pad u16 @8, mp_flags u16 @10, mp_lower u16 @12,
  // mp_upper u16 @14 (mp_pages u32 @12 on an overflow page); then the node pointers (u16 each).

  /// `mp_pgno`: the page's own number (u64).
  package static let pageNumberOffset = 0
  /// `mp_flags` (u16).
  package static let pageFlagsOffset = 10
  /// `mp_lower` (u16): where the node pointer array ends, counted from the page's start.
  package static let lowerOffset = 12
  /// `mp_upper` (u16): where the nodes begin.
  package static let upperOffset = 14
  /// The page header's size; the node pointers follow it, as does an overflow page's data.
  package static let pageHeaderSize = 16
  /// The size of one node pointer (a u16 offset into the page).
  package static let nodePointerSize = 2

  /// Page flags (`P_BRANCH`, `P_LEAF`, `P_OVERFLOW`, `P_META`, `P_DIRTY`, `P_LEAF2`, `P_SUBP`).
  package static let branch: UInt16 = 0x01
  package static let leaf: UInt16 = 0x02
  package static let overflow: UInt16 = 0x04
  package static let meta: UInt16 = 0x08
  /// Only ever in memory: a page this transaction has copied to write into.
  package static let dirty: UInt16 = 0x10
  package static let leaf2: UInt16 = 0x20
  package static let subPage: UInt16 = 0x40
  /// The flags that say what kind of page it is.
  package static let kindFlags: UInt16 = branch | leaf | overflow | meta | leaf2 | subPage

  // MARK: Node header: mn_lo u16 @0, mn_hi u16 @2 (the data size, or a branch node's child page
  // number with mn_flags as its top 16 bits), mn_flags u16 @4, mn_ksize u16 @6; then the key, then
  // the data (inline, or the u64 number of its first overflow page).

  package static let nodeLowOffset = 0
  package static let nodeHighOffset = 2
  package static let nodeFlagsOffset = 4
  package static let nodeKeySizeOffset = 6
  package static let nodeHeaderSize = 8

  /// Node flags (`F_BIGDATA`: the data is on overflow pages; `F_SUBDATA`: it is a named database's
  /// record; `F_DUPDATA`: it holds duplicates).
  package static let bigData: UInt16 = 0x01
  package static let subData: UInt16 = 0x02
  package static let dupData: UInt16 = 0x04

  // MARK: Meta page (after the page header): mm_magic u32 @16, mm_version u32 @20, mm_address @24,
  // mm_mapsize u64 @32, mm_dbs[0] (free pages) and mm_dbs[1] (main) from @40, mm_last_pg u64 @136,
  // mm_txnid u64 @144. Meta page 0 starts at byte 0, meta page 1 one page in.

  package static let magic: UInt32 = 0xBEEF_C0DE
  /// The data format version (`MDB_DATA_VERSION`).
  package static let dataVersion: UInt32 = 1
  package static let magicOffset = 16
  package static let versionOffset = 20
  package static let mapSizeOffset = 32
  /// `mm_dbs[0]`, the free-page database's record.
  package static let freeDatabaseOffset = 40
  /// `mm_dbs[1]`, the main database's record (which names every other database).
  package static let mainDatabaseOffset = 88
  package static let lastPageOffset = 136
  package static let transactionOffset = 144
  /// The bytes of a meta page that hold all of the above.
  package static let metaSize = 152
  /// The first database record's `md_pad` holds the page size.
  package static let pageSizeOffset = freeDatabaseOffset + databasePadOffset

  // MARK: Database record (MDB_db, 48 bytes): md_pad u32 @0, md_flags u16 @4, md_depth u16 @6,
  // page and entry counts, md_root u64 @40 (all ones when the database is empty).

  package static let databaseRecordSize = 48
  package static let databasePadOffset = 0
  package static let databaseFlagsOffset = 4
  package static let databaseDepthOffset = 6
  package static let databaseBranchPagesOffset = 8
  package static let databaseLeafPagesOffset = 16
  package static let databaseRootOffset = 40
  /// `MDB_INTEGERKEY`: the only flag LMDB stores on the free-page database.
  package static let integerKey: UInt16 = 0x08

  // MARK: Free-page database: one entry per freeing transaction, its data a u64 count and then that
  // many u64 page numbers.

  /// The size of the count and of each page number in a free-list entry.
  package static let freeListWordSize = 8

  // MARK: Page sizes

  /// The page sizes LMDB can have (powers of two within).
  package static let pageSizeRange = 512...65536
  /// Sizes worth trying, in order, when no meta page names one.
  package static let commonPageSizes = [4096, 16384, 65536]
  /// Whether LMDB can have a page of `size` bytes.
  package static func isPlausiblePageSize(_ size: Int) -> Bool {
    pageSizeRange.contains(size) && size & (size - 1) == 0
  }

  /// The pages an overflow run holding `dataSize` bytes takes (the header, then the data).
  package static func overflowPages(dataSize: Int, pageSize: Int) -> Int {
    (dataSize + pageHeaderSize + pageSize - 1) / pageSize
  }

  // MARK: Readers

  /// The little-endian `T` at `offset` in `bytes`; nil unless it lies wholly inside them.
  package static func field<T: FixedWidthInteger & UnsignedInteger>(
    _ type: T.Type, in bytes: UnsafeRawBufferPointer, at offset: Int
  ) -> T? {
    guard offset >= 0, offset <= bytes.count - MemoryLayout<T>.size else { return nil }
    return T(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: T.self))
  }

  /// The header of the node at `offset` of a page, as LMDB packs it.
  package struct NodeHeader: Sendable, Equatable {
    package var low: UInt16
    package var high: UInt16
    package var flags: UInt16
    package var keySize: Int
    /// A leaf node's data size.
    package var dataSize: Int { Int(low) | Int(high) << 16 }
    /// A branch node's child page (its flags field holds the number's top bits).
    package var childPage: UInt64 { UInt64(low) | UInt64(high) << 16 | UInt64(flags) << 32 }
  }

  /// The node header at `offset` in `page`; nil unless it lies wholly inside the bytes.
  package static func nodeHeader(in page: UnsafeRawBufferPointer, at offset: Int) -> NodeHeader? {
    guard let low = field(UInt16.self, in: page, at: offset + nodeLowOffset),
      let high = field(UInt16.self, in: page, at: offset + nodeHighOffset),
      let flags = field(UInt16.self, in: page, at: offset + nodeFlagsOffset),
      let keySize = field(UInt16.self, in: page, at: offset + nodeKeySizeOffset)
    else { return nil }
    return NodeHeader(low: low, high: high, flags: flags, keySize: Int(keySize))
  }

  /// The fields of a meta page that Ferry reads.
  package struct MetaFields: Sendable, Equatable {
    package var pageFlags: UInt16
    package var magic: UInt32
    package var version: UInt32
    package var pageSize: UInt32
    package var mapSize: UInt64
    package var lastPage: UInt64
    package var transaction: UInt64
    package var freeRoot: UInt64
    package var mainRoot: UInt64
    package var freeFlags: UInt16
    package var mainFlags: UInt16
  }

  /// The meta page fields in `bytes` (a meta page from its first byte); nil when shorter than
  /// ``metaSize``. Nothing is checked: the caller judges the magic, version and sizes.
  package static func metaFields(_ bytes: UnsafeRawBufferPointer) -> MetaFields? {
    guard bytes.count >= metaSize else { return nil }
    func u16(_ at: Int) -> UInt16 { field(UInt16.self, in: bytes, at: at) ?? 0 }
    func u32(_ at: Int) -> UInt32 { field(UInt32.self, in: bytes, at: at) ?? 0 }
    func u64(_ at: Int) -> UInt64 { field(UInt64.self, in: bytes, at: at) ?? 0 }
    return MetaFields(
      pageFlags: u16(pageFlagsOffset), magic: u32(magicOffset), version: u32(versionOffset),
      pageSize: u32(pageSizeOffset), mapSize: u64(mapSizeOffset), lastPage: u64(lastPageOffset),
      transaction: u64(transactionOffset),
      freeRoot: u64(freeDatabaseOffset + databaseRootOffset),
      mainRoot: u64(mainDatabaseOffset + databaseRootOffset),
      freeFlags: u16(freeDatabaseOffset + databaseFlagsOffset),
      mainFlags: u16(mainDatabaseOffset + databaseFlagsOffset))
  }
}
