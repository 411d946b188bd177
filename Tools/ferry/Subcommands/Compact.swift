import ArgumentParser
import FerryTools

struct Compact: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract:
      "Snapshot a store and remove the events its retention policy allows; --copy also shrinks the file.",
    discussion: """
      Removes the events of tasks finished longer ago than --retention, and old cache fetches, in one \
      transaction with a snapshot of both sides. With --copy, writes a compacted copy of the file and swaps it \
      in (only when no other process has the store open).

      Example: ferry compact /tmp/groceries --retention 0 --copy
      """)

  @OptionGroup var store: StoreArgument

  @Option(
    help:
      "How long to keep the events of finished tasks: a duration such as 7d, 36h, 90m, 45s, 1h30m or plain seconds."
  )
  var retention = TimeSpan(7 * 86_400_000, written: "7d")

  @Flag(help: "Then write a compacted copy of the file and swap it in, to give freed space back.")
  var copy = false

  @Flag(help: "Print one JSON object (keys: removed, remaining, snapshotSequence, dataFileBytesAfter, …).")
  var json = false

  func run() async throws {
    try await perform { () async throws(ToolError) -> ExitStatus in
      try await compact(
        path: store.dir, retentionMs: retention.milliseconds, copy: copy, json: json, output: .standard)
      return .ok
    }
  }
}
