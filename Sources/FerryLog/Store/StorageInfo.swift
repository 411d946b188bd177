import LMDB

// What the log tells of the storage engine beneath it, in FerryLog's own types: an app that links
// Ferry depends on Ferry's API only, never on the LMDB wrapper's.

/// Counters of the storage engine in this process since the store was opened.
public struct StorageCounters: Sendable, Equatable {
  /// Write transactions committed.
  public var commits: Int
  /// Write transactions aborted (including the ones retried after growing the map).
  public var aborts: Int
  /// Times the map was grown by this process.
  public var mapGrowths: Int
  /// Times a larger map set by another process was adopted.
  public var mapAdoptions: Int

  init(_ counters: Environment.Counters) {
    commits = counters.commits
    aborts = counters.aborts
    mapGrowths = counters.mapGrowths
    mapAdoptions = counters.mapAdoptions
  }
}

/// The size of the store's memory map and how much of it is used.
public struct StorageInfo: Sendable, Equatable {
  /// The map size in bytes.
  public var mapSize: Int
  /// The last page number in use.
  public var lastPage: Int
  /// The page size in bytes.
  public var pageSize: Int
  /// Reader slots in use.
  public var readers: Int
  /// Reader slots available.
  public var maxReaders: Int
  /// The id of the last committed transaction: it changes with every commit, by any process.
  public var lastTransaction: Int
  /// Bytes of the map in use: `(lastPage + 1) * pageSize`.
  public var usedBytes: Int { (lastPage + 1) * pageSize }

  init(_ info: Environment.Info) {
    mapSize = info.mapSize
    lastPage = info.lastPage
    pageSize = info.pageSize
    readers = info.readers
    maxReaders = info.maxReaders
    lastTransaction = info.lastTransaction
  }
}
