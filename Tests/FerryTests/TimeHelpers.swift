import Ferry
import FerryTesting
import Foundation

// Tests write times as the log keeps them — Unix milliseconds — and compare them with the dates
// the API gives out through these.

/// The date of a time in Unix milliseconds (the store's own conversion).
func at(_ milliseconds: Int64) -> Date { Date(unixMilliseconds: milliseconds) }

extension ManualClock {
  /// The clock's date in Unix milliseconds.
  var milliseconds: Int64 { date.unixMilliseconds }

  /// Moves the clock to a time in Unix milliseconds, exactly (a `Date` near the ends of `Int64`
  /// milliseconds holds them only to a second or so).
  func set(milliseconds: Int64) { advance(to: Instant(sinceUnixEpoch: .milliseconds(milliseconds))) }
}
