// What every mode shares: its arguments, how it speaks to the parent, how it opens a store.
@_spi(Engine) @_spi(Experimental) import Ferry
import FerryLog
import Foundation
import Synchronization

/// A directory that lists this process's open descriptors (Apple platforms have no /proc).
#if canImport(Glibc)
  let openDescriptorsDirectory = "/proc/self/fd"
#else
  let openDescriptorsDirectory = "/dev/fd"
#endif

/// The resource `getrlimit` names the open-descriptor limit by: an enum case on Linux, a plain
/// number on Apple platforms.
#if canImport(Glibc)
  let openFilesLimit = Int32(RLIMIT_NOFILE.rawValue)
#else
  let openFilesLimit = RLIMIT_NOFILE
#endif

/// One mode: its usage line (after the mode's name) and what it does.
struct Mode: Sendable {
  let usage: String
  let run: @Sendable (Invocation) -> Void
}

/// The worker's command line past its mode: `directory` and the words after it.
struct Invocation: Sendable {
  let mode: String
  let usage: String
  let directory: String
  /// The words after the directory.
  let words: [String]

  /// Refuses the invocation unless it has between `range` words after the directory.
  func expect(_ range: ClosedRange<Int>) {
    if !range.contains(words.count) { usageError() }
  }

  /// Word `index` (0: the first after the directory) as a number; refuses the invocation when it
  /// is missing or not one.
  func number<N: LosslessStringConvertible>(_ index: Int, as type: N.Type = Int.self) -> N {
    guard index < words.count, let value = N(words[index]) else { usageError() }
    return value
  }

  /// Word `index`, or nil when there are not that many.
  func word(_ index: Int) -> String? { index < words.count ? words[index] : nil }

  /// Whether word `index` is `flag`; refuses the invocation when it is another word.
  func flag(_ index: Int, _ flag: String) -> Bool {
    guard let word = word(index) else { return false }
    if word != flag { usageError() }
    return true
  }

  func usageError() -> Never { fail("\(mode) \(usage)") }

  /// Runs `body` on a task and waits for it: the modes' work is async, the worker's top level is not.
  /// A throw ends the process (status 2) saying "MODE failed: ERROR", after saying "failed ERROR"
  /// on standard output too when `announce` is set (for parents that read only that).
  func runAsync(announce: Bool = false, _ body: @escaping @Sendable () async throws -> Void) {
    let done = DispatchSemaphore(value: 0)
    let mode = mode
    Task.detached {
      do {
        try await body()
      } catch {
        if announce { say("failed \(error)") }
        fail("\(mode) failed: \(error)")
      }
      done.signal()
    }
    done.wait()
  }
}

/// Writes a line straight to file descriptor 1 (no buffering), so the parent sees it even if this
/// process is killed right after.
func say(_ line: String) {
  FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

func fail(_ message: String) -> Never {
  FileHandle.standardError.write(Data((message + "\n").utf8))
  exit(2)
}

/// A store configuration: `existing` never creates one, `segment` asks for the write-ahead
/// segment, `chunk` sets the rebuild chunk size.
func storeConfiguration(
  existing: Bool = false, segment: Bool = false, chunk: Int? = nil
) -> FerryStore.Configuration {
  var configuration = FerryStore.Configuration()
  configuration.createIfMissing = !existing
  configuration.writeAheadSegment = segment
  if let chunk { configuration.rebuildChunkSize = chunk }
  return configuration
}

/// Set once standard input has given a line that `matches` (any line by default) or has ended:
/// the modes that work until told to stop check it between rounds.
final class StopLine: Sendable {
  private let seen = Mutex(false)

  init(until matches: @escaping @Sendable (String) -> Bool = { _ in true }) {
    Thread.detachNewThread { [self] in
      while let line = readLine(), !matches(line) {}
      self.seen.withLock { $0 = true }
    }
  }

  var hasCome: Bool { seen.withLock { $0 } }
}

/// Runs passes until three in a row ran nothing while `workLeft` said no: tasks of a tag this
/// process has no handler for stay runnable for ever and must not keep the loop spinning.
func runUntilIdle(_ runner: TaskRunner, workLeft: () throws -> Bool) async throws {
  var idle = 0
  while idle < 3 {
    let report = try await runner.run()
    let ranSomething = report.entries.contains { entry in
      if case .skipped = entry.outcome { return false } else { return true }
    }
    idle = try ranSomething || workLeft() ? 0 : idle + 1
  }
}

/// Whether a read was refused because its projection is not current: the engine's error, or
/// Ferry's for the same refusal.
func isNotCurrent(_ error: any Error) -> Bool {
  if case FerryLogError.projectionNotCurrent = error { return true }
  if case FerryError.notCurrent = error { return true }
  return false
}
