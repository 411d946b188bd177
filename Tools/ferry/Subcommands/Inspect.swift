import ArgumentParser
import FerryTools

struct Inspect: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract: "Show the pending queue, groups, errors and cache ages of a store.",
    discussion: "Example: ferry inspect /tmp/groceries --max-age 3600 --json")

  @OptionGroup var store: StoreArgument

  @Flag(help: "Print stable JSON instead of tables.")
  var json = false

  @Option(
    help:
      "The max age that cache ages are judged by: a duration such as 1h, 90m, 7d, 45s, 1h30m or plain seconds."
  )
  var maxAge = TimeSpan(3_600_000, written: "1h")

  func run() async throws {
    try await performContained(store: store.dir) { () throws(ToolError) -> ExitStatus in
      try inspect(path: store.dir, json: json, maxAgeMs: maxAge.milliseconds, output: .standard)
      return .ok
    }
  }
}
