import ArgumentParser
import Ferry
import FerryTools

struct Log: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract: "Print the events of a store, decoded.",
    discussion: "Example: ferry log /tmp/groceries --task 5   or   ferry log /tmp/groceries --follow --json")

  @OptionGroup var store: StoreArgument

  @Option(help: "First sequence number.") var from: UInt64 = 1
  @Option(help: "Last sequence number.") var to: UInt64?
  @Option(help: "Only events of this type (e.g. task.runFailed).") var type: String?
  @Option(help: "Only events about this task id.") var task: TaskID?
  @Option(help: "Only events about this cache key.") var key: String?
  @Option(
    help:
      "Only events appended since then: a duration back from now (2h, 7d, 90m) or an ISO 8601 time (2026-01-15T09:00:00Z)."
  )
  var since: SinceFlag?
  @Flag(help: "One JSON object per line.") var json = false
  @Flag(help: "Keep printing new events as they are appended (until interrupted).") var follow = false

  func validate() throws {
    if let to, to < from { throw ValidationError("--to must not be less than --from") }
  }

  func run() async throws {
    var filter = LogFilter()
    filter.from = from
    filter.to = to
    filter.type = type
    filter.task = task
    filter.key = key
    filter.since = since?.milliseconds
    try await performContained(store: store.dir) { () async throws(ToolError) -> ExitStatus in
      try await printLog(path: store.dir, filter: filter, json: json, follow: follow, output: .standard)
      return .ok
    }
  }
}
