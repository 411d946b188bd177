import ArgumentParser
import FerryTools

struct Inspect: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract: "Show the pending queue, groups, errors and cache ages of a store.",
    discussion: "Example: ferry inspect /tmp/groceries --max-age 3600 --json")

  @OptionGroup var store: StoreArgument

  @Flag(help: "Print stable JSON instead of tables.")
  var json = false

  @Option(help: "The max age that cache ages are judged by: 1h, 90m, 7d, 45s or plain seconds.")
  var maxAge: String = "1h"

  func validate() throws {
    _ = try durationFlag(maxAge, "--max-age")
  }

  func run() async throws {
    try await performContained(store: store.dir) { () throws(ToolError) -> ExitStatus in
      try inspect(path: store.dir, json: json, maxAgeMs: (try? durationFlag(maxAge, "--max-age")) ?? 3_600_000, output: .standard)
      return .ok
    }
  }
}
