import ArgumentParser
import FerryTools

@main
struct FerryCommand: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    commandName: "ferry",
    abstract: "Run the demo, and inspect, replay, verify, export and import Ferry stores.",
    discussion: "Read-only commands never write to the store and work while an app writes to it.",
    version: "0.1.0",
    subcommands: [
      Demo.self, Inspect.self, Log.self, Replay.self, Verify.self, Export.self, Import.self, Stats.self,
      Compact.self, Salvage.self,
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
    FileHandleStandardError.write("ferry: \(error.message)\n")
    throw ExitCode(error.status.rawValue)
  }
}
