import Dispatch
import Synchronization

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
/// time on Linux). The named databases' trees, most of those pages, are walked on two to four
/// threads when they are large: an open waits for the check, and it is most of an open's time.
struct FreeListCheck {
  /// What is wrong, when something is.
  var problem: String?

  /// Named databases of fewer pages than this (as their records count them) are walked on the
  /// calling thread alone: a second thread costs more than it saves.
  static let parallelWalkPages: UInt64 = 4096

  /// One bit for each page of the file.
  struct PageBits {
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
    /// The first page set in both, if any.
    func firstShared(with other: PageBits) -> UInt64? {
      for index in 0..<min(words.count, other.words.count) where words[index] & other.words[index] != 0 {
        return UInt64(index) * 64 + UInt64((words[index] & other.words[index]).trailingZeroBitCount)
      }
      return nil
    }
    mutating func formUnion(_ other: PageBits) {
      for index in 0..<min(words.count, other.words.count) { words[index] |= other.words[index] }
    }
  }

  /// Walks trees of the mapped file: the pages it met as tree pages (branch, leaf, the free
  /// database's overflow pages), and the page it is reading.
  struct Walker {
    let map: UnsafeRawBufferPointer
    let pageSize: Int
    let lastPage: UInt64
    let pagesInFile: UInt64
    var live: PageBits
    /// The page being looked at: a slice of `map`, `pageSize` bytes.
    var current = UnsafeRawBufferPointer(start: nil, count: 0)

    init(map: UnsafeRawBufferPointer, pageSize: Int, lastPage: UInt64, pagesInFile: UInt64) {
      self.map = map
      self.pageSize = pageSize
      self.lastPage = lastPage
      self.pagesInFile = pagesInFile
      live = PageBits(pages: pagesInFile)
    }

    /// No count of reads bounds a walk: a page is read only once it is marked live, and a page met
    /// again ends the walk, so one walker reads each page of the file once at most.
    mutating func readPage(_ page: UInt64) -> Bool {
      guard page < pagesInFile, let base = map.baseAddress else { return false }
      current = UnsafeRawBufferPointer(start: base + Int(page) * pageSize, count: pageSize)
      return true
    }
    func u16(_ at: Int) -> UInt64 {
      PageLayout.field(UInt16.self, in: current, at: at).map(UInt64.init) ?? 0
    }
    func u64(_ at: Int) -> UInt64 { PageLayout.field(UInt64.self, in: current, at: at) ?? .max }
    /// The number of nodes of the page in `current` when its node offsets all lie in the page.
    func nodeCount() -> Int? {
      let lower = Int(u16(PageLayout.lowerOffset))
      let upper = Int(u16(PageLayout.upperOffset))
      let pointers = lower - PageLayout.pageHeaderSize
      guard pointers >= 0, lower <= upper, upper <= pageSize, pointers % PageLayout.nodePointerSize == 0
      else { return nil }
      let count = pointers / PageLayout.nodePointerSize
      for index in 0..<count {
        let offset = node(index)
        guard offset >= upper, offset + PageLayout.nodeHeaderSize <= pageSize else { return nil }
      }
      return count
    }
    func node(_ index: Int) -> Int {
      Int(u16(PageLayout.pageHeaderSize + PageLayout.nodePointerSize * index))
    }
    /// The child page a branch node at `at` names (the flags field holds its top bits).
    func child(_ at: Int) -> UInt64 {
      u16(at + PageLayout.nodeLowOffset) | u16(at + PageLayout.nodeHighOffset) << 16
        | u16(at + PageLayout.nodeFlagsOffset) << 32
    }
    /// A leaf node's data size.
    func dataSize(_ at: Int) -> Int {
      Int(u16(at + PageLayout.nodeLowOffset) | u16(at + PageLayout.nodeHighOffset) << 16)
    }
    /// Where a node's data begins (after its header and key).
    func dataStart(_ at: Int) -> Int {
      at + PageLayout.nodeHeaderSize + Int(u16(at + PageLayout.nodeKeySizeOffset))
    }

