import CoreMetrics
import LMDB
import Logging

extension EventLog {
  /// How a log is opened.
  public struct Configuration: Sendable {
    /// The projections to keep materialized.
    public var projections: [any Projection]
    /// The accepted event types and their upcasters; nil accepts any valid type name and upcasts nothing.
    public var catalog: EventCatalog?
    /// Open read-only: nothing is written, projections are not caught up (see ``EventLog/staleProjections``).
    public var readOnly: Bool = false
    /// Create the store when the directory is missing or empty.
    public var createIfMissing: Bool = true
    /// The map size of a new store; it doubles whenever it fills.
    public var initialMapSize: Int = 1 << 20
    /// The map never grows past this.
    public var maxMapSize: Int = 1 << 40
    /// Keep the event-id index, so that an event appended again with the same id is stored once.
    /// Off by default: the index costs every commit one more B-tree and every rebuild about a
    /// tenth of its work. Turning it on for an existing store builds it from the log at open.
    public var idempotentAppends: Bool = false
    /// The largest payload accepted, in bytes.
    public var maxPayloadSize: Int = 16 << 20
    /// The most events one group commit writes.
    public var maxEventsPerCommit: Int = 8192
    /// Events replayed per transaction by a rebuild.
    public var rebuildChunkSize: Int = 20_000
    /// How long the writer thread polls for the next append before it sleeps while one caller
    /// appends alone, in small steps and without pause — a loop of adds, a serial runner finishing
    /// one task and claiming the next: the last eight commits each served one append of at most
    /// two events, and the last came within four times this after the queue emptied. Waking a
    /// sleeping thread costs tens of microseconds on many machines (more in virtual machines),
    /// which such a caller pays on every commit. The writer never polls with more to gather —
    /// several callers, a runner whose lanes share each command — (it sleeps, so that the work
    /// gathers into one commit), on a one-processor machine, or when appends come further apart
    /// (an idle store's writer sleeps); at most 10 ms. `.zero` never polls.
    ///
    /// nil, the default: 50 µs in a store with a write-ahead segment, where a commit's one flush
    /// is short enough for the wake-up to show (a serial run loop 10 % faster in the benchmark),
    /// and no polling without it, where the benchmark measured no gain. `Statistics.writerSpins`
    /// counts the polls.
    public var writerSpin: Duration? = nil
    /// The wall clock, in Unix milliseconds, stamped on new events.
    public var clock: @Sendable () -> Int64 = wallClockMilliseconds
    /// Open a damaged store anyway, read-only only, to read what is left (salvage, inspection):
    /// skips the data file's meta-page checks and the lost-commit check that otherwise refuse it
    /// with ``FerryLogError/damagedStore(path:reason:)`` or ``FerryLogError/lostCommits(path:acknowledged:found:)``.
    /// Reads may still fail, or crash the process inside LMDB: read such a store from a child process.
    public var allowDamage: Bool = false
    /// Where the log writes its log records (swift-log): nil, the default, logs nothing. A
    /// library must not print unasked — swift-log's default handler, used before the app calls
    /// `LoggingSystem.bootstrap`, prints to standard output — so the app hands Ferry a logger:
    /// `Logger(label: "ferry")` after bootstrapping. Records carry sequences, counts and paths,
    /// never an event's payload. Per-commit lines are at `trace`; a store refused as damaged and a
    /// failed commit (disk full, I/O) at `error`.
    public var logger: Logger?
    /// Where the log's metrics go (swift-metrics): nil, the default, uses `MetricsSystem.factory`
    /// as it is at open — the no-op handler unless the app bootstrapped a backend, and then
    /// nothing is measured at all. A factory given here is used instead (one per store, say, or
    /// a test's). The DocC article "Logging and metrics" lists the metrics.
    public var metricsFactory: (any MetricsFactory)?
    /// Dimensions added to every metric of this store, e.g. `[("store", "notes")]`: two stores in
    /// one process reporting to one backend keep their series apart only with different ones.
    public var metricsDimensions: [(String, String)] = []
    /// Acknowledge each group commit after one flush of a write-ahead segment instead of LMDB's
    /// two (data pages, then meta page): `Specs/one-sync-commit.md`. On by default; `false` commits
    /// every group commit with LMDB's own two flushes, as Ferry did before the segment.
    ///
    /// The store remembers it: a store with a segment is format 3, which Ferry before this option
    /// refuses to open. It is turned on or off only by an open that finds no other process using
    /// the store; an open that shares the store follows what the store does, whatever this says.
    /// A store's segment is recovered (its frames replayed) by the next read-write open that is
    /// alone after a crash or power cut; a read-only open that is alone then fails with
    /// ``FerryLogError/needsRecovery(path:)``, unless it asks for ``recoveredCopyIfNeeded``.
    public var writeAheadSegment: Bool = true
    /// Read-only only: where the store needs recovery (its writer died with commits only its
    /// write-ahead segment holds, and no other process has it open), copy its data file and
    /// segment into a private directory under the temporary directory, replay the copy there, and
    /// read that — every acknowledged event, as the store was at the crash — instead of failing
    /// with ``FerryLogError/needsRecovery(path:)``. Nothing is written to the store's directory
    /// (it may be on read-only media); the copy is removed at close. ``EventLog/isRecoveredCopy``
    /// says whether an open read such a copy. A copy that cannot be made (no room in the
    /// temporary directory) fails with ``FerryLogError/recoveredCopyFailed(path:reason:)``.
    /// Off by default: the copy costs the data file's size in the temporary directory and the
    /// time to copy it.
    public var recoveredCopyIfNeeded: Bool = false
    /// With the segment on: checkpoint (flush LMDB, start a new segment cycle) after this many
    /// group commits since the last checkpoint. Until a checkpoint LMDB reuses no page freed since
    /// the previous one, so the data file grows by about this many commits' pages.
    public var segmentCheckpointCommits: Int = 256
    /// With the segment on: checkpoint after this many bytes of frames since the last checkpoint.
    public var segmentCheckpointBytes: Int = 4 << 20
    /// With the segment on: checkpoint once the commits since the last checkpoint have freed
    /// this many bytes of data-file pages — the pages LMDB cannot reuse before the next one, and
    /// so about the most the data file holds beyond what it would without the segment.
    public var segmentCheckpointFreedBytes: Int = 8 << 20
    /// The id a store created by this open gets (a new one when nil): `ferry salvage` gives the
    /// store it rebuilds the damaged store's id, so the store stays the same store.
    package var storeIdAtCreation: EventID?
    /// Tests only: the LMDB version the open checks in place of the linked one.
    package var lmdbVersionInPlaceOfLinked: LMDBVersion?

    /// A configuration with the given projections and catalog, and defaults for everything else.
    public init(projections: [any Projection] = [], catalog: EventCatalog? = nil) {
      self.projections = projections
      self.catalog = catalog
    }
  }
}
