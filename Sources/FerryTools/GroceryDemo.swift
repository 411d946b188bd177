@_spi(Engine) import Ferry
import FerryLog
import Foundation
import Synchronization

/// The demo's simulated server: offline, then flaky, then back; it refuses names over 20 characters
/// until the user shortens them.
final class DemoServer: Sendable {
  enum Mode: Sendable { case offline, flaky, online }
  struct State {
    var mode = Mode.offline
    var random: SeededRandom
    var items: [String] = []
    var shortened: Set<String> = []
  }
  let state: Mutex<State>

  init(seed: UInt64) { state = Mutex(State(random: SeededRandom(seed: seed))) }

  func random() -> Double { state.withLock { $0.random.unit() } }

  func add(_ name: String) -> TaskResult {
    state.withLock { s in
      switch s.mode {
      case .offline: return .failed("server unreachable (offline)")
      case .flaky where s.random.unit() < 0.5: return .failed("server timed out")
      default: break
      }
      if name.count > 20 && !s.shortened.contains(name) {
        return .recordError("“\(name)” is longer than the server's 20 characters: shorten it")
      }
      s.items.append(s.shortened.contains(name) ? String(name.prefix(20)) : name)
      return .succeeded
    }
  }
}

struct GroceryItem: Codable, Sendable {
  var name: String
}

/// `ferry demo`: an offline-first grocery list on a real store, told as it happens. The clock is
/// simulated and the server's flakiness seeded, so a seed always tells the same story and leaves
/// the same final state. Returns the store's path and its final state.
package func runDemo(
  path: String?, seed: UInt64, output: Output
) async throws(ToolError) -> (
  path: String, snapshot: FerrySnapshot
) {
  let path = path ?? FileManager.default.temporaryDirectory.path + "/ferry-demo-\(getpid())-\(seed)"
  do {
    return (path, try await tellStory(path: path, seed: seed, output: output))
  } catch let error as ToolError {
    throw error
  } catch {
    throw ToolError.from(error)
  }
}