    /// Walks a tree from `root`: its branch pages are read, their children recorded as live; a leaf
    /// is read only when `readLeaves` says so, and handed to `leaf`.
    mutating func walk(
      _ root: UInt64, depth treeDepth: Int, readLeaves: Bool, leaf: (inout Walker, inout Bool) -> Void
    ) -> String? {
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
        let number = u64(PageLayout.pageNumberOffset)
        guard number == page else { return "page \(page) says it is page \(number)" }
        let flags = u16(PageLayout.pageFlagsOffset)
        // On disk a tree page's flags are exactly P_BRANCH or P_LEAF (no database here is
        // DUPSORT). Any other bit is damage, and some are fatal to a write: P_DIRTY (0x10) makes
        // mdb_page_touch take the mapped page for this transaction's own copy and write into the
        // read-only map (SIGSEGV); P_LOOSE and P_KEEP exist only in memory too.
        guard flags == UInt64(PageLayout.branch) || flags == UInt64(PageLayout.leaf) else {
          return
            "page \(page) of a tree has page flags 0x\(String(flags, radix: 16)), which LMDB never writes"
            + (flags & UInt64(PageLayout.dirty) != 0
              ? " (P_DIRTY: a write would modify it in the read-only map)" : "")
        }
        if headerOnly { continue }
        if flags & UInt64(PageLayout.branch) != 0 {
          guard let count = nodeCount() else { return "branch page \(page) is malformed" }
          for index in 0..<count { stack.append((child(node(index)), depth + 1)) }
        } else if flags & UInt64(PageLayout.leaf) != 0 {
          if readLeaves {
            var failed = false
            leaf(&self, &failed)
            if failed { return "leaf page \(page) is malformed" }
          }
        }
      }
      return nil
    }

