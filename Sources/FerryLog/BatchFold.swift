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
  /// One changed key and its new value (nil: deleted).
  struct Entry {
    var key: [UInt8]
    var value: [UInt8]?
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

  var isEmpty: Bool { entries.isEmpty && !emptied }
  var changedRows: Int { entries.count }

  /// LMDB's default key order: memcmp over the shorter length, then the shorter key first.
  static func precedes(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
    let common = min(a.count, b.count)
    if common > 0, let x = a.baseAddress, let y = b.baseAddress {
      let order = memcmp(x, y, common)
      if order != 0 { return order < 0 }
    }
    return a.count < b.count
  }

  static func precedes(_ a: [UInt8], _ b: [UInt8]) -> Bool {
    a.withUnsafeBytes { x in b.withUnsafeBytes { y in precedes(x, y) } }
  }

  /// The first index whose key is not below `key`, and whether that key is `key`.
  func find(_ key: [UInt8]) -> (index: Int, found: Bool) {
    key.withUnsafeBytes { k in
      guard let last = entries.last else { return (0, false) }
      // The usual case: a key past every changed key.
      if last.key.withUnsafeBytes({ Self.precedes($0, k) }) { return (entries.count, false) }
      var low = 0
      var high = entries.count
      while low < high {
        let middle = (low + high) / 2
        if entries[middle].key.withUnsafeBytes({ Self.precedes($0, k) }) {
          low = middle + 1
        } else {
          high = middle
        }
      }
      let found = low < entries.count && entries[low].key.withUnsafeBytes { !Self.precedes(k, $0) }
      return (low, found)
    }
  }

  /// What the overlay says about `key`: `.some(value)` (nil: deleted) when it changed it, or nil
  /// when the B-tree (or, after `removeAll`, nothing) decides.
  func lookup(_ key: [UInt8]) -> [UInt8]?? {
    let (index, found) = find(key)
    if found { return .some(entries[index].value) }
    return emptied ? .some(nil) : nil
  }

  func set(_ key: [UInt8], _ value: [UInt8]?) {
    let (index, found) = find(key)
    if found {
      entries[index].value = value
    } else if index == entries.count {
      entries.append(Entry(key: key, value: value))
    } else {
      entries.insert(Entry(key: key, value: value), at: index)
    }
  }

  func removeAll() {
    entries.removeAll(keepingCapacity: true)
    emptied = true
  }

  /// Writes the surviving rows into `db` in key order and forgets them.
  func flush(into db: Database, _ txn: Transaction) throws {
    if emptied { try txn.empty(db) }
    // Past the table's last key, puts append and deletes have nothing to delete.
    var last: [UInt8]? = try txn.withCursor(db) { cursor in try cursor.last()?.key }
    for entry in entries {
      let key = entry.key
      let value = entry.value
      let pastEnd = last.map { Self.precedes($0, key) } ?? true
      if let value {
        if pastEnd {
          try txn.put(db, key: key, value: value, flags: .append)
          last = key
        } else {
          try txn.put(db, key: key, value: value)
        }
      } else if !pastEnd {
        try txn.delete(db, key: key)
      }
    }
    entries.removeAll(keepingCapacity: true)
    emptied = false
  }

  /// Visits the table as the overlay over `base` shows it, from the first key at or after
  /// `start`, until `body` returns false; returns the entries visited.
  func scan(
    base db: Database, _ txn: Transaction, from start: [UInt8]?,
    _ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> Bool
  ) throws -> Int {
    // The keys as they are now: a change made by `body` during the walk is read by later gets,
    // not met by this walk.
    let entries = self.entries
    var index = start.map { find($0).index } ?? 0
    var seen = 0
    var going = true
    /// Emits the overlay's rows below `limit` (all when nil); false when `body` said stop.
    func emitOverlay(below limit: UnsafeRawBufferPointer?) throws -> Bool {
      while index < entries.count {
        let key = entries[index].key
        if let limit, !key.withUnsafeBytes({ Self.precedes($0, limit) }) { return true }
        index += 1
        guard let value = entries[index - 1].value else { continue }
        seen += 1
        let more = try key.withUnsafeBytes { k in try value.withUnsafeBytes { v in try body(k, v) } }
        if !more { return false }
      }
      return true
    }
    if !emptied {
      try txn.withCursor(db) { cursor in
        try cursor.scan(from: start) { key, value in
          going = try emitOverlay(below: key)
          guard going else { return false }
          if index < entries.count, entries[index].key.elementsEqual(key) {
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
}
