import ArgumentParser
import FerryLog
import FerryTools

/// A duration flag (`--retention`, `--max-age`): `7d`, `36h`, `90m`, `45s`, `500ms`, several
/// (`1h30m`) or plain seconds, read once with the command line. A bad value is a usage error
/// (status 64) whose message names the flag and shows its help, which gives the syntax.
struct TimeSpan: ExpressibleByArgument, Sendable {
  let milliseconds: Int64
  /// As written, for the help's default.
  private let text: String

  init(_ milliseconds: Int64, written text: String) {
    self.milliseconds = milliseconds
    self.text = text
  }

  init?(argument: String) {
    guard let milliseconds = try? parseDuration(argument, flag: "") else { return nil }
    self.milliseconds = milliseconds
    text = argument
  }

  var defaultValueDescription: String { text }
}

/// `--since`: a duration back from now (`2h`) or an ISO 8601 time, read once with the command line
/// and placed against the clock when the command runs. A bad value is a usage error as for
/// ``TimeSpan``.
struct SinceFlag: ExpressibleByArgument, Sendable {
  let point: PointInTime

  init?(argument: String) {
    guard let point = try? PointInTime(parsing: argument) else { return nil }
    self.point = point
  }

  /// Unix milliseconds, a relative time counted back from the wall clock now.
  var milliseconds: Int64 { point.milliseconds(now: wallClockMilliseconds()) }
}