private func tellStory(path: String, seed: UInt64, output: Output) async throws -> FerrySnapshot {
  let say = output.line
  // 2026-01-15 09:00:00 UTC, simulated
  let clock = DemoClock(date: Date(unixMilliseconds: 1_768_467_600_000))
  let start = clock.now
  func stamp() -> String {
    let seconds = start.duration(to: clock.now).milliseconds / 1000
    return String(format: "[+%02lld:%02lld]", seconds / 60, seconds % 60)
  }
  var configuration = FerryStore.Configuration()
  configuration.clock = clock
  if let entries = try? FileManager.default.contentsOfDirectory(atPath: path), !entries.isEmpty {
    throw ToolError(.badInput, "\(path) is not empty: the demo needs a fresh directory")
  }
  let store = try await FerryStore.open(at: path, configuration: configuration)
  defer { store.close() }
  let server = DemoServer(seed: seed)

  var runnerConfiguration = TaskRunner.Configuration()
  runnerConfiguration.collections = ["grocery-changes": ["add-item"]]
  runnerConfiguration.random = { server.random() }
  runnerConfiguration.defaultRetry = RetryPolicy(
    maxAttempts: 10, initialDelay: .seconds(2), multiplier: 2, jitter: 0.1)
  let runner = TaskRunner(queue: store.queue, configuration: runnerConfiguration)
  runner.register(tag: "add-item") { task in server.add(try task.payload(as: GroceryItem.self).name) }
  runner.register(tag: "share-list") { _ in .succeeded }

  func describe(_ report: PassReport) {
    for entry in report.entries {
      let task = entry.taskId
      let text: String
      switch entry.outcome {
      case .succeeded: text = "sent to the server"
      case .failed(let message, let retryAt):
        let retry = retryAt.map { humanDuration($0.unixMilliseconds - clock.date.unixMilliseconds) }
        text = "failed: \(message)" + (retry.map { ", retry in \($0)" } ?? ", dead")
      case .errorRecorded(let message): text = "needs the user: \(message)"
      case .interrupted: text = "interrupted"
      case .deferred(let reason): text = "deferred until the network is back (\(reason))"
      case .skipped(let reason): text = "skipped (\(reason))"
      case .expired: text = "expired before it could start"
      }
      say("    task \(task): \(text)")
    }
  }
  func pass(_ why: String) async throws {
    say("\(stamp()) pass (\(why))")
    describe(try await runner.run())
  }
  func advanceToNextRetry() -> Bool {
    let next = (try? store.queue.pendingTasks())?.compactMap { task -> Date? in
      if case .waiting(let until) = task.status { return until }
      return nil
    }.min()
    guard let next else { return false }
    clock.set(max(clock.date, next))
    return true
  }

  say("Ferry demo: a grocery list that works offline (seed \(seed))")
  say("store: \(path)")
  say("")
  say("\(stamp()) the phone is offline; the user adds four items (one list, so they sync in order)")
  for name in ["milk", "eggs", "bread", "tomatoes"] {
    let id = try await store.queue.add(tag: "add-item", payload: GroceryItem(name: name), groupId: "list")
    say("    added “\(name)” as task \(id) — saved before the call returned")
  }
  try await pass("still offline")
  clock.advance(by: .seconds(3))
  try await pass("3 s later: the first task waits for its retry, the rest of its group waits behind it")

  say("")
  server.state.withLock { $0.mode = .flaky }
  let long = "extra virgin olive oil, the good one"
  let longId = try await store.queue.add(tag: "add-item", payload: GroceryItem(name: long), groupId: "list")
  say("\(stamp()) a flaky connection comes and goes; the user adds “\(long)” (task \(longId))")
  var passes = 0
  while passes < 12, advanceToNextRetry() {
    passes += 1
    try await pass("retry time reached")
    if try store.queue.errors().isEmpty == false { break }
  }
  for error in try store.queue.errors() {
    say("\(stamp()) task \(error.taskId) is blocked until the user acts: \(error.message)")
  }

  say("")
  server.state.withLock {
    $0.mode = .online
    $0.shortened.insert(long)
  }
  clock.advance(by: .seconds(30))
  say("\(stamp()) back online; the user shortens the name and the error is resolved")
  try await store.queue.resolveError(longId)
  try await pass("after the fix")
  while try store.queue.pendingTasks().contains(where: { !$0.manual }), advanceToNextRetry() {
    try await pass("retry time reached")
  }
  let shareId = try await store.queue.add(
    tag: "share-list", payload: GroceryItem(name: "Sam"), options: [.manual])
  say("\(stamp()) a manual task to share the list (task \(shareId)) waits until the user taps Share")
  say("    the server now has: \(server.state.withLock { $0.items }.joined(separator: ", "))")

  say("")
  say("\(stamp()) two caches: the list (max age 1 h; refreshed only after pending changes reach the server)")
  say("         and the store's opening hours (max age 1 day)")
  let listItems = Mutex<[String]>([])
  let list = try CacheRepository(
    key: "grocery-list", ledger: store.ledger, maxAge: .seconds(3600),
    source: CacheSource(
      fetch: { server.state.withLock { $0.items } }, save: { items in listItems.withLock { $0 = items } },
      load: { listItems.withLock { $0 } }),
    requires: try PendingTasksGate(runner: runner, collection: "grocery-changes"))
  let hours = try CacheRepository(
    key: "store-hours", ledger: store.ledger, maxAge: .seconds(86_400),
    source: CacheSource(fetch: { "8:00–20:00" }, save: { _ in }, load: { "8:00–20:00" }))
  say("    grocery-list refresh: \(await list.refresh())")
  say("    store-hours refresh: \(await hours.refresh())")
  clock.advance(by: .seconds(7200))
  say("\(stamp()) two hours later:")
  for (key, maxAge) in [("grocery-list", Duration.seconds(3600)), ("store-hours", Duration.seconds(86_400))] {
    if case .cache(_, let age, let tooOld) = try store.ledger.state(key: key, maxAge: maxAge) {
      say(
        "    \(key): \(humanDuration(age.components.seconds * 1000)) old, \(tooOld ? "too old: refresh it" : "fresh")"
      )
    }
  }

  say("")
  say("final state (ferry inspect):")
  let snapshot = try store.log.read { try FerryStore.snapshot(of: $0) }
  InspectReport(snapshot, now: clock.date.unixMilliseconds, maxAgeMs: 3_600_000).lines().forEach {
    say("  " + $0)
  }
  let verified = try store.log.verify()
  say("")
  say(
    "verify: \(verified.recordsChecked) events, projections equal a rebuild: \(verified.isHealthy ? "yes" : "NO")"
  )
  return snapshot
}
