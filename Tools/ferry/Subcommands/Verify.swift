import ArgumentParser
import FerryTools

struct Verify: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract: "Check every record's CRC, sequence contiguity and the projections against a rebuild.",
    discussion:
      "Exits 1 and names the first bad sequence number when anything is wrong.\n\nExample: ferry verify /tmp/groceries"
  )

  @OptionGroup var store: StoreArgument
  @Flag(help: "Print one JSON object (keys: healthy, head, recordsChecked, rowsCompared, problems, …).")
  var json = false

  func run() async throws {
    try await performContained(store: store.dir) { () throws(ToolError) -> ExitStatus in
      try verify(path: store.dir, json: json, output: .standard) ? .ok : .problemsFound
    }
  }
}
