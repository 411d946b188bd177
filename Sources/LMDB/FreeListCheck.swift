#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// LMDB's free-page list read from the data file (mapped read-only by the check itself, not through
/// LMDB), and checked against the pages the live trees use, before LMDB is trusted with a write.
/// LMDB takes the next pages it writes from this list: a damaged entry naming a page still in use
/// would make the next commit overwrite acknowledged records, and LMDB has no checksum to notice.
/// Also tells whether the pages past the end of a file shorter than its meta page says are all
/// free (pages LMDB allocated and freed again in one transaction are never written, so a healthy
/// file can end before its last page).
///
/// The walk reads the free database's pages, every *branch* page of every database, and the
/// 16-byte header of every leaf page (its page number is what LMDB frees when it next copies the
/// page). Overflow pages (named only from leaf nodes) are not checked against the list.
///
/// Cost: the file is mapped once (no read call per page) and pages are tracked in bitmaps (one bit
/// a page of the file), so the check allocates a few arrays, not one object per page; its time
/// is that of touching every tree page once (page faults served from the page cache, 64 KiB at a
/// time on Linux).
struct FreeListCheck {
  /// What is wrong, when something is.
  var problem: String?

  /// Most pages the walk reads before it stops believing the file.
  static let pageLimit = 1 << 22

  /// One bit for each page of the file.
  private struct PageBits {
    var words: [UInt64]
    init(pages: UInt64) { words = [UInt64](repeating: 0, count: Int((pages + 63) / 64)) }
    /// Sets the bit of `page` (below the count given at init); false when it was set already.
    mutating func insert(_ page: UInt64) -> Bool {
      let index = Int(page >> 6)
      let bit = UInt64(1) << (page & 63)
      let old = words[index]
      words[index] = old | bit
      return old & bit == 0
    }
    func contains(_ page: UInt64) -> Bool { words[Int(page >> 6)] & (UInt64(1) << (page & 63)) != 0 }
  }

