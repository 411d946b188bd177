/// How a refresh ended.
public enum RefreshResult: Sendable, Equatable {
  /// Fetched and saved.
  case successful
  /// The fetch or the save failed; the message says why. The last success time is kept.
  case failed(String)
  /// Not attempted.
  case skipped(RefreshSkipReason)
}

/// Why a refresh was not attempted.
public enum RefreshSkipReason: Sendable, Equatable {
  /// The cache is not too old yet (and the refresh was not forced).
  case notTooOld
  /// The refresh was cancelled before it fetched.
  case cancelled
  /// Pending tasks the refresh depends on did not all run successfully first.
  case pendingTasks
}
