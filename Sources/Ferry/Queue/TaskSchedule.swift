import FerryLog
import Foundation

/// When an added task may first run, and whether it repeats (`Specs/task-events.md` §2.6).
///
/// ```swift
/// // Send the reminder at 9:00, not before.
/// try await queue.add(tag: "remind", payload: reminder, options: [.schedule(.at(nineOClock))])
/// // Sync the inbox every 15 minutes; `keep` makes the add at every launch a no-op once queued.
/// try await queue.add(
///   tag: "sync-inbox", payload: Inbox(), dataId: "inbox",
///   options: [.unique(.keep), .schedule(.every(.seconds(900)))])
/// ```
///
/// Times are on the store's clock, to the millisecond, and stored in the task's `task.added`: a
/// start survives restarts, compaction and export/import, and every runner and background window
/// honours it (``TaskQueue/nextDueDate()`` counts it). A task that waits for its start reads
/// ``TaskStatus/scheduled(at:)``.
public struct TaskSchedule: Sendable, Equatable {
  enum Start: Sendable, Equatable {
    case now
    case at(Date)
    case after(Duration)
  }

  let start: Start
  /// The interval the task repeats at; nil when it runs once.
  public let interval: Duration?

  /// The shortest interval a task may repeat at: a shorter one would keep a runner busy with it.
  public static let minimumInterval: Duration = .seconds(1)

  /// Runs as soon as a runner may take it (the default).
  public static let now = TaskSchedule(start: .now, interval: nil)

  /// No run starts before `date`.
  public static func at(_ date: Date) -> TaskSchedule { TaskSchedule(start: .at(date), interval: nil) }

  /// No run starts before `delay` has passed since the add (on the store's clock).
  public static func after(_ delay: Duration) -> TaskSchedule {
    TaskSchedule(start: .after(delay), interval: nil)
  }

  /// Runs at `startingAt` (now when nil), then again `interval` after each success, until it is
  /// cancelled. Each repetition is a task of its own — a new id and a new
  /// ``RunningTask/idempotencyKey`` — added in the same commit as the success of the one before:
  ///
  /// - **A crash** during a run leaves that repetition queued; it runs again (as any interrupted
  ///   run) and its success adds the next one. No repetition is lost or added twice: the success
  ///   and the next add are one commit.
  /// - **A failure** is retried under the tag's retry policy; the next repetition is counted from
  ///   the success that ends it, so retries never pile up repetitions. A repetition that fails for
  ///   good (dead) or is blocked by a recorded error holds the series until it is revived or
  ///   resolved: a failure that needs a person does not repeat every interval.
  /// - **One series per data id**: a success adds no repetition while another queued task of
  ///   the same tag and data id repeats and is not dead — say, a series an add with `keep`
  ///   restarted while this one was dead, before this one was revived. The series goes on in it.
  /// - **Missed intervals**: a repetition due while the app was not running (or the queue was
  ///   paused, or offline) runs once when it can, and the next is due an interval after that
  ///   run's success — never one run per missed interval.
  /// - **Cancel** the queued repetition (``TaskQueue/cancel(_:)``, by tag or group, or `clear`)
  ///   to stop the series; a repetition cancelled while it runs adds no next one. ``TaskQueue/pause()``
  ///   stops it with the rest of the queue until ``TaskQueue/resume()``.
  ///
  /// A repeating task can be neither manual, in a group, nor have a deadline: each repetition would
  /// join the end of its group, and a head waiting for its start holds the whole group — every
  /// change added after it would wait up to an interval. `interval` is at least
  /// ``minimumInterval``.
  ///
  /// The series has no id of its own: find its queued task by tag and data id
  /// (``TaskQueue/pendingTasks(tag:groupId:dataId:)-(String?,_,_)``). An add of the same tag and
  /// data id with `keep` returns that task, which runs at its own start — to sync now, add a task
  /// without `keep`, or with another data id; with `replace` and no interval, it ends the series
  /// (the replacement runs once).
  public static func every(_ interval: Duration, startingAt: Date? = nil) -> TaskSchedule {
    TaskSchedule(start: startingAt.map { .at($0) } ?? .now, interval: interval)
  }

  /// ``every(_:startingAt:)`` whose first run is `firstAfter` from now.
  public static func every(_ interval: Duration, firstAfter: Duration) -> TaskSchedule {
    TaskSchedule(start: .after(firstAfter), interval: interval)
  }

  /// The stored form, with a delay taken from `now` (Unix ms) and rounded up (a start is never
  /// earlier than asked); `invalidArgument` for a time or duration Ferry cannot store.
  func resolved(now: Int64) throws -> AddSchedule {
    var result = AddSchedule.none
    switch start {
    case .now: break
    case .at(let date): result.startAt = try Self.milliseconds(date, "start")
    case .after(let delay):
      guard delay >= .zero else { throw FerryError.invalidArgument("the delay \(delay) is negative") }
      let (at, overflow) = now.addingReportingOverflow(Self.roundedUp(delay))
      guard !overflow, at < Int64.max else {
        throw FerryError.invalidArgument("the delay \(delay) ends past the times Ferry can store")
      }
      if delay > .zero { result.startAt = at }
    }
    if let interval {
      guard interval >= Self.minimumInterval else {
        throw FerryError.invalidArgument("the interval \(interval) is shorter than \(Self.minimumInterval)")
      }
      let milliseconds = Self.roundedUp(interval)
      guard milliseconds < Int64.max / 2 else {
        throw FerryError.invalidArgument("the interval \(interval) is longer than Ferry can store")
      }
      result.interval = milliseconds
    }
    return result
  }

  /// Whole milliseconds, rounded up, saturating.
  static func roundedUp(_ duration: Duration) -> Int64 {
    let whole = duration.milliseconds
    return whole < .max && .milliseconds(whole) < duration ? whole + 1 : whole
  }

  static func milliseconds(_ date: Date, _ what: String) throws -> Int64 {
    let value = (date.timeIntervalSince1970 * 1000).rounded(.up)
    guard value.isFinite, value >= -9.2e18, value <= 9.2e18 else {
      // Not `\(date)`: describing a Date of NaN or infinite seconds traps in Foundation.
      throw FerryError.invalidArgument(
        "the \(what) \(date.timeIntervalSince1970) s since 1970 is not a time Ferry can store")
    }
    return Int64(value)
  }
}
