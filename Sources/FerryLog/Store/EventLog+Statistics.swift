import Synchronization

extension EventLog {
  /// Counters since open, for tests and benchmarks.
  public struct Statistics: Sendable, Equatable {
    /// Write transactions that committed appends (group commits).
    public var commits: Int = 0
    /// `append` calls that completed.
    public var appendCalls: Int = 0
    /// Events written (duplicates excluded).
    public var eventsAppended: Int = 0
    /// Events not written because their id was already in the log.
    public var duplicatesSkipped: Int = 0
    /// The most `append` calls that shared one commit.
    public var largestBatch: Int = 0
    /// Times the writer polled for its next job before sleeping (``Configuration/writerSpin``).
    public var writerSpins: Int = 0
    /// Of those, the times a job came while it polled (the writer did not sleep).
    public var writerSpinsCaught: Int = 0
  }

  /// Counters of commits and appends since open.
  public var statistics: Statistics { writer?.statistics.withLock { $0 } ?? Statistics() }

  /// Counters of the storage engine in this process (commits, aborts, map growths).
  public var storageCounters: StorageCounters { StorageCounters(environment.counters) }

  /// The map size and how much of it is used.
  public func storageInfo() throws -> StorageInfo { StorageInfo(try guarded { try environment.info() }) }

  /// Reader slots left by dead processes that were cleared when this log was opened.
  public var environmentStaleReadersCleared: Int { environment.staleReadersCleared }

  /// How many reads since open ran their body in the writer's transaction, their projection
  /// still behind after a catch-up (for tests).
  package var readsRunInWriter: Int { readsInWriter.load(ordering: .relaxed) }
}
