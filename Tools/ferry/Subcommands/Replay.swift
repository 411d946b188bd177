import ArgumentParser
import FerryTools

struct Replay: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract:
      "Rebuild a store's state from its log: as of a sequence, or compared with the stored projections.",
    discussion: """
      With --until SEQ: the state as it was right after event SEQ (time travel). Without: a rebuild of every \
      projection compared row by row with what is stored; exits 1 when they differ.

      Example: ferry replay /tmp/groceries --until 12
      """)

  @OptionGroup var store: StoreArgument
  @Option(help: "Show the state as of this sequence number.") var until: UInt64?
  @Flag(help: "Print JSON.") var json = false
  @Option(
    help:
      "The max age that cache ages are judged by: a duration such as 1h, 90m, 7d, 45s, 1h30m or plain seconds."
  )
  var maxAge = TimeSpan(3_600_000, written: "1h")

  func run() async throws {
    try await performContained(store: store.dir) { () throws(ToolError) -> ExitStatus in
      try replay(
        path: store.dir, until: until, json: json, maxAgeMs: maxAge.milliseconds, output: .standard)
        ? .ok : .problemsFound
    }
  }
}
