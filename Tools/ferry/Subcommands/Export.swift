import ArgumentParser
import FerryTools

struct Export: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract: "Write a store's log as JSON Lines (a header, then one event per line).",
    discussion: "Example: ferry export /tmp/groceries > groceries.jsonl")

  @OptionGroup var store: StoreArgument

  func run() async throws {
    try await performContained(store: store.dir) { () throws(ToolError) -> ExitStatus in
      try export(path: store.dir, output: .standard)
      return .ok
    }
  }
}
