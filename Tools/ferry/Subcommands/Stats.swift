import ArgumentParser
import FerryTools

struct Stats: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract: "Count a store's events by type and show its file and map sizes.",
    discussion: "Example: ferry stats /tmp/groceries")

  @OptionGroup var store: StoreArgument

  func run() async throws {
    try await performContained(store: store.dir) { () throws(ToolError) -> ExitStatus in
      try stats(path: store.dir, output: .standard)
      return .ok
    }
  }
}
