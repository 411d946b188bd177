import Foundation

#if canImport(Glibc)
  import Glibc
#endif

/// Seconds a piece of async work takes, on the monotonic clock.
func seconds(_ work: () async throws -> Void) async rethrows -> Double {
  let start = ContinuousClock.now
  try await work()
  let elapsed = ContinuousClock.now - start
  return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
}

/// The median of some figures.
func median(_ values: [Double]) -> Double {
  let sorted = values.sorted()
  guard !sorted.isEmpty else { return 0 }
  return sorted.count % 2 == 1
    ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
}

/// The p-th percentile (0...100) of some figures.
func percentile(_ values: [Double], _ p: Double) -> Double {
  let sorted = values.sorted()
  guard !sorted.isEmpty else { return 0 }
  let index = min(sorted.count - 1, max(0, Int((p / 100 * Double(sorted.count)).rounded(.up)) - 1))
  return sorted[index]
}

/// Resets the kernel's peak-RSS mark for this process (Linux: write 5 to clear_refs).
func resetPeakMemory() {
  try? "5".write(toFile: "/proc/self/clear_refs", atomically: false, encoding: .utf8)
}

/// The peak resident set size since the last reset, in bytes (Linux VmHWM; 0 elsewhere).
func peakMemory() -> Int {
  guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
  for line in status.split(separator: "\n") where line.hasPrefix("VmHWM:") {
    let kb = line.split(separator: " ").compactMap { Int($0) }.first ?? 0
    return kb * 1024
  }
  return 0
}

/// A fresh temporary directory path (not created).
func scratchPath(_ label: String) -> String {
  FileManager.default.temporaryDirectory.path + "/ferry-bench-\(label)-\(UUID().uuidString.prefix(8))"
}

func remove(_ path: String) { try? FileManager.default.removeItem(atPath: path) }

/// This machine in one line.
func machineDescription() -> String {
  var info = utsname()
  uname(&info)
  let machine = withUnsafeBytes(of: &info.machine) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
  let release = withUnsafeBytes(of: &info.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
  let memory = ProcessInfo.processInfo.physicalMemory / (1 << 30)
  var model = "unknown CPU"
  if let cpu = try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8),
    let line = cpu.split(separator: "\n").first(where: { $0.hasPrefix("model name") })
  {
    model =
      line.split(separator: ":", maxSplits: 1).last.map { $0.trimmingCharacters(in: .whitespaces) } ?? model
  }
  return
    "\(machine), \(ProcessInfo.processInfo.activeProcessorCount) cores (\(model)), \(memory) GiB, Linux \(release)"
}

/// Samples this process's anonymous resident memory (heap and stacks, not the mapped store file)
/// every 2 ms on a thread of its own, keeping the peak, until `stop()`.
final class AnonymousMemorySampler: @unchecked Sendable {
  // Why @unchecked: `peak` and `running` are only touched with `lock` held.
  private let lock = NSLock()
  private var peak = 0
  private var running = true
  private let finished = DispatchSemaphore(value: 0)

  init() {
    Thread.detachNewThread { [self] in
      while lock.withLock({ running }) {
        let now = anonymousMemory()
        lock.withLock { peak = max(peak, now) }
        usleep(2000)
      }
      finished.signal()
    }
  }

  /// Stops sampling and returns the peak in bytes.
  func stop() -> Int {
    lock.withLock { running = false }
    finished.wait()
    return max(lock.withLock { peak }, anonymousMemory())
  }
}

/// Anonymous resident memory now (Linux RssAnon), in bytes.
func anonymousMemory() -> Int {
  guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
  for line in status.split(separator: "\n") where line.hasPrefix("RssAnon:") {
    return (line.split(separator: " ").compactMap { Int($0) }.first ?? 0) * 1024
  }
  return 0
}

#if os(Linux)
  /// glibc's `malloc_trim` (not in Swift's Glibc module).
  @_silgen_name("malloc_trim") private func mallocTrim(_ pad: Int) -> Int32
#endif

/// Gives the heap's freed memory back to the system (glibc's `malloc_trim`; nothing elsewhere).
func returnFreedHeap() {
  #if os(Linux)
    _ = mallocTrim(0)
  #endif
}