  /// `map` is the data file mapped read-only from byte 0, `fileSize` bytes long.
  init(map: UnsafeRawBufferPointer, pageSize: Int, meta: DataFileCheck.Meta, fileSize: Int) {
    let lastPage = meta.lastPage
    let pagesInFile = UInt64(fileSize / pageSize)
    var reads = 0
    /// Pages of the free database itself and of the live trees (branch, leaf; not overflow).
    var live = PageBits(pages: pagesInFile)
    /// Pages the free database lists: those inside the file, and those past its end.
    var free = PageBits(pages: pagesInFile)
    var freePastEnd: Set<UInt64> = []
    /// The page being looked at: a slice of `map`, `pageSize` bytes.
    var current = UnsafeRawBufferPointer(start: nil, count: 0)

    func readPage(_ page: UInt64) -> Bool {
      guard page < pagesInFile, reads < Self.pageLimit, let base = map.baseAddress else { return false }
      reads += 1
      current = UnsafeRawBufferPointer(start: base + Int(page) * pageSize, count: pageSize)
      return true
    }
    func u16(_ at: Int) -> UInt64 {
      guard at >= 0, at + 2 <= current.count else { return 0 }
      return UInt64(UInt16(littleEndian: current.loadUnaligned(fromByteOffset: at, as: UInt16.self)))
    }
    func u64(_ at: Int) -> UInt64 {
      guard at >= 0, at + 8 <= current.count else { return .max }
      return UInt64(littleEndian: current.loadUnaligned(fromByteOffset: at, as: UInt64.self))
    }
    /// The number of nodes of the page in `current` when its node offsets all lie in the page.
    func nodeCount() -> Int? {
      let lower = Int(u16(12))
      let upper = Int(u16(14))
      guard lower >= 16, lower <= upper, upper <= pageSize, (lower - 16) % 2 == 0 else { return nil }
      let count = (lower - 16) / 2
      for index in 0..<count {
        let offset = Int(u16(16 + 2 * index))
        guard offset >= upper, offset + 8 <= pageSize else { return nil }
      }
      return count
    }
    func node(_ index: Int) -> Int { Int(u16(16 + 2 * index)) }

    /// Walks a tree from `root`: its branch pages are read, their children recorded as live; a leaf
    /// is read only when `readLeaves` says so, and handed to `leaf`.
    func walk(_ root: UInt64, depth treeDepth: Int, readLeaves: Bool, leaf: (inout Bool) -> Void) -> String? {
      guard root != .max else { return nil }
      var stack = [(page: root, depth: 1)]
      while let (page, depth) = stack.popLast() {
        guard page >= 2, page <= lastPage else {
          return "a tree names page \(page), outside the pages in use"
        }
        guard depth <= 32 else { return "a tree is deeper than LMDB allows" }
        // A page past the end of the file is read by nobody here; LMDB would fault on it.
        guard page < pagesInFile else { return "page \(page) of a tree lies past the end of the file" }
        if !live.insert(page) { return "page \(page) is named twice in the trees" }
        // A sub-database's leaves (at its recorded depth) are named by their parents: only their
        // header is read — the page number in it is what LMDB frees when it next copies the page,
        // so a wrong one would hand a live page to the free list.
        let headerOnly = !readLeaves && depth >= treeDepth && depth > 1
        guard readPage(page) else { return "page \(page) of a tree lies past the end of the file" }
        guard u64(0) == page else { return "page \(page) says it is page \(u64(0))" }
        let flags = u16(10)
        // On disk a tree page's flags are exactly P_BRANCH or P_LEAF (no database here is
        // DUPSORT). Any other bit is damage, and some are fatal to a write: P_DIRTY (0x10) makes
        // mdb_page_touch take the mapped page for this transaction's own copy and write into the
        // read-only map (SIGSEGV); P_LOOSE and P_KEEP exist only in memory too.
        guard flags == 0x01 || flags == 0x02 else {
          return
            "page \(page) of a tree has page flags 0x\(String(flags, radix: 16)), which LMDB never writes"
            + (flags & 0x10 != 0 ? " (P_DIRTY: a write would modify it in the read-only map)" : "")
        }
        if headerOnly { continue }
        if flags & 0x01 != 0 {
          guard let count = nodeCount() else { return "branch page \(page) is malformed" }
          for index in 0..<count {
            let at = node(index)
            let child = u16(at) | u16(at + 2) << 16 | u16(at + 4) << 32
            stack.append((child, depth + 1))
          }
        } else if flags & 0x02 != 0 {
          if readLeaves {
            var failed = false
            leaf(&failed)
            if failed { return "leaf page \(page) is malformed" }
          }
        }
      }
      return nil
    }

    // The free database: leaves hold, per transaction, a list of page numbers (count first).
    let freeProblem = walk(meta.freeRoot, depth: 0, readLeaves: true) { failed in
      guard let count = nodeCount(), let base = map.baseAddress else {
        failed = true
        return
      }
      for index in 0..<count {
        let at = node(index)
        let size = Int(u16(at) | u16(at + 2) << 16)
        let nodeFlags = u16(at + 4)
        let keySize = Int(u16(at + 6))
        let data = at + 8 + keySize
        let list: UnsafeRawBufferPointer
        if nodeFlags & 0x01 != 0 {  // the list is in overflow pages
          let first = u64(data)
          let pages = (size + 16 + pageSize - 1) / pageSize
          guard first >= 2, first <= lastPage, first + UInt64(pages) <= pagesInFile, size <= 1 << 28 else {
            failed = true
            return
          }
          list = UnsafeRawBufferPointer(start: base + Int(first) * pageSize + 16, count: size)
          for page in first..<(first + UInt64(pages)) { _ = live.insert(page) }
        } else {
          guard data + size <= pageSize else {
            failed = true
            return
          }
          list = UnsafeRawBufferPointer(rebasing: current[data..<(data + size)])
        }
        func entry(_ index: Int) -> UInt64 {
          let at = 8 * index
          guard at + 8 <= list.count else { return .max }
          return UInt64(littleEndian: list.loadUnaligned(fromByteOffset: at, as: UInt64.self))
        }
        let count = entry(0)
        guard size >= 8, count <= UInt64((size - 8) / 8) else {
          failed = true
          return
        }
        for index in 0..<Int(count) {
          let page = entry(index + 1)
          guard page >= 2, page <= lastPage else {
            failed = true
            return
          }
          let inserted = page < pagesInFile ? free.insert(page) : freePastEnd.insert(page).inserted
          guard inserted else {
            failed = true
            return
          }
        }
      }
    }
    if let freeProblem {
      problem = "LMDB's free-page list is damaged: " + freeProblem
      return
    }

    // The live trees: the main database names every other database (F_SUBDATA nodes).
    var roots: [(page: UInt64, depth: Int)] = []
    if let mainProblem = walk(
      meta.mainRoot, depth: 0, readLeaves: true,
      leaf: { failed in
        guard let count = nodeCount() else {
          failed = true
          return
        }
        for index in 0..<count {
          let at = node(index)
          guard u16(at + 4) & 0x02 != 0 else { continue }
          let data = at + 8 + Int(u16(at + 6))
          // A named database's md_flags: this wrapper opens every one with none (no DUPSORT).
          guard u16(data + 4) == 0 else {
            failed = true
            return
          }
          roots.append((u64(data + 40), Int(u16(data + 6))))
        }
      })
    {
      problem = "LMDB's main database is damaged: " + mainProblem
      return
    }
    for (root, depth) in roots {
      if let treeProblem = walk(root, depth: depth, readLeaves: false, leaf: { _ in }) {
        problem = "a database's tree is damaged: " + treeProblem
        return
      }
    }
    // Live pages all lie in the file (the walk refuses others), so only free pages there can clash.
    for index in 0..<live.words.count where live.words[index] & free.words[index] != 0 {
      let page = UInt64(index) * 64 + UInt64((live.words[index] & free.words[index]).trailingZeroBitCount)
      problem =
        "LMDB's free-page list names page \(page), which a tree still uses: the next write would overwrite it"
      return
    }
    // Pages past the end of the file are fine only when free (allocated and freed again in one
    // transaction, never written); anything else was cut off. The free pages there are distinct
    // and at most `lastPage`, so all of them are free exactly when there are enough of them.
    if pagesInFile <= lastPage, UInt64(freePastEnd.count) != lastPage - pagesInFile + 1 {
      var missing = pagesInFile
      while freePastEnd.contains(missing) { missing += 1 }
      problem =
        "its data file is \(fileSize) bytes but page \(missing) (of the \(lastPage + 1) its newest meta page uses) lies past its end and is not free: the file was truncated"
    }
  }
}
