import ArgumentParser
import FerryTools
import Foundation

struct Salvage: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract: "Build a new, verified store from the valid records a damaged store's data file still holds.",
    discussion: """
      Reads every page of DIR/data.mdb with plain reads (never through LMDB, so no damage can crash it) and \
      keeps each record whose CRC checks out; LMDB's live tree is read too, in a child process, to decide \
      between copies and to know which events compaction removed (those never come back). OUT, which must be \
      missing or empty, gets the recovered events under their original sequence numbers, ids and timestamps, \
      and a ferry.lost marker at each sequence that was lost. The report says what was recovered and what \
      was lost. DIR is only read.

      Exits 0 when every event up to the highest sequence seen was recovered, 1 when some were lost, 3 or 4 \
      when DIR holds no store, 6 when it holds no valid record, 8 when OUT is not a missing or empty directory.

      Example: ferry salvage /tmp/damaged /tmp/rescued && ferry verify /tmp/rescued
      """)

  @Argument(help: "The damaged store's directory (only read).")
  var dir: String

  @Argument(help: "Where to build the new store: a missing or empty directory.")
  var out: String?

  @Flag(help: "Print the report as one JSON object.")
  var json = false

  @Flag(help: .hidden)
  var treeDump = false

  @Option(help: .hidden)
  var through: UInt64 = 0

  @Option(help: .hidden)
  var from: UInt64 = 1

  @Option(help: .hidden)
  var careful: UInt64 = 0

  func validate() throws {
    if !treeDump && out == nil { throw ValidationError("Missing expected argument '<out>'") }
  }

  func run() async throws {
    if treeDump {
      // The child that reads LMDB's live tree for a parent salvage (it may crash; the parent copes).
      dumpLiveTree(path: dir, through: through, from: from, careful: careful)
      return
    }
    try await perform { () async throws(ToolError) -> ExitStatus in
      let executable = Bundle.main.executableURL ?? URL(fileURLWithPath: CommandLine.arguments[0])
      return try await runSalvage(
        source: dir, target: out ?? "", json: json, treeReader: executable, output: .standard)
    }
  }
}
