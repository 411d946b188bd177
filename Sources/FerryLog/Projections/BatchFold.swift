import Foundation
import LMDB

/// The rows of one projection table that a batch fold has changed and not yet written: a rebuild
/// folds a whole chunk of events into these, reading through them to the B-tree underneath, and
/// writes only the rows that survive the chunk, in key order (appending where the keys lie past
/// the table's last key). A row added and deleted inside the chunk never touches the B-tree.
///
/// The projection's `apply` is the same code either way: ``ProjectionTables`` reads and writes
/// through the overlay when it has one.
final class TableOverlay {
  /// One changed key and its new value (`value` nil: deleted), both in the overlay's arena.
  /// Plain data: dropping the entries of a chunk releases nothing (an entry of two arrays would
  /// cost two releases and a witness call each).
  struct Entry {
    var key: UnsafeRawBufferPointer
    var value: UnsafeRawBufferPointer?
    /// The bytes the arena holds for the value at its address (a shorter value written over it
    /// leaves the rest unused); 0 for a deletion.
    var room: Int
  }
  /// The changed keys in LMDB's order (byte-wise, a prefix first), found by binary search: new
  /// keys mostly come last (ids only grow), where insertion costs nothing. (A dictionary hashed
  /// every key byte by byte and cost more than the B-tree it saved.)
  ///
  /// Unchecked for exclusivity (a rebuild reads and writes it several times per event, and the
  /// dynamic check cost more than the binary search): every access is a whole read or a whole
  /// write within one method — `scan` walks a copy, so a projection that writes while it scans
  /// changes the property, not the array being walked.
  @exclusivity(unchecked) private(set) var entries: [Entry] = []
  /// Whether every row the B-tree held was removed (`removeAll`) in this chunk.
  private(set) var emptied = false
  /// The bytes of the entries' keys and values: blocks that never move, so an entry (and a
  /// buffer `scan` handed out) stays valid until ``flush(into:_:)``; reused chunk after chunk.
  @exclusivity(unchecked) private var arena = Arena()
  /// Bytes copied into the arena since it was last reset, and the bytes the entries still use: a
  /// row rewritten many times in a chunk (every claim and outcome of a task rewrites its row) is
  /// written over its old value when it fits and no scan is under way, and the arena is compacted
  /// when more than half of it (and at least 1 MiB) is left behind, so it holds about the rows
  /// that survive, not every write.
  @exclusivity(unchecked) private var copiedBytes = 0
  @exclusivity(unchecked) private var liveBytes = 0
  /// Scans under way (their bodies may hold the bytes of any entry: nothing is written over or
  /// moved while one runs).
  @exclusivity(unchecked) private var scans = 0

  /// How many rows the fold may change in this overlay's table (its chunk's events): once the
  /// entries outgrow a first small allocation they are given room for that many at once, not
  /// doubled step by step (each step copied every entry), up to ``maxReserved``.
  let expectedRows: Int
  /// The most entries reserved ahead (64 Ki entries, about 3 MiB).
  static let maxReserved = 1 << 16

  init(expectedRows: Int = 0) {
    self.expectedRows = min(max(0, expectedRows), Self.maxReserved)
  }

  /// Makes room for one more entry: from 1,024 entries on, for all the rows expected.
  @inline(__always)
  private func reserveForInsert() {
    let count = entries.count
    if count == entries.capacity, count >= 1_024, expectedRows > count {
      entries.reserveCapacity(expectedRows)
    }
  }

  /// The memory the arena holds (for tests).
  var arenaBytes: Int { arena.reservedBytes }

  var isEmpty: Bool { entries.isEmpty && !emptied }
  var changedRows: Int { entries.count }

