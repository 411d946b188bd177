import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Where a command writes: lines to standard output, and a progress line that only a terminal sees.
package struct Output: Sendable {
  /// Writes one line of the command's output.
  package let line: @Sendable (String) -> Void
  /// Shows progress (done of total) when standard error is a terminal; nothing otherwise.
  package let progress: @Sendable (_ label: String, _ done: Int, _ total: Int) -> Void

  /// An output with its own sinks (tests collect lines this way).
  package init(
    line: @escaping @Sendable (String) -> Void,
    progress: @escaping @Sendable (String, Int, Int) -> Void = { _, _, _ in }
  ) {
    self.line = line
    self.progress = progress
  }

  /// The same lines without progress: a command printing JSON draws no bar, even on a terminal.
  package var withoutProgress: Output { Output(line: line) }

  /// Standard output, with a progress bar on standard error when it is a terminal. Every line goes
  /// through ``terminalSafe(_:)``: whatever a store holds (a tag, a message, a key) cannot forge a
  /// line or drive the terminal.
  package static let standard = Output(
    line: { text in FileHandle.standardOutput.write(Data((terminalSafe(text) + "\n").utf8)) },
    progress: { label, done, total in
      guard isatty(2) != 0, total > 0 else { return }
      let width = 30
      let filled = min(width, done * width / max(total, 1))
      let bar = String(repeating: "#", count: filled) + String(repeating: " ", count: width - filled)
      let end = done >= total ? "\n" : ""
      FileHandle.standardError.write(Data("\r\(label) [\(bar)] \(done)/\(total)\(end)".utf8))
    })
}

/// `text` with every character that could forge a line or drive a terminal written as a visible
/// escape: `\n`, `\r`, `\t`, and `\u001B` style for the other C0 controls, NUL, DEL, the C1 controls,
/// the line and paragraph separators and the bidirectional overrides (which reorder what is shown).
///
/// The escapes are JSON's, and a JSON line passes through unchanged in meaning: `JSONEncoder`
/// already escapes C0 controls, and DEL or a C1 control inside a JSON string becomes the `\u`
/// escape JSON reads back as the same character. A backslash is left as it is, so a string that
/// holds a backslash and an `n` looks like an escaped newline; what cannot happen is a real one.
package func terminalSafe(_ text: String) -> String {
  // The fast path: no byte that can begin one of those characters (C1 and U+061C begin with
  // 0xC2 or 0xD8, the separators and bidi controls with 0xE2).
  guard text.utf8.contains(where: { $0 < 0x20 || $0 == 0x7F || $0 == 0xC2 || $0 == 0xD8 || $0 == 0xE2 })
  else { return text }
  var out = String.UnicodeScalarView()
  for scalar in text.unicodeScalars {
    switch scalar.value {
    case 0x0A: out.append(contentsOf: #"\n"#.unicodeScalars)
    case 0x0D: out.append(contentsOf: #"\r"#.unicodeScalars)
    case 0x09: out.append(contentsOf: #"\t"#.unicodeScalars)
    case 0x00...0x1F, 0x7F...0x9F, 0x061C, 0x200E, 0x200F, 0x2028...0x202E, 0x2066...0x2069:
      let hex = String(scalar.value, radix: 16, uppercase: true)
      out.append(contentsOf: ("\\u" + String(repeating: "0", count: 4 - hex.count) + hex).unicodeScalars)
    default: out.append(scalar)
    }
  }
  return String(out)
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
