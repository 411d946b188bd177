import ArgumentParser
import FerryLog
import Foundation

/// A smoke run of the storage engine on a real store: concurrent appends, a projection,
/// a verify against a rebuild, a reopen. The full offline-first demo grows from it.
struct Demo: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract: "Run a small smoke run of the event-log engine on a fresh store.",
    discussion: "Example: ferry demo --events 2000 --callers 32")

  @Option(help: "The store directory to create (default: a new temporary directory).")
  var dir: String?

  @Option(help: "Events each phase appends.")
  var events: Int = 2000

  @Option(help: "Concurrent callers in the group-commit phase.")
  var callers: Int = 32

  func validate() throws {
    guard events > 0 else { throw ValidationError("--events must be positive") }
    guard callers > 0 else { throw ValidationError("--callers must be positive") }
  }

  func run() async throws {
    let path =
      dir ?? FileManager.default.temporaryDirectory.path
      + "/ferry-demo-\(ProcessInfo.processInfo.processIdentifier)"
    let report = try await SmokeRun(path: path, events: events, callers: callers).run { line in print(line) }
    print("store left at \(path)")
    if !report { throw ExitCode(1) }
  }
}
