import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Where a command writes: lines to standard output, and a progress line that only a terminal sees.
public struct Output: Sendable {
  /// Writes one line of the command's output.
  public let line: @Sendable (String) -> Void
  /// Shows progress (done of total) when standard error is a terminal; nothing otherwise.
  public let progress: @Sendable (_ label: String, _ done: Int, _ total: Int) -> Void

  /// An output with its own sinks (tests collect lines this way).
  public init(
    line: @escaping @Sendable (String) -> Void,
    progress: @escaping @Sendable (String, Int, Int) -> Void = { _, _, _ in }
  ) {
    self.line = line
    self.progress = progress
  }

  /// Standard output, with a progress bar on standard error when it is a terminal.
  public static let standard = Output(
    line: { text in FileHandle.standardOutput.write(Data((text + "\n").utf8)) },
    progress: { label, done, total in
      guard isatty(2) != 0, total > 0 else { return }
      let width = 30
      let filled = min(width, done * width / max(total, 1))
      let bar = String(repeating: "#", count: filled) + String(repeating: " ", count: width - filled)
      let end = done >= total ? "\n" : ""
      FileHandle.standardError.write(Data("\r\(label) [\(bar)] \(done)/\(total)\(end)".utf8))
    })
}

/// Pads or cuts text to a column width.
func column(_ text: String, _ width: Int) -> String {
  if text.count >= width { return String(text.prefix(max(0, width - 1))) + " " }
  return text + String(repeating: " ", count: width - text.count)
}

/// A Unix-millisecond time as UTC ISO 8601.
func isoTime(_ ms: Int64) -> String {
  let date = Date(timeIntervalSince1970: Double(ms) / 1000)
  let formatter = ISO8601DateFormatter()
  formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
  formatter.timeZone = TimeZone(identifier: "UTC")
  return formatter.string(from: date)
}

/// A duration in milliseconds, for people: 950ms, 12.5s, 3m 20s, 2h 5m, 3d 4h.
func humanDuration(_ ms: Int64) -> String {
  let ms = max(0, ms)
  if ms < 1000 { return "\(ms)ms" }
  let seconds = ms / 1000
  if seconds < 60 { return String(format: "%.1fs", Double(ms) / 1000) }
  if seconds < 3600 { return "\(seconds / 60)m \(seconds % 60)s" }
  if seconds < 86_400 { return "\(seconds / 3600)h \((seconds % 3600) / 60)m" }
  return "\(seconds / 86_400)d \((seconds % 86_400) / 3600)h"
}

/// Encodes a value as stable JSON (sorted keys), one line.
func jsonLine<T: Encodable>(_ value: T) -> String {
  let encoder = JSONEncoder()
  encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
  guard let data = try? encoder.encode(value) else { return "{}" }
  return String(decoding: data, as: UTF8.self)
}
