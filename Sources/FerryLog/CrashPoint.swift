import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Labelled places where the crash tests kill the process (`SIGKILL`), to prove that a crash at
/// each of them loses nothing acknowledged (`Specs/crash-model.md`).
///
/// Armed only by the environment: `FERRY_CRASH_POINT=<label>` kills at the `FERRY_CRASH_AFTER`-th
/// time (default 1) the process reaches that label. Unarmed, reaching a point costs one check of a
/// value read once.
public enum CrashPoint {
  /// Inside a group commit's write transaction, everything written, just before the commit.
  public static let beforeCommit = "append.beforeCommit"
  /// Just after a group commit is durable, before its callers are told.
  public static let afterCommit = "append.afterCommit"
  /// After one chunk of a rebuild or catch-up is committed, before the next.
  public static let rebuildChunk = "rebuild.chunk"
  /// While a new store is being created: its environment exists, its metadata does not yet.
  public static let creatingStore = "create.beforeMeta"
  /// Inside a compaction's transaction: snapshot written, events removed, not yet committed.
  public static let compaction = "compaction"
  /// During crash recovery at open, before interrupted runs are logged.
  public static let recovery = "recovery"

  private static let armed: (label: String, after: Int)? = {
    guard let raw = getenv("FERRY_CRASH_POINT") else { return nil }
    let label = String(cString: raw)
    let after = getenv("FERRY_CRASH_AFTER").flatMap { Int(String(cString: $0)) } ?? 1
    return label.isEmpty ? nil : (label, max(1, after))
  }()
  private static let hits = Atomic<Int>(0)

  /// Kills the process here if this label is armed and its count is reached.
  @inline(__always)
  public static func reach(_ label: String) {
    guard let armed, armed.label == label else { return }
    let count = hits.add(1, ordering: .relaxed).newValue
    if count >= armed.after { kill(getpid(), SIGKILL) }
  }
}
