import ArgumentParser
import FerryTools

struct Stats: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract: "Count a store's events by type and show its file and map sizes.",
    discussion: "Example: ferry stats /tmp/groceries")

  @OptionGroup var store: StoreArgument
  @Flag(help: "Print one JSON object (keys: events, head, types, dataFileBytes, oldest, newest, …).")
  var json = false

  func run() async throws {
    try await performContained(store: store.dir) { () throws(ToolError) -> ExitStatus in
      try stats(path: store.dir, json: json, output: .standard)
      return .ok
    }
  }
}
