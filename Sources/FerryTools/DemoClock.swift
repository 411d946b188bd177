import Ferry
import Foundation
import Synchronization

/// The demo's simulated time: it stands still while the story is told and jumps when the story
/// says "30 seconds later". The demo's own (the CLI does not link FerryTesting): a reading is a
/// count of milliseconds since 1970, and waiting polls the reading every real millisecond — a
/// waiter of the demo's store (a retry timer, a max-age notice) wakes within a millisecond of the
/// jump that passes its time.
final class DemoClock: DatedClock, Sendable {
  typealias Duration = Swift.Duration

  struct Instant: InstantProtocol {
    typealias Duration = Swift.Duration
    var milliseconds: Int64
    func advanced(by duration: Duration) -> Instant {
      Instant(milliseconds: milliseconds.addingSaturating(duration.milliseconds))
    }
    func duration(to other: Instant) -> Duration { .milliseconds(other.milliseconds &- milliseconds) }
    static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.milliseconds < rhs.milliseconds }
  }

  private let reading: Mutex<Instant>

  init(date: Date) { reading = Mutex(Instant(milliseconds: date.unixMilliseconds)) }

  var now: Instant { reading.withLock { $0 } }
  var minimumResolution: Duration { .milliseconds(1) }
  var date: Date { date(at: now) }
  func date(at instant: Instant) -> Date { Date(unixMilliseconds: instant.milliseconds) }

  /// Jumps forward by `duration`.
  func advance(by duration: Duration) { reading.withLock { $0 = $0.advanced(by: duration) } }

  /// Jumps to `date` (never back).
  func set(_ date: Date) {
    reading.withLock { $0 = Instant(milliseconds: max($0.milliseconds, date.unixMilliseconds)) }
  }

  func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
    while now < deadline { try await Task.sleep(for: .milliseconds(1)) }
  }
}

extension Int64 {
  fileprivate func addingSaturating(_ other: Int64) -> Int64 {
    let (sum, overflow) = addingReportingOverflow(other)
    return overflow ? (other > 0 ? .max : .min) : sum
  }
}
