import ArgumentParser
import FerryTools

struct Import: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract:
      "Read an export from standard input into a new store (the directory must be missing or empty).",
    discussion:
      "The store gets the same events under the same sequence numbers. It is built beside the directory and "
      + "renamed onto it once complete, so nothing else writes to it meanwhile and an import that fails or is "
      + "killed leaves no store there (a killed import's temporary directory is removed by the next import). "
      + "A file or non-empty directory is refused before anything is written (status 4, 8); if another process "
      + "creates a store there while the import runs, the import leaves it alone and exits 7."
      + "\n\nExample: ferry import /tmp/copy < groceries.jsonl && ferry verify /tmp/copy"
  )

  @OptionGroup var store: StoreArgument
  @Flag(help: "Print one JSON object (keys: imported, store).") var json = false

  func run() async throws {
    try await perform { () async throws(ToolError) -> ExitStatus in
      let lines = AnyIterator { readLine(strippingNewline: true) }
      let quiet = Output(line: { _ in }, progress: Output.standard.progress)
      let count = try await importLog(path: store.dir, lines: lines, output: json ? quiet : .standard)
      if json {
        Output.standard.line(importedJSON(count: count, store: store.dir))
      } else {
        Output.standard.line("imported \(count) events into \(store.dir)")
      }
      return .ok
    }
  }
}
