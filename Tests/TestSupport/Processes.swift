import Foundation

/// Polls `condition` every 2 ms for up to a minute; false when it never held.
public func pollUntil(_ condition: () -> Bool) async throws -> Bool {
  let start = ContinuousClock.now
  while !condition() {
    if ContinuousClock.now - start > .seconds(60) { return false }
    try await Task.sleep(for: .milliseconds(2))
  }
  return true
}

/// Whether the process is stopped (by a signal, such as a crash point armed with
/// `FERRY_CRASH_SIGNAL=STOP`), as `/proc` says.
public func isStopped(_ pid: Int32) -> Bool {
  guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return false }
  return status.split(separator: "\n").contains { $0.hasPrefix("State:") && $0.contains("T") }
}
