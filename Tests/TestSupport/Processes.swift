import Foundation

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Polls `condition` every 2 ms until it holds. No wall-clock give-up: a loaded machine may take
/// long, and a condition that never holds is ended by the test's time limit (cancellation ends
/// the sleep). Callers waiting on another process put its liveness in the condition.
public func pollUntil(_ condition: () -> Bool) async throws {
  while !condition() {
    try await Task.sleep(for: .milliseconds(2))
  }
}

/// What the kernel says of a process: `/proc` on Linux, `sysctl(KERN_PROC)` on Apple platforms.
public struct ProcessRecord: Sendable, Equatable {
  /// The parent's pid.
  public let parent: Int32
  /// Stopped by a signal (`SIGSTOP`, say).
  public let isStopped: Bool
  /// Ended, not yet reaped.
  public let isZombie: Bool

  /// The record of `pid`; nil when there is no such process (or, on a platform this has no reader
  /// for, always — see ``canReadProcesses``).
  public static func of(_ pid: Int32) -> ProcessRecord? {
    #if os(Linux)
      // `pid (comm) S ppid …`: the name may hold spaces and parentheses, so fields count from the last ')'.
      guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let close = stat.lastIndex(of: ")")
      else { return nil }
      let fields = stat[stat.index(after: close)...].split(separator: " ")
      guard fields.count > 2, let parent = Int32(fields[1]) else { return nil }
      return ProcessRecord(parent: parent, isStopped: fields[0] == "T", isZombie: fields[0] == "Z")
    #elseif canImport(Darwin)
      var mib: [Int32] = [CTL_KERN, KERN_PROC, KERN_PROC_PID, pid]
      var info = kinfo_proc()
      var size = MemoryLayout<kinfo_proc>.stride
      guard sysctl(&mib, UInt32(mib.count), &info, &size, nil, 0) == 0, size > 0 else { return nil }
      return ProcessRecord(info)
    #else
      return nil
    #endif
  }

  #if canImport(Darwin)
    /// `p_stat` of `<sys/proc.h>`: `SSTOP` is 4, `SZOMB` 5.
    init(_ info: kinfo_proc) {
      parent = info.kp_eproc.e_ppid
      isStopped = info.kp_proc.p_stat == 4
      isZombie = info.kp_proc.p_stat == 5
    }
  #endif
}

/// Whether this platform has a reader for ``ProcessRecord`` (Linux, Apple platforms): tests that
/// need one are enabled only where it has, never answered wrongly.
public let canReadProcesses: Bool = {
  #if os(Linux) || canImport(Darwin)
    return ProcessRecord.of(getpid()) != nil
  #else
    return false
  #endif
}()

/// Whether the process is stopped (by a signal, such as a crash point armed with
/// `FERRY_CRASH_SIGNAL=STOP`).
public func isStopped(_ pid: Int32) -> Bool { ProcessRecord.of(pid)?.isStopped ?? false }

/// Whether a process has ended: no such process, or a zombie nobody has reaped yet (whoever
/// inherited it — in a container, not always a process that reaps).
public func isGone(_ pid: Int32) -> Bool {
  if kill(pid, 0) != 0 && errno == ESRCH { return true }
  guard let record = ProcessRecord.of(pid) else { return canReadProcesses }
  return record.isZombie
}

/// The pids of the children of `parent`.
public func children(of parent: Int32) -> [Int32] {
  #if os(Linux)
    let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
    return entries.compactMap { entry in
      guard let pid = Int32(entry), ProcessRecord.of(pid)?.parent == parent else { return nil }
      return pid
    }
  #elseif canImport(Darwin)
    var mib: [Int32] = [CTL_KERN, KERN_PROC, KERN_PROC_ALL, 0]
    var size = 0
    guard sysctl(&mib, UInt32(mib.count), nil, &size, nil, 0) == 0, size > 0 else { return [] }
    // Room for processes started between the two calls.
    var table = [kinfo_proc](repeating: kinfo_proc(), count: size / MemoryLayout<kinfo_proc>.stride + 16)
    size = table.count * MemoryLayout<kinfo_proc>.stride
    guard sysctl(&mib, UInt32(mib.count), &table, &size, nil, 0) == 0 else { return [] }
    return table.prefix(size / MemoryLayout<kinfo_proc>.stride)
      .filter { $0.kp_eproc.e_ppid == parent }
      .map { $0.kp_proc.p_pid }
  #else
    return []
  #endif
}

/// What a process runs, to tell one of ours from a stranger that got its pid: its command line
/// on Linux, its executable's name (up to 16 bytes) on Apple platforms; nil when unknown.
public func processCommand(_ pid: Int32) -> String? {
  #if os(Linux)
    return try? String(contentsOfFile: "/proc/\(pid)/cmdline", encoding: .utf8)
  #elseif canImport(Darwin)
    var mib: [Int32] = [CTL_KERN, KERN_PROC, KERN_PROC_PID, pid]
    var info = kinfo_proc()
    var size = MemoryLayout<kinfo_proc>.stride
    guard sysctl(&mib, UInt32(mib.count), &info, &size, nil, 0) == 0, size > 0 else { return nil }
    return withUnsafeBytes(of: info.kp_proc.p_comm) { raw in
      String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
    }
  #else
    return nil
  #endif
}

/// The whole text of a file of `/proc` (nil when it cannot be read). Foundation's
/// `String(contentsOfFile:)` reads a `/proc` file, whose size says 0, only up to its first page
/// (4 KB): `/proc/locks` on a machine running many tests is longer, and lines past it were missed.
public func procText(_ path: String) -> String? {
  guard let handle = FileHandle(forReadingAtPath: path) else { return nil }
  defer { try? handle.close() }
  guard let data = try? handle.readToEnd() else { return nil }
  return String(decoding: data, as: UTF8.self)
}
