/// How a refresh ended.
public enum RefreshOutcome: Sendable, Equatable {
  /// Fetched and saved.
  case successful
  /// The fetch or the save failed; the error says where and carries the source's own error. The
  /// last success time is kept.
  case failed(RefreshError)
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

/// A refresh that failed: where it failed, the error the app's source threw (so that a 401 can
/// be told from a timeout with `as?` or pattern matching, not by parsing text), and a message for
/// display (also what the ledger records).
///
/// ```swift
/// if case .failed(let error) = await notes.refresh(), let http = error.underlying as? HTTPError,
///    http.status == 401 { showLogin() }
/// ```
public struct RefreshError: Error, Sendable, Equatable, CustomStringConvertible {
  /// Where the refresh failed.
  public enum Stage: Sendable, Equatable {
    /// Running the pending tasks the refresh requires first.
    case pendingTasks
    /// The source's `fetch`.
    case fetch
    /// The source's `save`.
    case save
    /// Recording the fetch in the ledger.
    case recording
    /// Read back from the ledger (a failure recorded earlier, maybe by another process): only its
    /// message is known.
    case recorded
  }

  /// Where it failed.
  public let stage: Stage
  /// The message for display, as the ledger records it.
  public let message: String
  /// The error thrown by the source (or the store), when this process saw it thrown.
  public let underlying: (any Error & Sendable)?

  /// A refresh error.
  public init(stage: Stage, message: String, underlying: (any Error & Sendable)? = nil) {
    self.stage = stage
    self.message = message
    self.underlying = underlying
  }

  /// The message.
  public var description: String { message }

  /// Errors compare by stage and message (the underlying errors need not be comparable).
  public static func == (lhs: RefreshError, rhs: RefreshError) -> Bool {
    lhs.stage == rhs.stage && lhs.message == rhs.message
  }
}
