import FerryLog
import Foundation

/// Reads a duration flag: a number with a unit — `7d`, `36h`, `90m`, `45s`, `500ms` — or several
/// (`1h30m`), or plain seconds (`604800`). Returns milliseconds, saturating at `Int64.max` (a huge
/// value means "forever", not a crash). Throws a ``ToolError`` with status 64 (bad flags) for
/// anything else, negative values included.
package func parseDuration(_ text: String, flag: String) throws(ToolError) -> Int64 {
  let bad = ToolError(
    .badFlags,
    "\(flag) takes a duration such as 7d, 36h, 90m, 45s or plain seconds (604800), not '\(text)'")
  let trimmed = text.trimmingCharacters(in: .whitespaces)
  guard !trimmed.isEmpty else { throw bad }
  if trimmed.allSatisfy(\.isASCIIDigit) {
    guard let seconds = Int64(trimmed) else { return .max }
    return saturating(seconds, 1000)
  }
  var total: Int64 = 0
  var rest = Substring(trimmed)
  while !rest.isEmpty {
    let digits = rest.prefix(while: \.isASCIIDigit)
    guard !digits.isEmpty else { throw bad }
    rest = rest.dropFirst(digits.count)
    let unit = rest.prefix(while: { $0.isLetter })
    rest = rest.dropFirst(unit.count)
    let scale: Int64
    switch unit {
    case "ms": scale = 1
    case "s": scale = 1000
    case "m": scale = 60_000
    case "h": scale = 3_600_000
    case "d": scale = 86_400_000
    case "w": scale = 7 * 86_400_000
    default: throw bad
    }
    let value = Int64(digits).map { saturating($0, scale) } ?? .max
    let (sum, overflow) = total.addingReportingOverflow(value)
    total = overflow ? .max : sum
  }
  return total
}

/// What `--since` names: a time that many milliseconds back from now, or a fixed time (Unix
/// milliseconds). Read once from the flag; a relative one is placed against the clock when used.
package enum PointInTime: Sendable, Equatable {
  case ago(Int64)
  case at(Int64)

  /// Reads a duration back from now (`2h`, `7d`, plain seconds) or a time in ISO 8601
  /// (`2026-01-15T09:00:00Z`, fractional seconds and offsets allowed).
  package init(parsing text: String) throws(ToolError) {
    let bad = ToolError(
      .badFlags,
      "--since takes a duration back from now (2h, 7d, 90m) or an ISO 8601 time (2026-01-15T09:00:00Z), not '\(text)'"
    )
    if text.contains("-") || text.contains("T") || text.contains(":") {
      for options in [
        ISO8601DateFormatter.Options.withInternetDateTime, [.withInternetDateTime, .withFractionalSeconds],
      ] {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = options
        if let date = formatter.date(from: text) {
          self = .at(Int64((date.timeIntervalSince1970 * 1000).rounded(.down)))
          return
        }
      }
      throw bad
    }
    do {
      self = .ago(try parseDuration(text, flag: "--since"))
    } catch {
      throw bad
    }
  }

  /// Unix milliseconds, a relative time counted back from `now`.
  package func milliseconds(now: Int64) -> Int64 {
    switch self {
    case .at(let ms): return ms
    case .ago(let back):
      let (start, overflow) = now.subtractingReportingOverflow(back)
      return overflow ? .min : start
    }
  }
}

/// Reads `--since` (see ``PointInTime``) and places it against `now`. Returns Unix milliseconds.
package func parseSince(_ text: String, now: Int64) throws(ToolError) -> Int64 {
  try PointInTime(parsing: text).milliseconds(now: now)
}

/// A time for people: ISO 8601 with how far it is from `now` ("2026-01-15T09:00:00.000Z, in 5m 0s",
/// "…, 2h 3m ago").
func relativeTime(_ ms: Int64, now: Int64) -> String {
  let iso = isoTime(ms)
  if ms == now { return iso + ", now" }
  let (difference, overflow) = ms.subtractingReportingOverflow(now)
  if overflow { return iso }
  return difference > 0
    ? "\(iso), in \(humanDuration(difference))"
    : "\(iso), \(humanDuration(Int64(clamping: difference.magnitude))) ago"
}

private func saturating(_ value: Int64, _ scale: Int64) -> Int64 {
  let (product, overflow) = value.multipliedReportingOverflow(by: scale)
  return overflow ? .max : product
}

extension Character {
  fileprivate var isASCIIDigit: Bool { isASCII && isNumber }
}
