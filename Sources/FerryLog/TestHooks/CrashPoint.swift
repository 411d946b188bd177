import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Labelled places where the crash tests kill the process (`SIGKILL`), to prove that a crash at
/// each of them loses nothing acknowledged (`Specs/crash-model.md`).
///
/// `package` access: only Ferry's own modules, its crash worker and its tests can name it — an app
/// linking Ferry cannot, and `Tools/try-install.sh` proves that by compiling an app that tries.
/// Armed only by a process that asks for it (the crash worker calls ``armFromEnvironment()``) and
/// then by the environment: `FERRY_CRASH_POINT=<label>` kills at the `FERRY_CRASH_AFTER`-th time
/// (default 1) the process reaches that label. In an app the variable does nothing. Unarmed,
/// reaching a point costs one relaxed atomic load.
package enum CrashPoint {
  /// Inside a group commit's write transaction, everything written, just before the commit.
  package static let beforeCommit = "append.beforeCommit"
  /// Just after a group commit is durable, before its callers are told.
  package static let afterCommit = "append.afterCommit"
  /// After one chunk of a rebuild or catch-up is committed, before the next.
  package static let rebuildChunk = "rebuild.chunk"
  /// While a new store is being created: its environment exists, its metadata does not yet.
  package static let creatingStore = "create.beforeMeta"
  /// Inside a compaction's transaction: snapshot written, events removed, not yet committed.
  package static let compaction = "compaction"
  /// During crash recovery at open, before interrupted runs are logged.
  package static let recovery = "recovery"
  /// Write-ahead segment: a frame flushed, its LMDB transaction not yet committed.
  package static let frameFlushed = "segment.frameFlushed"
  /// Write-ahead segment checkpoint: the data file flushed, the new header not yet written.
  package static let checkpointSynced = "segment.checkpointSynced"
  /// Write-ahead segment checkpoint: the new header flushed, the old pin not yet released.
  package static let checkpointWritten = "segment.checkpointWritten"
  /// Write-ahead segment recovery: the checkpoint's meta pages restored, some frames replayed.
  package static let segmentReplay = "segment.replay"
  /// `ferry compact --copy`: the compacted copy renamed over `data.mdb` (LMDB's lock file, which
  /// held the old file's counters, removed just before), the lock file not yet made anew from it.
  package static let compactSwapped = "compact.swapped"
  /// `ferry compact --copy`: the compacted copy written beside the store, before the checks that
  /// nothing changed meanwhile and the swap.
  package static let compactCopied = "compact.copied"
  /// A runner owner's liveness token file created under its staging name, not yet locked.
  package static let ownerTokenStaged = "owner.tokenStaged"

  private static let isArmed = Atomic<Bool>(false)
  private static let armed = Mutex<(label: String, after: Int, signal: Int32, goOnFile: String?)?>(nil)
  private static let hits = Atomic<Int>(0)

  /// Reads `FERRY_CRASH_POINT` and `FERRY_CRASH_AFTER` and arms the point they name (nothing when
  /// unset or empty); `FERRY_CRASH_SIGNAL=STOP` stops the process there (`SIGSTOP`) instead, for a
  /// test that acts while it is stopped and then kills it — or, with `FERRY_CRASH_GO_ON_FILE`
  /// naming a file, lets it go on once it is continued (`SIGCONT`) and that file exists. Only the
  /// crash and test workers call this.
  package static func armFromEnvironment() {
    guard let raw = getenv("FERRY_CRASH_POINT") else { return }
    let label = String(cString: raw)
    guard !label.isEmpty else { return }
    let after = getenv("FERRY_CRASH_AFTER").flatMap { Int(String(cString: $0)) } ?? 1
    let stops = getenv("FERRY_CRASH_SIGNAL").map { String(cString: $0) } == "STOP"
    let goOnFile = getenv("FERRY_CRASH_GO_ON_FILE").map { String(cString: $0) }
    armed.withLock { $0 = (label, max(1, after), stops ? SIGSTOP : SIGKILL, stops ? goOnFile : nil) }
    isArmed.store(true, ordering: .releasing)
  }

  /// Kills the process here if this label is armed and its count is reached.
  @inline(__always)
  package static func reach(_ label: String) {
    guard isArmed.load(ordering: .acquiring) else { return }
    guard let armed = armed.withLock({ $0 }), armed.label == label else { return }
    let count = hits.add(1, ordering: .relaxed).newValue
    guard count >= armed.after else { return }
    // A point that goes on fires once: reached again (the next chunk of a rebuild, or another
    // thread at the same moment), it must not stop the process again, where nobody continues it.
    if armed.goOnFile != nil {
      let fired = isArmed.compareExchange(expected: true, desired: false, ordering: .acquiringAndReleasing)
      guard fired.exchanged else { return }
    }
    kill(getpid(), armed.signal)
    if let file = armed.goOnFile {
      // Stopped here; once continued (however late the stop landed), on when the file exists.
      while access(file, F_OK) != 0 { usleep(1_000) }
      return
    }
    // It goes no further even when the signal lands late (seen under load with SIGSTOP: a worker
    // ran on to its end and only then stopped): the thread waits here to die (or, stopped, to be
    // killed by the test).
    while true { pause() }
  }
}
