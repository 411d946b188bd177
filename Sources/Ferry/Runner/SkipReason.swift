import FerryLog
import Foundation

/// Why a pass did not run a task. Skips are reported, not logged.
public enum SkipReason: Sendable, Equatable {
  /// An earlier task of its group failed, recorded an error, or was skipped in this pass (not ready, no handler, blocked, dead, waiting for its retry): the rest of the group
  /// waits for a later pass.
  case partOfFailedGroup
  /// Its tag's `isReadyToRun` check, or the runner's (``TaskRunner/Configuration/isReadyToRun``),
  /// said no. ``TaskRunner/conditionsChanged()`` has them asked again.
  case notReady
  /// It has an unresolved recorded error.
  case blockedByError
  /// It waits for its retry time.
  case waitingForRetry(until: Date)
  /// It has not run yet and waits for its start time (``TaskSchedule``).
  case scheduled(at: Date)
  /// It is dead (revive it to run it again).
  case dead
  /// It is running already (in another pass or process).
  case running
  /// An earlier task of its group is still queued.
  case notHeadOfGroup
  /// No handler is registered for its tag; it stays queued.
  case noHandler
  /// It left the queue (cancelled or cleared) before its turn.
  case noLongerQueued
  /// The runner's ``TaskRunner/Configuration/connectivity`` says the device is offline: nothing
  /// starts, and no attempt is spent, until it is back.
  case offline
  /// Its last run in this runner said ``TaskResult/deferred(_:)``: it waits for connectivity to
  /// come back, ``TaskRunner/conditionsChanged()`` or ``TaskRunner/Configuration/deferralDelay``.
  case deferred
}
