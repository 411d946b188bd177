import ArgumentParser
import FerryTools

@main
struct FerryCommand: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    commandName: "ferry",
    abstract:
      "Run the demo; inspect, replay, verify, export and import Ferry stores; cancel, revive, resolve, forget, pause and resume.",
    discussion: """
      Read-only commands never write to the store and work while an app writes to it. They read it in a \
      child process of their own: if reading a damaged store crashes, ferry says the store is damaged \
      (status 6) instead of dying by a signal.
      """,
    version: "0.1.0",
    subcommands: [
      Demo.self, Inspect.self, Log.self, Replay.self, Verify.self, Export.self, Import.self, Stats.self,
      Compact.self, Recover.self, Salvage.self, Cancel.self, Revive.self, Resolve.self, Forget.self,
      Pause.self, Resume.self,
    ]
  )
}

/// The store directory every subcommand but `demo` takes.
struct StoreArgument: ParsableArguments {
  @Argument(help: "The store directory.")
  var dir: String
}

/// Runs a command's work, printing a failure as one line on standard error with its exit status.
func perform(_ work: () async throws(ToolError) -> ExitStatus) async throws {
  do {
    let status = try await work()
    if status != .ok { throw ExitCode(status.rawValue) }
  } catch let error as ToolError {
    FileHandleStandardError.write("ferry: \(terminalSafe(error.message))\n")
    throw ExitCode(error.status.rawValue)
  }
}

/// Runs the work of a command that reads a possibly damaged store in a child process
/// (``Containment``): a crash while reading is reported as a damaged store (status 6), never as a
/// signal. In the child, runs it as ``perform(_:)`` does.
func performContained(store: String, _ work: () async throws(ToolError) -> ExitStatus) async throws {
  if Containment.isContainedChild {
    Containment.watchParent()
    try await perform(work)
    return
  }
  let status = Containment.runInChild(store: store)
  if status != 0 { throw ExitCode(status) }
}
