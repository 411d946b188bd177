import ArgumentParser
import FerryTools

struct Recover: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract:
      "Replay the commits a dead writer left in a store's write-ahead segment, so that it reads again.",
    discussion: """
      A store with a write-ahead segment whose writer was killed, or whose machine lost power, holds \
      commits that only a read-write open can replay: until then every read command exits 7 ("needs \
      recovery"). This opens it read-write once, when that is so, and keeps its segment. A settled store \
      is only read.

      Example: ferry recover /tmp/groceries
      """)

  @OptionGroup var store: StoreArgument

  @Flag(help: "Print one JSON object (keys: recovered, head, writeAheadSegment).")
  var json = false

  func run() async throws {
    try await perform { () async throws(ToolError) -> ExitStatus in
      try await recover(path: store.dir, json: json, output: .standard)
      return .ok
    }
  }
}
