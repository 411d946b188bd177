import ArgumentParser

@main
struct FerryCommand: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    commandName: "ferry",
    abstract: "Inspect, verify and demonstrate Ferry stores.",
    version: "0.1.0",
    subcommands: [Demo.self, Verify.self]
  )
}
