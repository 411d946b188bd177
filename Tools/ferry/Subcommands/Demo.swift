import ArgumentParser
import FerryTools

struct Demo: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract: "Tell an offline-first grocery-list story on a fresh store.",
    discussion: """
      The phone is offline, then the connection is flaky, then back; one item needs the user to fix it; \
      grouped items keep their order; two caches are fetched and one goes stale. The clock is simulated and \
      the flakiness seeded: a seed always tells the same story. The store is left for the other commands.

      Example: ferry demo --seed 7 --dir /tmp/groceries && ferry inspect /tmp/groceries
      """)

  @Option(help: "The directory for the store (a new temporary one by default).")
  var dir: String?

  @Option(help: "The seed of the simulated server's flakiness.")
  var seed: UInt64 = 42

  func run() async throws {
    try await perform { () async throws(ToolError) -> ExitStatus in
      let (path, _) = try await runDemo(path: dir, seed: seed, output: .standard)
      Output.standard.line("")
      Output.standard.line("the store is at \(path): try `ferry inspect \(path)` or `ferry log \(path)`")
      return .ok
    }
  }
}
