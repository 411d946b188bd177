#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// LMDB's free-page list read with plain `pread`s, and checked against the pages the live trees
/// use, before LMDB is trusted with a write. LMDB takes the next pages it writes from this list:
/// a damaged entry naming a page still in use would make the next commit overwrite acknowledged
/// records, and LMDB has no checksum to notice. Also tells whether the pages past the end of a
/// file shorter than its meta page says are all free (pages LMDB allocated and freed again in one
/// transaction are never written, so a healthy file can end before its last page).
///
/// The walk reads the free database's pages and every *branch* page of every database (a tree's
/// leaves are named by its branch pages, so leaves need not be read): about one page in a hundred.
/// Overflow pages (named only from leaf nodes) are not checked against the list.
struct FreeListCheck {
  /// Pages the free database lists.
  var free: Set<UInt64> = []
  /// Pages of the free database itself and of the live trees (branch, leaf; not overflow).
  var live: Set<UInt64> = []
  /// What is wrong, when something is.
  var problem: String?

  /// Most pages the walk reads before it stops believing the file.
  static let pageLimit = 1 << 22

  init(fd: Int32, pageSize: Int, meta: DataFileCheck.Meta, fileSize: Int) {
    let lastPage = meta.lastPage
    let pagesInFile = UInt64(fileSize / pageSize)
    var buffer = [UInt8](repeating: 0, count: pageSize)
    var reads = 0

    func readPage(_ page: UInt64) -> Bool {
      guard page < pagesInFile, reads < Self.pageLimit else { return false }
      reads += 1
      let got = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, pageSize, off_t(page) * off_t(pageSize)) }
      return got == pageSize
    }
    func u16(_ at: Int) -> UInt64 {
      at + 2 <= buffer.count ? UInt64(buffer[at]) | UInt64(buffer[at + 1]) << 8 : 0
    }
    func u64(_ at: Int) -> UInt64 {
      guard at >= 0, at + 8 <= buffer.count else { return .max }
      var value: UInt64 = 0
      for index in (0..<8).reversed() { value = value << 8 | UInt64(buffer[at + index]) }
      return value
    }
    /// The node offsets of the page in `buffer`, each checked to lie in the page.
    func nodes() -> [Int]? {
      let lower = Int(u16(12))
      let upper = Int(u16(14))
      guard lower >= 16, lower <= upper, upper <= pageSize, (lower - 16) % 2 == 0 else { return nil }
      var offsets: [Int] = []
      for index in 0..<((lower - 16) / 2) {
        let offset = Int(u16(16 + 2 * index))
        guard offset >= upper, offset + 8 <= pageSize else { return nil }
        offsets.append(offset)
      }
      return offsets
    }

    /// Walks a tree from `root`: its branch pages are read, their children recorded as live; a leaf
    /// is read only when `readLeaves` says so, and handed to `leaf`.
    func walk(_ root: UInt64, depth treeDepth: Int, readLeaves: Bool, leaf: (inout Bool) -> Void) -> String? {
      guard root != .max else { return nil }
      var stack = [(page: root, depth: 1)]
      while let (page, depth) = stack.popLast() {
        guard page >= 2, page <= lastPage else { return "a tree names page \(page), outside the pages in use" }
        guard depth <= 32 else { return "a tree is deeper than LMDB allows" }
        let known = !live.insert(page).inserted
        if known { return "page \(page) is named twice in the trees" }
        // A sub-database's leaves (at its recorded depth) are named by their parents: only their
        // header is read — the page number in it is what LMDB frees when it next copies the page,
        // so a wrong one would hand a live page to the free list.
        if !readLeaves && depth >= treeDepth && depth > 1 {
          guard page < pagesInFile, reads < Self.pageLimit else { return "page \(page) of a tree lies past the end of the file" }
          reads += 1
          var header = [UInt8](repeating: 0, count: 16)
          let got = header.withUnsafeMutableBytes { pread(fd, $0.baseAddress, 16, off_t(page) * off_t(pageSize)) }
          guard got == 16 else { return "page \(page) cannot be read" }
          var number: UInt64 = 0
          for index in (0..<8).reversed() { number = number << 8 | UInt64(header[index]) }
          let flags = UInt64(header[10]) | UInt64(header[11]) << 8
          guard number == page else { return "page \(page) says it is page \(number)" }
          guard flags & 0x03 != 0 else { return "page \(page) of a tree is neither a branch nor a leaf page (flags \(flags))" }
          continue
        }
        // A page past the end of the file is read by nobody here; LMDB would fault on it.
        guard readPage(page) else { return "page \(page) of a tree lies past the end of the file" }
        guard u64(0) == page else { return "page \(page) says it is page \(u64(0))" }
        let flags = u16(10)
        if flags & 0x01 != 0 {
          guard let offsets = nodes() else { return "branch page \(page) is malformed" }
          for node in offsets {
            let child = u16(node) | u16(node + 2) << 16 | u16(node + 4) << 32
            stack.append((child, depth + 1))
          }
        } else if flags & 0x02 != 0 {
          if readLeaves {
            var failed = false
            leaf(&failed)
            if failed { return "leaf page \(page) is malformed" }
          }
        } else {
          return "page \(page) of a tree is neither a branch nor a leaf page (flags \(flags))"
        }
      }
      return nil
    }

    // The free database: leaves hold, per transaction, a list of page numbers (count first).
    var freeProblem: String?
    var free: Set<UInt64> = []
    freeProblem = walk(meta.freeRoot, depth: 0, readLeaves: true) { failed in
      guard let offsets = nodes() else {
        failed = true
        return
      }
      for node in offsets {
        let size = Int(u16(node) | u16(node + 2) << 16)
        let nodeFlags = u16(node + 4)
        let keySize = Int(u16(node + 6))
        var data = node + 8 + keySize
        var bytes = buffer
        if nodeFlags & 0x01 != 0 {  // the list is in overflow pages
          let first = u64(data)
          let pages = (size + 16 + pageSize - 1) / pageSize
          guard first >= 2, first <= lastPage, first + UInt64(pages) <= pagesInFile, size <= 1 << 28 else {
            failed = true
            return
          }
          bytes = [UInt8](repeating: 0, count: size)
          let got = bytes.withUnsafeMutableBytes {
            pread(fd, $0.baseAddress, size, off_t(first) * off_t(pageSize) + 16)
          }
          guard got == size else {
            failed = true
            return
          }
          for page in first..<(first + UInt64(pages)) { live.insert(page) }
          data = 0
        } else if data + size > pageSize {
          failed = true
          return
        }
        func entry(_ index: Int) -> UInt64 {
          let at = data + 8 * index
          guard at + 8 <= bytes.count else { return .max }
          var value: UInt64 = 0
          for byte in (0..<8).reversed() { value = value << 8 | UInt64(bytes[at + byte]) }
          return value
        }
        let count = entry(0)
        guard size >= 8, count <= UInt64((size - 8) / 8) else {
          failed = true
          return
        }
        for index in 0..<Int(count) {
          let page = entry(index + 1)
          guard page >= 2, page <= lastPage, free.insert(page).inserted else {
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
    self.free = free

    // The live trees: the main database names every other database (F_SUBDATA nodes).
    var roots: [(page: UInt64, depth: Int)] = []
    if let mainProblem = walk(meta.mainRoot, depth: 0, readLeaves: true, leaf: { failed in
      guard let offsets = nodes() else {
        failed = true
        return
      }
      for node in offsets where u16(node + 4) & 0x02 != 0 {
        let data = node + 8 + Int(u16(node + 6))
        roots.append((u64(data + 40), Int(u16(data + 6))))
      }
    }) {
      problem = "LMDB's main database is damaged: " + mainProblem
      return
    }
    for (root, depth) in roots {
      if let treeProblem = walk(root, depth: depth, readLeaves: false, leaf: { _ in }) {
        problem = "a database's tree is damaged: " + treeProblem
        return
      }
    }
    if let page = free.intersection(live).min() {
      problem = "LMDB's free-page list names page \(page), which a tree still uses: the next write would overwrite it"
      return
    }
    // Pages past the end of the file are fine only when free (allocated and freed again in one
    // transaction, never written); anything else was cut off.
    if pagesInFile <= lastPage, let missing = (pagesInFile...lastPage).first(where: { !free.contains($0) }) {
      problem =
        "its data file is \(fileSize) bytes but page \(missing) (of the \(lastPage + 1) its newest meta page uses) lies past its end and is not free: the file was truncated"
    }
  }
}