    /// Walks named databases' trees one after the other, reading their leaves' headers only; the
    /// first problem found.
    mutating func walkHeaders(of roots: [(page: UInt64, depth: Int)]) -> String? {
      for root in roots {
        if let problem = walk(root.page, depth: root.depth, readLeaves: false, leaf: { _, _ in }) {
          return problem
        }
      }
      return nil
    }
  }

  /// `map` is the data file mapped read-only from byte 0, `fileSize` bytes long; the named
  /// databases' trees are walked on several threads when their records count `parallelAbove` pages.
  init(
    map: UnsafeRawBufferPointer, pageSize: Int, meta: DataFileCheck.Meta, fileSize: Int,
    parallelAbove: UInt64 = parallelWalkPages
  ) {
    let lastPage = meta.lastPage
    let pagesInFile = UInt64(fileSize / pageSize)
    /// The free database's pages and the main database's, then every tree's (branch, leaf).
    var walker = Walker(map: map, pageSize: pageSize, lastPage: lastPage, pagesInFile: pagesInFile)
    /// Pages the free database lists: those inside the file, and those past its end.
    var free = PageBits(pages: pagesInFile)
    var freePastEnd: Set<UInt64> = []

    // The free database: leaves hold, per transaction, a list of page numbers (count first).
    let freeProblem = walker.walk(meta.freeRoot, depth: 0, readLeaves: true) { w, failed in
      guard let count = w.nodeCount(), let base = map.baseAddress else {
        failed = true
        return
      }
      for index in 0..<count {
        let at = w.node(index)
        let size = w.dataSize(at)
        let nodeFlags = w.u16(at + PageLayout.nodeFlagsOffset)
        let data = w.dataStart(at)
        let list: UnsafeRawBufferPointer
        if nodeFlags & UInt64(PageLayout.bigData) != 0 {  // the list is in overflow pages
          let first = w.u64(data)
          let pages = PageLayout.overflowPages(dataSize: size, pageSize: pageSize)
          guard first >= 2, first <= lastPage, first + UInt64(pages) <= pagesInFile, size <= 1 << 28 else {
            failed = true
            return
          }
          list = UnsafeRawBufferPointer(
            start: base + Int(first) * pageSize + PageLayout.pageHeaderSize, count: size)
          for page in first..<(first + UInt64(pages)) { _ = w.live.insert(page) }
        } else {
          guard data + size <= pageSize else {
            failed = true
            return
          }
          list = UnsafeRawBufferPointer(rebasing: w.current[data..<(data + size)])
        }
        func entry(_ index: Int) -> UInt64 {
          PageLayout.field(UInt64.self, in: list, at: PageLayout.freeListWordSize * index) ?? .max
        }
        let count = entry(0)
        let word = PageLayout.freeListWordSize
        guard size >= word, count <= UInt64((size - word) / word) else {
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

    // The live trees: the main database names every other database (F_SUBDATA nodes), with the
    // pages its record counts (a weight for sharing the walk out, nothing more).
    var roots: [(page: UInt64, depth: Int, pages: UInt64)] = []
    if let mainProblem = walker.walk(
      meta.mainRoot, depth: 0, readLeaves: true,
      leaf: { w, failed in
        guard let count = w.nodeCount() else {
          failed = true
          return
        }
        for index in 0..<count {
          let at = w.node(index)
          guard w.u16(at + PageLayout.nodeFlagsOffset) & UInt64(PageLayout.subData) != 0 else { continue }
          let data = w.dataStart(at)
          // A named database's md_flags: this wrapper opens every one with none (no DUPSORT).
          guard w.u16(data + PageLayout.databaseFlagsOffset) == 0 else {
            failed = true
            return
          }
          let pages =
            min(w.u64(data + PageLayout.databaseBranchPagesOffset), pagesInFile)
            + min(w.u64(data + PageLayout.databaseLeafPagesOffset), pagesInFile)
          roots.append(
            (
              w.u64(data + PageLayout.databaseRootOffset), Int(w.u16(data + PageLayout.databaseDepthOffset)),
              pages
            ))
        }
      })
    {
      problem = "LMDB's main database is damaged: " + mainProblem
      return
    }
    if let treeProblem = Self.walkTrees(roots, with: &walker, parallelAbove: parallelAbove) {
      problem = "a database's tree is damaged: " + treeProblem
      return
    }
    let live = walker.live
    // Live pages all lie in the file (the walk refuses others), so only free pages there can clash.
    if let page = live.firstShared(with: free) {
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

  /// Walks the named databases' trees (branch pages and leaf headers) into `walker`'s live pages.
  /// Large ones are shared out between threads, each with a walker of its own: a page two trees
  /// name is found when their pages are put together. The problem returned is the one a walk on
  /// one thread finds.
  private static func walkTrees(
    _ roots: [(page: UInt64, depth: Int, pages: UInt64)], with walker: inout Walker, parallelAbove: UInt64
  ) -> String? {
    let inTurn = roots.map { (page: $0.page, depth: $0.depth) }
    let total = roots.reduce(UInt64(0)) { $0 &+ $1.pages }
    guard total >= parallelAbove, roots.count > 1 else { return walker.walkHeaders(of: inTurn) }
    // As many shares as processors, two to four; the heaviest tree first, each to the lightest.
    let count = min(roots.count, 4, max(2, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))))
    var split = [[(page: UInt64, depth: Int)]](repeating: [], count: count)
    var weights = [UInt64](repeating: 0, count: count)
    for root in roots.sorted(by: { $0.pages > $1.pages }) {
      let lightest = weights.indices.min { weights[$0] < weights[$1] } ?? 0
      split[lightest].append((root.page, root.depth))
      weights[lightest] &+= root.pages
    }
    let shares = split
    let results = Mutex<[Int: (live: PageBits, problem: String?)]>([:])
    // The map outlives the walk: every thread only reads it.
    nonisolated(unsafe) let map = walker.map
    let (pageSize, lastPage, pagesInFile) = (walker.pageSize, walker.lastPage, walker.pagesInFile)
    DispatchQueue.concurrentPerform(iterations: count) { share in
      var own = Walker(map: map, pageSize: pageSize, lastPage: lastPage, pagesInFile: pagesInFile)
      let problem = own.walkHeaders(of: shares[share])
      let outcome = (own.live, problem)
      results.withLock { $0[share] = outcome }
    }
    let walked = results.withLock { $0 }
    var merged = walker
    var problem: String?
    for share in 0..<count {
      guard let result = walked[share] else {
        problem = "a tree walk did not finish"
        break
      }
      let shared = merged.live.firstShared(with: result.live)
      if let found = result.problem ?? shared.map({ "page \($0) is named twice in the trees" }) {
        problem = found
        break
      }
      merged.live.formUnion(result.live)
    }
    guard let problem else {
      walker = merged
      return nil
    }
    // A damaged file is walked again on this thread, so that its damage is named as one thread
    // names it (the page where two trees meet, the first tree's problem), whatever the processors.
    return walker.walkHeaders(of: inTurn) ?? problem
  }
}
