import Ferry
import FerryTools
import Foundation
import TestSupport
import Testing

@Suite(.timeLimit(.minutes(20)), .serialized) struct TimeFlagTests {
  @Test(arguments: [
    ("7d", Int64(604_800_000)), ("36h", 129_600_000), ("90m", 5_400_000), ("45s", 45_000),
    ("604800", 604_800_000),
    ("0", 0), ("1h30m", 5_400_000), ("500ms", 500), ("2w", 1_209_600_000),
    ("99999999999999999999d", Int64.max),
  ])
  func durationFlagsTakeUnitsAndPlainSeconds(text: String, milliseconds: Int64) throws {
    #expect(try parseDuration(text, flag: "--retention") == milliseconds)
  }

  @Test(arguments: ["", "-5", "7x", "d", "1.5h", "h7", "7 d", "7d-1h"])
  func badDurationsAreRefusedWithStatus64(text: String) {
    #expect(throws: ToolError.self) { try parseDuration(text, flag: "--retention") }
    do {
      _ = try parseDuration(text, flag: "--retention")
    } catch {
      #expect(error.status == .badFlags)
      #expect(error.message.contains("--retention takes a duration"))
    }
  }

  @Test func sinceTakesADurationBackOrAnISOTime() throws {
    let now: Int64 = 1_768_467_600_000  // 2026-01-15T09:00:00Z
    #expect(try parseSince("2h", now: now) == now - 7_200_000)
    #expect(try parseSince("2026-01-15T09:00:00Z", now: 0) == now)
    #expect(try parseSince("2026-01-15T10:00:00.250+01:00", now: 0) == now + 250)
    #expect(throws: ToolError.self) { try parseSince("yesterday", now: now) }
    #expect(throws: ToolError.self) { try parseSince("2026-13-45", now: now) }
  }

  /// A store for the command-line tests: one task that failed retryably (a retry time to show).
  static func storeWithARetry() async throws -> (demo: DemoStore, id: TaskID) {
    let demo = DemoStore()
    let store = try await FerryStore.open(at: demo.path)
    let id = try await store.queue.add(tag: "flaky", payload: ["n": 1])
    let runner = TaskRunner(queue: store.queue)
    runner.register(tag: "flaky") { _ in .failed("offline", retryable: true) }
    _ = try await runner.run(.task(id))
    store.close()
    return (demo, id)
  }

  /// Each time flag of each command that takes one, as the parser reads it: the flag, and the
  /// words of its syntax its help gives.
  static let timeFlags: [(command: [String], flag: String, syntax: String)] = [
    (["inspect"], "--max-age", "1h, 90m, 7d, 45s, 1h30m or plain seconds"),
    (["replay"], "--max-age", "1h, 90m, 7d, 45s, 1h30m or plain seconds"),
    (["log"], "--since", "a duration back from now (2h, 7d, 90m) or an ISO 8601 time"),
    (["compact"], "--retention", "7d, 36h, 90m, 45s, 1h30m or plain seconds"),
  ]

  /// A bad value of any time flag is a usage error (status 64, as every bad flag) whose message
  /// names the flag, the value and the syntax the flag takes — and the store is never opened
  /// (the directory does not exist).
  @Test(arguments: ["7x", "soon", "1.5h", "h7", "-5", "7 d", "2026-13-45T99:00:00Z"])
  func badTimeFlagValuesExitWithAUsageError(value: String) throws {
    let missing = FileManager.default.temporaryDirectory.appendingPathComponent("ferry-no-store-\(UUID())")
      .path
    for (command, flag, syntax) in Self.timeFlags {
      let arguments = [command[0], missing] + command.dropFirst() + ["\(flag)=\(value)"]
      let result = try ferry(arguments)
      #expect(result.status == ExitStatus.badFlags.rawValue, "\(arguments): \(result.stderr)")
      #expect(
        result.stderr.contains("The value '\(value)' is invalid for '\(flag) "),
        "\(arguments): \(result.stderr)")
      let oneLine = result.stderr.split(whereSeparator: \.isWhitespace).joined(separator: " ")
      #expect(oneLine.contains(syntax), "\(arguments): \(result.stderr)")
      #expect(result.stdout.isEmpty)
      #expect(!FileManager.default.fileExists(atPath: missing))
    }
  }

  /// Good values of every time flag run the command (status 0).
  @Test func goodTimeFlagValuesRunTheCommand() async throws {
    let (demo, _) = try await Self.storeWithARetry()
    defer { demo.remove() }
    for (command, flag, _) in Self.timeFlags {
      let values =
        flag == "--since"
        ? ["2h", "604800", "1h30m", "2026-01-15T09:00:00Z", "2026-01-15T10:00:00.250+01:00"]
        : ["7d", "36h", "90m", "45s", "500ms", "1h30m", "604800", "0", "99999999999999999999d"]
      for value in values {
        let arguments = [command[0], demo.path] + command.dropFirst() + [flag, value]
        let result = try ferry(arguments)
        #expect(result.status == 0, "\(arguments): \(result.stderr)")
      }
    }
  }

  @Test func flagsOnTheCommandLine() async throws {
    let (demo, id) = try await Self.storeWithARetry()
    defer { demo.remove() }

    let inspected = try JSONDecoder().decode(
      InspectReport.self,
      from: Data(try ferry(["inspect", demo.path, "--max-age", "90m", "--json"]).stdout.utf8))
    #expect(inspected.maxAgeMs == 5_400_000)

    let recent = try ferry(["log", demo.path, "--since", "2h"])
    #expect(recent.status == 0)
    #expect(recent.stdout.contains("task \(id) added"))
    let future = try ferry(["log", demo.path, "--since", "2100-01-01T00:00:00Z"])
    #expect(future.status == 0)
    #expect(future.stdout.isEmpty)
    let everything = try ferry(["log", demo.path, "--since", "1970-01-01T00:00:00Z", "--json"])
    #expect(everything.stdout.split(separator: "\n").count == 3)

    // Human output: ISO dates and relative times, never raw milliseconds.
    let human = try ferry(["log", demo.path]).stdout + (try ferry(["inspect", demo.path]).stdout)
    #expect(human.contains("retry at 20"))
    // An owner id is a random token (hex digits can all be decimal ones): not a time.
    let times = human.replacing(/of owner \S+/, with: "of owner X")
    #expect(times.firstRange(of: /\d{13}/) == nil, "raw milliseconds in: \(human)")

    #expect(try ferry(["compact", demo.path, "--retention", "36h"]).status == 0)
  }
}
