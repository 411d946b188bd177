import ArgumentParser
import FerryTools

struct Inspect: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract: "Show the pending queue, groups, errors and cache ages of a store.",
    discussion: "Example: ferry inspect /tmp/groceries --max-age 3600 --json")

  @OptionGroup var store: StoreArgument

  @Flag(help: "Print stable JSON instead of tables.")
  var json = false

  @Option(help: "The max age in seconds that cache ages are judged by.")
  var maxAge: Int64 = 3600

  func validate() throws {
    guard maxAge >= 0 else { throw ValidationError("--max-age must not be negative") }
  }

  func run() async throws {
    try await performContained(store: store.dir) { () throws(ToolError) -> ExitStatus in
      try inspect(path: store.dir, json: json, maxAgeMs: milliseconds(seconds: maxAge), output: .standard)
      return .ok
    }
  }
}
