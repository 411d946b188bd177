import ArgumentParser
import FerryTools

struct Import: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract: "Read an export from standard input into an empty store (created if missing).",
    discussion:
      "The store gets the same events under the same sequence numbers.\n\nExample: ferry import /tmp/copy < groceries.jsonl && ferry verify /tmp/copy"
  )

  @OptionGroup var store: StoreArgument

  func run() async throws {
    try await perform { () async throws(ToolError) -> ExitStatus in
      let lines = AnyIterator { readLine(strippingNewline: true) }
      let count = try await importLog(path: store.dir, lines: lines, output: .standard)
      Output.standard.line("imported \(count) events into \(store.dir)")
      return .ok
    }
  }
}