  /// LMDB's default key order: memcmp over the shorter length, then the shorter key first.
  /// Eight bytes at a time, read big-endian (so that integer order is byte order), then byte by
  /// byte: the keys a fold writes are short (a task's 8 bytes, a `ready` key's 9), and a call of
  /// memcmp cost more than the comparison.
  @inline(__always)
  static func precedes(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
    let common = min(a.count, b.count)
    if common > 0, let x = a.baseAddress, let y = b.baseAddress {
      var offset = 0
      while common - offset >= 8 {
        let p = UInt64(bigEndian: x.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
        let q = UInt64(bigEndian: y.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
        if p != q { return p < q }
        offset += 8
      }
      while offset < common {
        let p = x.load(fromByteOffset: offset, as: UInt8.self)
        let q = y.load(fromByteOffset: offset, as: UInt8.self)
        if p != q { return p < q }
        offset += 1
      }
    }
    return a.count < b.count
  }

  static func precedes(_ a: [UInt8], _ b: [UInt8]) -> Bool {
    a.withUnsafeBytes { x in b.withUnsafeBytes { y in precedes(x, y) } }
  }

  static func equal(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
    guard a.count == b.count else { return false }
    guard a.count > 0, let x = a.baseAddress, let y = b.baseAddress else { return true }
    return memcmp(x, y, a.count) == 0
  }

  /// The first index whose key is not below `key`, and whether that key is `key`.
  func find(_ key: UnsafeRawBufferPointer) -> (index: Int, found: Bool) {
    guard let last = entries.last else { return (0, false) }
    // The usual case: a key past every changed key.
    if Self.precedes(last.key, key) { return (entries.count, false) }
    var low = 0
    var high = entries.count
    while low < high {
      let middle = (low + high) / 2
      if Self.precedes(entries[middle].key, key) {
        low = middle + 1
      } else {
        high = middle
      }
    }
    let found = low < entries.count && !Self.precedes(key, entries[low].key)
    return (low, found)
  }

  /// What the overlay says about `key`: `.some(value)` (nil: deleted) when it changed it, or nil
  /// when the B-tree (or, after `removeAll`, nothing) decides. The bytes are valid until the
  /// overlay is flushed.
  func lookup(_ key: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer?? {
    let (index, found) = find(key)
    if found { return .some(entries[index].value) }
    return emptied ? .some(nil) : nil
  }

  /// ``lookup(_:)``, copied.
  func lookup(_ key: [UInt8]) -> [UInt8]?? {
    key.withUnsafeBytes { k in lookup(k).map { $0.map { Array($0) } } }
  }

  /// Sets `key` to `value` (nil: deleted); both are copied.
  func set(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer?) {
    let (index, found) = find(key)
    if found {
      let old = entries[index]
      if let value, scans == 0, let oldValue = old.value, old.room >= value.count,
        let target = oldValue.baseAddress
      {
        // Written over the old value: nobody holds it (lookups copy what they read).
        if value.count > 0, let source = value.baseAddress {
          UnsafeMutableRawPointer(mutating: target).copyMemory(from: source, byteCount: value.count)
        }
        entries[index].value = UnsafeRawBufferPointer(start: target, count: value.count)
        return
      }
      entries[index].value = value.map { copy($0) }
      entries[index].room = value?.count ?? 0
      liveBytes += (value?.count ?? 0) - old.room
      compactIfWasteful()
      return
    }
    let entry = Entry(key: copy(key), value: value.map { copy($0) }, room: value?.count ?? 0)
    liveBytes += key.count + entry.room
    reserveForInsert()
    if index == entries.count {
      entries.append(entry)
    } else {
      entries.insert(entry, at: index)
    }
  }

  private func copy(_ bytes: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer {
    copiedBytes += bytes.count
    return arena.copy(bytes)
  }

  /// Copies the entries into a fresh arena when most of the old one holds values written over.
  private func compactIfWasteful() {
    guard scans == 0, copiedBytes - liveBytes > max(1 << 20, liveBytes) else { return }
    var fresh = Arena()
    for index in entries.indices {
      entries[index].key = fresh.copy(entries[index].key)
      if let value = entries[index].value { entries[index].value = fresh.copy(value) }
      entries[index].room = entries[index].value?.count ?? 0
    }
    arena = fresh
    liveBytes = entries.reduce(0) { $0 + $1.key.count + $1.room }
    copiedBytes = liveBytes
  }

  func set(_ key: [UInt8], _ value: [UInt8]?) {
    key.withUnsafeBytes { k in
      if let value { value.withUnsafeBytes { v in set(k, v) } } else { set(k, nil) }
    }
  }

  func removeAll() {
    // The arena is kept: a `scan` under way may still read the entries it copied.
    entries.removeAll(keepingCapacity: true)
    liveBytes = 0
    emptied = true
  }

  /// Writes the surviving rows into `db` in key order and forgets them.
  func flush(into db: Database, _ txn: Transaction) throws {
    if emptied { try txn.empty(db) }
    // Past the table's last key, puts append and deletes have nothing to delete. The entries are
    // in key order, so the keys inside the table's range come first (put and deleted the ordinary
    // way), then the ones past its end: appended through one cursor, which keeps the tree's root
    // page from one append to the next where each `mdb_put` set up a cursor afresh.
    try txn.withCursor(db) { cursor in
      let tableLast: [UInt8]? = try cursor.last()?.key
      try tableLast.withUnsafeBufferBytes { tableLast in
        var index = 0
        if let tableLast {
          while index < entries.count {
            let entry = entries[index]
            guard !Self.precedes(tableLast, entry.key) else { break }
            if let value = entry.value {
              try txn.put(db, key: entry.key, value: value)
            } else {
              try txn.delete(db, key: entry.key)
            }
            index += 1
          }
        }
        while index < entries.count {
          let entry = entries[index]
          if let value = entry.value { try cursor.put(key: entry.key, value: value, flags: .append) }
          index += 1
        }
      }
    }
    entries.removeAll(keepingCapacity: true)
    emptied = false
    arena.reset()
    copiedBytes = 0
    liveBytes = 0
  }

  /// Visits the table as the overlay over `base` shows it, from the first key at or after
  /// `start`, until `body` returns false; returns the entries visited.
  func scan(
    base db: Database, _ txn: Transaction, from start: [UInt8]?,
    _ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> Bool
  ) throws -> Int {
    // The keys as they are now: a change made by `body` during the walk is read by later gets,
    // not met by this walk (its bytes stay where they are until the overlay is flushed).
    let entries = self.entries
    scans += 1
    defer { scans -= 1 }
    var index = start.map { start in start.withUnsafeBytes { find($0).index } } ?? 0
    var seen = 0
    var going = true
    /// Emits the overlay's rows below `limit` (all when nil); false when `body` said stop.
    func emitOverlay(below limit: UnsafeRawBufferPointer?) throws -> Bool {
      while index < entries.count {
        let key = entries[index].key
        if let limit, !Self.precedes(key, limit) { return true }
        index += 1
        guard let value = entries[index - 1].value else { continue }
        seen += 1
        if try !body(key, value) { return false }
      }
      return true
    }
    if !emptied {
      try txn.withCursor(db) { cursor in
        try cursor.scan(from: start) { key, value in
          going = try emitOverlay(below: key)
          guard going else { return false }
          if index < entries.count, Self.equal(entries[index].key, key) {
            return true  // the overlay's row (or its deletion) replaces this one: met in emitOverlay
          }
          seen += 1
          going = try body(key, value)
          return going
        }
      }
    }
    if going { _ = try emitOverlay(below: nil) }
    return seen
  }

  /// Memory for the overlay's bytes: blocks of at least 64 KiB, filled in order and never moved
  /// or freed until the overlay is (blocks are reused after ``reset()``).
  struct Arena: ~Copyable {
    private var blocks: [(start: UnsafeMutableRawPointer, size: Int)] = []
    /// The block being filled and the bytes used in it.
    private var current = 0
    private var used = 0

    init() {}

    deinit {
      for block in blocks { block.start.deallocate() }
    }

    /// A copy of `bytes` in the arena.
    mutating func copy(_ bytes: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer {
      let count = bytes.count
      while current < blocks.count, blocks[current].size - used < count {
        current += 1
        used = 0
      }
      if current == blocks.count {
        let size = max(65_536, count)
        blocks.append((UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 16), size))
        used = 0
      }
      let target = blocks[current].start + used
      if count > 0, let source = bytes.baseAddress { target.copyMemory(from: source, byteCount: count) }
      used += count
      return UnsafeRawBufferPointer(start: target, count: count)
    }

    /// The bytes of every block.
    var reservedBytes: Int { blocks.reduce(0) { $0 + $1.size } }

    /// Forgets every copy (their memory is reused).
    mutating func reset() {
      current = 0
      used = 0
    }
  }
}

extension Optional where Wrapped == [UInt8] {
  /// Calls `body` with the array's bytes, or nil.
  fileprivate func withUnsafeBufferBytes<R>(_ body: (UnsafeRawBufferPointer?) throws -> R) rethrows -> R {
    guard let self else { return try body(nil) }
    return try self.withUnsafeBytes { try body($0) }
  }
}
