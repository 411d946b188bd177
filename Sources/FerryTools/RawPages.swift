import FerryLog
import Foundation
import LMDB

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Bounds-checked little- and big-endian reads from bytes that came from disk: nil past the end.
/// LMDB's own fields are little-endian (``PageLayout``); Ferry's keys are big-endian.
extension Array where Element == UInt8 {
  func littleEndian<T: FixedWidthInteger & UnsignedInteger>(_ type: T.Type, at offset: Int) -> T? {
    withUnsafeBytes { PageLayout.field(type, in: $0, at: offset) }
  }

  func bigEndian<T: FixedWidthInteger & UnsignedInteger>(_ type: T.Type, at offset: Int) -> T? {
    let size = MemoryLayout<T>.size
    guard offset >= 0, offset <= count - size else { return nil }
    var value: T = 0
    for index in 0..<size { value = value << 8 | T(self[offset + index]) }
    return value
  }
}

/// An LMDB data file read with plain `pread`s (never mapped), so that no damage can crash the
/// reader: every offset and length read from the file is checked against the file's size first.
package final class RawDataFile {
  /// The file's path.
  package let path: String
  /// Its size in bytes when opened.
  package let size: Int
  private let descriptor: Int32

  /// Opens `path` for reading. Throws ``ExitStatus/noSuchStore`` when it does not exist and
  /// ``ExitStatus/notAStore`` when it is not a regular file.
  package init(path: String) throws(ToolError) {
    let descriptor = open(path, O_RDONLY | O_CLOEXEC)
    guard descriptor >= 0 else {
      let code = errno
      let reason = String(cString: strerror(code))
      switch code {
      case ENOENT: throw ToolError(.notAStore, "\(path) does not exist")
      case EACCES, EPERM: throw ToolError(.unavailable, "cannot read \(path): \(reason)")
      default: throw ToolError(.storageError, "cannot open \(path): \(reason)")
      }
    }
    var info = stat()
    guard fstat(descriptor, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else {
      close(descriptor)
      throw ToolError(.notAStore, "\(path) is not a regular file")
    }
    self.path = path
    self.descriptor = descriptor
    self.size = Int(info.st_size)
  }

  deinit { close(descriptor) }

  /// Up to `count` bytes at `offset`: fewer where the file ends (or a read fails), none outside it.
  package func read(at offset: Int, count: Int) -> [UInt8] {
    guard offset >= 0, count > 0, offset < size else { return [] }
    let wanted = Swift.min(count, size - offset)
    var buffer = [UInt8](repeating: 0, count: wanted)
    var done = 0
    while done < wanted {
      let got = buffer.withUnsafeMutableBytes { raw -> Int in
        guard let base = raw.baseAddress else { return -1 }
        return pread(descriptor, base + done, wanted - done, off_t(offset + done))
      }
      if got < 0 && errno == EINTR { continue }
      if got <= 0 { break }
      done += got
    }
    if done < wanted { buffer.removeLast(wanted - done) }
    return buffer
  }

  /// How many pages of `pageSize` bytes the file holds, counting a last partial one.
  package func pageCount(pageSize: Int) -> Int {
    guard pageSize > 0 else { return 0 }
    return size / pageSize + (size % pageSize == 0 ? 0 : 1)
  }

  /// Page `number` (all of it, or what the file holds of it); nil outside the file.
  package func page(_ number: UInt64, pageSize: Int) -> RawPage? {
    guard pageSize > 0, number < UInt64(pageCount(pageSize: pageSize)) else { return nil }
    let bytes = read(at: Int(number) * pageSize, count: pageSize)
    return bytes.isEmpty ? nil : RawPage(number: number, bytes: bytes)
  }

  // MARK: Meta pages

  /// One of LMDB's two meta pages, as far as it could be read.
  package struct MetaPage: Sendable, Equatable {
    /// Which slot (0 or 1).
    package let slot: Int
    /// The page size it names.
    package let pageSize: Int
    /// The root page of the main database (the named databases' records).
    package let mainRoot: UInt64
    /// The last page in use.
    package let lastPage: UInt64
    /// The transaction that wrote it.
    package let transaction: UInt64
  }

  /// The meta page in `slot` (0 or 1) when the file holds one there with LMDB's magic and a page size
  /// that places it there (slot 1 sits one page in).
  package func metaPage(_ slot: Int, pageSize: Int) -> MetaPage? {
    guard slot == 0 || slot == 1, PageLayout.isPlausiblePageSize(pageSize) else { return nil }
    let bytes = read(at: slot * pageSize, count: PageLayout.metaSize)
    guard let meta = bytes.withUnsafeBytes({ PageLayout.metaFields($0) }),
      meta.pageFlags & PageLayout.meta != 0, meta.magic == PageLayout.magic, Int(meta.pageSize) == pageSize
    else { return nil }
    return MetaPage(
      slot: slot, pageSize: pageSize, mainRoot: meta.mainRoot, lastPage: meta.lastPage,
      transaction: meta.transaction)
  }

  /// The page size meta page 0 names, when it is a meta page naming a size LMDB can have.
  package func pageSizeNamedByMetaPage0() -> Int? {
    let head = read(at: 0, count: PageLayout.pageSizeOffset + 4)
    guard let named = head.littleEndian(UInt32.self, at: PageLayout.pageSizeOffset),
      PageLayout.isPlausiblePageSize(Int(named)), metaPage(0, pageSize: Int(named)) != nil
    else { return nil }
    return Int(named)
  }

  /// The page size at which meta page 1 is found (one page in, naming that size), if any.
  package func pageSizeNamedByMetaPage1() -> Int? {
    (PageLayout.commonPageSizes + [8192, 32768, 2048, 1024, 512]).first { metaPage(1, pageSize: $0) != nil }
  }

  /// The pages of the named database's live tree, found from the newer readable meta page by
  /// following the main database to the database's record and walking its branch pages: its root,
  /// its branch pages and its leaf pages (in key order). Nil when any step cannot be read.
  package func liveTree(
    named name: String, pageSize: Int
  ) -> (root: UInt64, branches: [UInt64], leaves: [UInt64])? {
    let metas = [metaPage(0, pageSize: pageSize), metaPage(1, pageSize: pageSize)].compactMap { $0 }
    guard let meta = metas.max(by: { $0.transaction < $1.transaction }) else { return nil }
    guard let main = walk(from: meta.mainRoot, pageSize: pageSize) else { return nil }
    let wanted = Array(name.utf8)
    for leaf in main.leaves {
      guard let page = page(leaf, pageSize: pageSize) else { continue }
      for node in page.leafNodes() where node.key == wanted && node.flags & PageLayout.subData != 0 {
        guard let range = node.inlineData, range.count == PageLayout.databaseRecordSize,
          let root = Array(page.bytes[range]).littleEndian(UInt64.self, at: PageLayout.databaseRootOffset),
          let tree = walk(from: root, pageSize: pageSize)
        else { return nil }
        return (root, tree.branches, tree.leaves)
      }
    }
    return nil
  }

  /// The branch and leaf pages under `root`, depth first in key order; nil when a page is missing
  /// or neither a branch nor a leaf. Bounded: a damaged tree that loops is cut off.
  private func walk(from root: UInt64, pageSize: Int) -> (branches: [UInt64], leaves: [UInt64])? {
    var branches: [UInt64] = []
    var leaves: [UInt64] = []
    var seen = Set<UInt64>()
    func visit(_ number: UInt64, depth: Int) -> Bool {
      guard depth < 64, seen.insert(number).inserted, let page = page(number, pageSize: pageSize) else {
        return false
      }
      if page.isLeaf {
        leaves.append(number)
        return true
      }
      guard page.isBranch else { return false }
      branches.append(number)
      for child in page.branchChildren() where !visit(child.page, depth: depth + 1) { return false }
      return true
    }
    return visit(root, depth: 0) ? (branches, leaves) : nil
  }
}

/// One page of a data file, as read (shorter than the page size where the file ends inside it).
package struct RawPage: Sendable {
  /// The page's number: its position in the file.
  package let number: UInt64
  /// Its bytes.
  package let bytes: [UInt8]

  /// The page number its header names (equal to ``number`` in an intact page).
  package var headerNumber: UInt64? { bytes.littleEndian(UInt64.self, at: PageLayout.pageNumberOffset) }
  /// Its flags.
  package var flags: UInt16 { bytes.littleEndian(UInt16.self, at: PageLayout.pageFlagsOffset) ?? 0 }
  /// A leaf page of an ordinary database (not a `LEAF2` or sub-page).
  package var isLeaf: Bool { flags & PageLayout.kindFlags == PageLayout.leaf }
  /// A branch page.
  package var isBranch: Bool { flags & PageLayout.kindFlags == PageLayout.branch }

  /// The header of the node at `offset`, when it lies inside the page.
  private func nodeHeader(at offset: Int) -> PageLayout.NodeHeader? {
    bytes.withUnsafeBytes { PageLayout.nodeHeader(in: $0, at: offset) }
  }

  /// The node offsets of the pointer array, each inside the page.
  private func nodeOffsets() -> [Int] {
    guard let lower = bytes.littleEndian(UInt16.self, at: PageLayout.lowerOffset) else { return [] }
    let end = Swift.min(Int(lower), bytes.count)
    guard end > PageLayout.pageHeaderSize else { return [] }
    let pointers = stride(from: PageLayout.pageHeaderSize, to: end - 1, by: PageLayout.nodePointerSize)
    return pointers.compactMap { at in
      guard let offset = bytes.littleEndian(UInt16.self, at: at).map(Int.init),
        offset >= PageLayout.pageHeaderSize, offset + PageLayout.nodeHeaderSize <= bytes.count
      else { return nil }
      return offset
    }
  }

  /// One node of a leaf page.
  package struct LeafNode: Sendable {
    /// Where the node starts in the page.
    package let offset: Int
    /// The key.
    package let key: [UInt8]
    /// The node's flags (`F_BIGDATA` 0x01, `F_SUBDATA` 0x02, `F_DUPDATA` 0x04).
    package let flags: UInt16
    /// The data's size.
    package let dataSize: Int
    /// Where the data lies in the page, when it is there (not on overflow pages).
    package let inlineData: Range<Int>?
    /// The first overflow page holding the data (`F_BIGDATA`); it starts 16 bytes into that page.
    package let overflowPage: UInt64?
  }

  /// The nodes of a leaf page whose key (and inline data, or overflow page number) lie inside the
  /// page; the others are left out.
  package func leafNodes() -> [LeafNode] {
    guard isLeaf else { return [] }
    return nodeOffsets().compactMap { offset in
      guard let header = nodeHeader(at: offset) else { return nil }
      let flags = header.flags
      let keyStart = offset + PageLayout.nodeHeaderSize
      let dataStart = keyStart + header.keySize
      guard dataStart <= bytes.count else { return nil }
      let dataSize = header.dataSize
      let key = Array(bytes[keyStart..<dataStart])
      if flags & PageLayout.bigData != 0 {
        guard let page = bytes.littleEndian(UInt64.self, at: dataStart) else { return nil }
        return LeafNode(
          offset: offset, key: key, flags: flags, dataSize: dataSize, inlineData: nil, overflowPage: page)
      }
      guard dataSize <= bytes.count - dataStart else { return nil }
      return LeafNode(
        offset: offset, key: key, flags: flags, dataSize: dataSize,
        inlineData: dataStart..<(dataStart + dataSize),
        overflowPage: nil)
    }
  }

  /// The children of a branch page (each node's key, empty for the first, and child page number).
  package func branchChildren() -> [(key: [UInt8], page: UInt64)] {
    guard isBranch else { return [] }
    return nodeOffsets().compactMap { offset in
      guard let header = nodeHeader(at: offset) else { return nil }
      let keyStart = offset + PageLayout.nodeHeaderSize
      guard header.keySize <= bytes.count - keyStart else { return nil }
      return (Array(bytes[keyStart..<(keyStart + header.keySize)]), header.childPage)
    }
  }
}

/// What a scan of every page of a data file found: the valid event records (leaf nodes under an
/// 8-byte key whose data decodes as a record of that sequence, CRC included), and the `meta` rows
/// that tell how far the log went.
package struct RawScan: Sendable {
  /// The page size scanned with.
  package let pageSize: Int
  /// Pages read.
  package internal(set) var pagesScanned = 0
  /// Leaf pages among them.
  package internal(set) var leafPages = 0
  /// Valid record copies found (the same record may sit in several pages: old copies in freed pages).
  package internal(set) var recordCopies = 0
  /// Of them, copies no node points to: stale bytes in a page's free space (a node moved away by a
  /// split or a delete) or in a page whose header is damaged.
  package internal(set) var unreferencedCopies = 0
  /// Per sequence, the distinct valid records found: those a leaf node points to first, then those
  /// found only in unreferenced bytes; each in the order found.
  package internal(set) var records: [UInt64: [LoggedEvent]] = [:]
  /// Per sequence, how many of its records (at the end of its list) were found only unreferenced.
  private var unreferencedVariants: [UInt64: Int] = [:]
  /// Per leaf page holding valid records, their sequences (only when the scan was asked to keep them).
  package internal(set) var recordPages: [UInt64: [UInt64]] = [:]
  /// Every `compaction` row seen (`through`, `removed`), from live and freed pages alike.
  package internal(set) var compactionRows: Set<CompactionRow> = []
  /// Every position of a `projection:<name>` row seen: the log's head at some commit.
  package internal(set) var projectionPositions: Set<UInt64> = []

  /// A `meta` row `compaction`.
  package struct CompactionRow: Hashable, Sendable {
    /// Compacted through this sequence.
    package let through: UInt64
    /// Events removed by all compactions.
    package let removed: UInt64
  }

  /// The shortest record of any format: format 1's 37 bytes (a 1-byte type, an empty payload), or
  /// less should a later format be shorter.
  static let smallestRecord = min(37, EventRecord.overhead + 1)

  /// An empty scan.
  init(pageSize: Int) { self.pageSize = pageSize }

  /// Distinct sequences with at least one valid record.
  package var sequencesFound: Int { records.count }

  /// Takes one valid record copy.
  mutating func add(_ event: LoggedEvent, referenced: Bool) {
    recordCopies += 1
    if !referenced { unreferencedCopies += 1 }
    let sequence = event.sequence
    var known = records[sequence] ?? []
    let tail = unreferencedVariants[sequence] ?? 0
    let firstUnreferenced = known.count - tail
    if let index = known.firstIndex(of: event) {
      // A record first seen unreferenced, now found in a node: it goes before the unreferenced ones.
      if referenced && index >= firstUnreferenced {
        known.remove(at: index)
        known.insert(event, at: firstUnreferenced)
        unreferencedVariants[sequence] = tail - 1
        records[sequence] = known
      }
      return
    }
    if referenced {
      known.insert(event, at: firstUnreferenced)
    } else {
      known.append(event)
      unreferencedVariants[sequence] = tail + 1
    }
    records[sequence] = known
  }
}

extension RawDataFile {
  /// Reads every page with `pageSize` and collects what ``RawScan`` describes. `keepPages` also
  /// keeps which leaf page held which sequences.
  package func scan(
    pageSize: Int, keepPages: Bool = false, progress: (_ done: Int, _ total: Int) -> Void = { _, _ in }
  ) -> RawScan {
    var result = RawScan(pageSize: pageSize)
    guard PageLayout.isPlausiblePageSize(pageSize) else { return result }
    let total = pageCount(pageSize: pageSize)
    let compactionKey = Array("compaction".utf8)
    let projectionPrefix = Array("projection:".utf8)
    for number in 0..<total {
      if number % 4096 == 0 { progress(number, total) }
      guard let page = page(UInt64(number), pageSize: pageSize) else { break }
      result.pagesScanned += 1
      var referenced = Set<Int>()
      defer { carveRecords(from: page, skipping: referenced, into: &result) }
      guard page.isLeaf else { continue }
      result.leafPages += 1
      var sequencesHere: [UInt64] = []
      for node in page.leafNodes() where node.flags & (PageLayout.subData | PageLayout.dupData) == 0 {
        if node.key.count == 8 {
          guard let sequence = node.key.bigEndian(UInt64.self, at: 0), sequence > 0,
            node.dataSize >= RawScan.smallestRecord,
            let event = decodeRecord(node, in: page, sequence: sequence, pageSize: pageSize)
          else { continue }
          referenced.insert(node.offset)
          sequencesHere.append(sequence)
          result.add(event, referenced: true)
        } else if node.key == compactionKey, let range = node.inlineData, range.count == 16 {
          let value = Array(page.bytes[range])
          if let through = value.bigEndian(UInt64.self, at: 0),
            let removed = value.bigEndian(UInt64.self, at: 8)
          {
            result.compactionRows.insert(RawScan.CompactionRow(through: through, removed: removed))
          }
        } else if node.key.starts(with: projectionPrefix), let range = node.inlineData, range.count == 12,
          let position = Array(page.bytes[range]).bigEndian(UInt64.self, at: 4)
        {
          result.projectionPositions.insert(position)
        }
      }
      if keepPages && !sequencesHere.isEmpty { result.recordPages[page.number] = sequencesHere }
    }
    progress(total, total)
    return result
  }

  /// Finds valid records in the bytes of `page` that no node points to: at every even offset (where
  /// LMDB puts nodes) but those in `skipping`, a leaf node's header with an 8-byte key, no flags, and
  /// inline data that decodes as the record of that key. Old copies live there: the free space of a
  /// leaf keeps the bytes of nodes a split moved away, and a page with a damaged header keeps its nodes.
  private func carveRecords(from page: RawPage, skipping: Set<Int>, into result: inout RawScan) {
    if page.number < 2 && page.flags & PageLayout.meta != 0 { return }
    let bytes = page.bytes
    let minimum = RawScan.smallestRecord
    let keySize = PageLayout.nodeKeySizeOffset
    let flags = PageLayout.nodeFlagsOffset
    var offset = PageLayout.pageHeaderSize
    while offset + PageLayout.nodeHeaderSize + 8 + minimum <= bytes.count {
      defer { offset += PageLayout.nodePointerSize }
      // mn_ksize == 8 and mn_flags == 0, then a record's first byte (its format version).
      guard bytes[offset + keySize] == 8, bytes[offset + keySize + 1] == 0, bytes[offset + flags] == 0,
        bytes[offset + flags + 1] == 0,
        (1...EventRecord.formatVersion).contains(bytes[offset + PageLayout.nodeHeaderSize + 8]),
        !skipping.contains(offset),
        let low = bytes.littleEndian(UInt16.self, at: offset),
        let high = bytes.littleEndian(UInt16.self, at: offset + 2)
      else { continue }
      let size = Int(low) | Int(high) << 16
      let start = offset + PageLayout.nodeHeaderSize + 8
      guard size >= minimum, size <= bytes.count - start,
        let sequence = bytes.bigEndian(UInt64.self, at: offset + PageLayout.nodeHeaderSize), sequence > 0
      else { continue }
      let event = bytes.withUnsafeBytes { buffer in
        try? EventRecord.decode(
          UnsafeRawBufferPointer(rebasing: buffer[start..<(start + size)]), sequence: sequence)
      }
      if let event { result.add(event, referenced: false) }
    }
  }

  /// The record a leaf node holds (inline, or on its overflow pages), when it decodes as the record
  /// of `sequence`.
  private func decodeRecord(
    _ node: RawPage.LeafNode, in page: RawPage, sequence: UInt64, pageSize: Int
  )
    -> LoggedEvent?
  {
    if let range = node.inlineData {
      return page.bytes.withUnsafeBytes { buffer in
        try? EventRecord.decode(UnsafeRawBufferPointer(rebasing: buffer[range]), sequence: sequence)
      }
    }
    guard let overflow = node.overflowPage, overflow < UInt64(pageCount(pageSize: pageSize)),
      node.dataSize <= size
    else { return nil }
    let start = Int(overflow) * pageSize
    let header = read(at: start, count: PageLayout.pageHeaderSize)
    guard let flags = header.littleEndian(UInt16.self, at: PageLayout.pageFlagsOffset),
      flags & PageLayout.overflow != 0
    else {
      return nil
    }
    let data = read(at: start + PageLayout.pageHeaderSize, count: node.dataSize)
    guard data.count == node.dataSize else { return nil }
    return try? EventRecord.decode(data, sequence: sequence)
  }
}
