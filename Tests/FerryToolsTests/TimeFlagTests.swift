import Ferry
import FerryTools
import Foundation
import TestSupport
import Testing

@Suite(.timeLimit(.minutes(20)), .serialized) struct TimeFlagTests {
  @Test(arguments: [
    ("7d", Int64(604_800_000)), ("36h", 129_600_000), ("90m", 5_400_000), ("45s", 45_000), ("604800", 604_800_000),
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

  @Test func flagsOnTheCommandLine() async throws {
    let demo = DemoStore()
    defer { demo.remove() }
    let store = try await FerryStore.open(at: demo.path)
    let id = try await store.queue.add(tag: "flaky", payload: ["n": 1])
    let runner = TaskRunner(queue: store.queue)
    runner.register(tag: "flaky") { _ in .failed("offline", retryable: true) }
    _ = try await runner.run(.task(id))
    store.close()

    let badRetention = try ferry(["compact", demo.path, "--retention", "7x"])
    #expect(badRetention.status == 64)
    #expect(badRetention.stderr.contains("--retention takes a duration such as 7d"))
    let badAge = try ferry(["inspect", demo.path, "--max-age", "soon"])
    #expect(badAge.status == 64)
    #expect(badAge.stderr.contains("--max-age takes a duration"))
    let badSince = try ferry(["log", demo.path, "--since", "yesterday"])
    #expect(badSince.status == 64)
    #expect(badSince.stderr.contains("--since takes a duration back from now"))

    let inspected = try JSONDecoder().decode(
      InspectReport.self, from: Data(try ferry(["inspect", demo.path, "--max-age", "90m", "--json"]).stdout.utf8))
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
