// Ferry's cost probe: one workload with only its measured section counted by valgrind's callgrind
// (client requests around it; run under `valgrind --tool=callgrind --instr-atstart=no`).
// Tools/cost.sh runs it and divides by the count; outside valgrind it just runs the workload.
//   ferry-cost adds N      N durable adds by one caller (TaskQueue.add, a small JSON payload)
//   ferry-cost runs N      a serial pass over N queued tasks with a no-op handler (claim + finish)
//   ferry-cost rebuild N   a rebuild of every projection over a log of N task adds
//   ferry-cost rebuild-churn N  a rebuild over N task adds each followed by its run (3 events a task)
//   ferry-cost open N      builds a store of N task adds and prints its size and the median
//                          time of 5 opens (under callgrind: the instructions of the 5 opens);
//                          with FERRY_COST_STORE=dir the store is kept there and built only once
import CFerryCost
@_spi(Engine) @_spi(Experimental) import Ferry
import FerryLog
import Foundation

struct Item: Codable, Sendable { var name: String }

/// Every probe's store: the writer never polls for its next job (`writerSpin`), so that what is
/// counted is the work — under callgrind a poll's loop would add instructions by the microsecond.
/// The default write path, or flushed commits with `FERRY_WRITE_AHEAD_SEGMENT=0` (for comparing
/// the two: the baseline is the default's).
let costConfiguration: FerryStore.Configuration = {
  var configuration = FerryStore.Configuration()
  configuration.writerSpin = .zero
  if ProcessInfo.processInfo.environment["FERRY_WRITE_AHEAD_SEGMENT"] == "0" {
    configuration.writeAheadSegment = false
  }
  return configuration
}()

/// A `task.added` payload at schema version 3, as Ferry writes it now (`Specs/task-events.md` §2):
/// tag, payload, no data id, maybe a group, not manual, unique append, normal priority, no deadline,
/// no start time, no interval. (An older add would measure its upcasters too.)
func addPayload(_ i: Int) -> [UInt8] {
  var writer = PayloadWriter()
  writer.write("t")
  writer.write(bytes: Array(#"{"name":"milk"}"#.utf8))
  writer.write(String?.none)
  writer.write(i % 10 == 0 ? "g\(i % 100)" : String?.none)
  writer.write(false)
  writer.write(UInt8(0))
  writer.write(UInt8(0))  // priority: normal
  writer.write(Int64?.none)  // no deadline
  writer.write(Int64?.none)  // no start time
  writer.write(Int64?.none)  // no interval
  return writer.bytes
}

func appendAdds(_ log: EventLog, _ count: Int) async throws {
  var written = 0
  while written < count {
    let batch = min(5_000, count - written)
    let events = (0..<batch).map {
      NewEvent(type: "task.added", schemaVersion: 3, payload: addPayload(written + $0))
    }
    _ = try await log.append(events)
    written += batch
  }
}

func workload(_ name: String, _ count: Int, path: String) async throws {
  switch name {
  case "adds":
    let store = try await FerryStore.open(at: path, configuration: costConfiguration)
    defer { store.close() }
    try await store.queue.add(tag: "t", payload: Item(name: "milk"))  // warm: first-use costs
    ferry_cost_start()
    for _ in 0..<count { try await store.queue.add(tag: "t", payload: Item(name: "milk")) }
    ferry_cost_stop()
  case "runs":
    let store = try await FerryStore.open(at: path, configuration: costConfiguration)
    defer { store.close() }
    try await appendAdds(store.log, count)
    var configuration = TaskRunner.Configuration()
    configuration.maxConcurrentTasks = 1
    let runner = TaskRunner(queue: store.queue, configuration: configuration)
    runner.register(tag: "t") { _ in .succeeded }
    ferry_cost_start()
    let report = try await runner.run()
    ferry_cost_stop()
    guard report.succeeded == count else {
      throw CostError("the pass ran \(report.succeeded) of \(count) tasks")
    }
  case "rebuild":
    do {
      let store = try await FerryStore.open(at: path, configuration: costConfiguration)
      try await appendAdds(store.log, count)
      store.close()
    }
    let store = try await FerryStore.open(at: path, configuration: costConfiguration)
    defer { store.close() }
    ferry_cost_start()
    let report = try await store.log.rebuild()
    ferry_cost_stop()
    guard report.head == UInt64(count) else {
      throw CostError("the rebuild reached \(report.head) of \(count)")
    }
  case "rebuild-churn":
    // A log where every task is added and then run to success: the rows a rebuild writes are
    // few, the changes it folds many.
    do {
      let store = try await FerryStore.open(at: path, configuration: costConfiguration)
      try await appendAdds(store.log, count)
      let runner = TaskRunner(queue: store.queue)
      runner.register(tag: "t") { _ in .succeeded }
      _ = try await runner.run()
      store.close()
    }
    let store = try await FerryStore.open(at: path, configuration: costConfiguration)
    defer { store.close() }
    ferry_cost_start()
    let report = try await store.log.rebuild()
    ferry_cost_stop()
    guard report.head >= UInt64(count) else { throw CostError("the rebuild reached \(report.head)") }
  case "open":
    // FERRY_COST_STORE names a store kept between runs: built once, then only opened.
    if !FileManager.default.fileExists(atPath: path + "/data.mdb") {
      let store = try await FerryStore.open(at: path, configuration: costConfiguration)
      try await appendAdds(store.log, count)
      store.close()
    }
    let size = (try? FileManager.default.attributesOfItem(atPath: path + "/data.mdb")[.size] as? Int) ?? 0
    var times: [Double] = []
    for _ in 0..<5 {
      let start = ContinuousClock.now
      ferry_cost_start()
      let store = try await FerryStore.open(at: path, configuration: costConfiguration)
      ferry_cost_stop()
      let elapsed = ContinuousClock.now - start
      store.close()
      times.append(Double(elapsed.components.attoseconds) / 1e15 + Double(elapsed.components.seconds) * 1e3)
    }
    print(
      "open of a store of \(count) events (data.mdb \(size / 1_048_576) MiB): median \(times.sorted()[2]) ms of \(times.map { Int($0) }) ms"
    )
  default:
    throw CostError("unknown workload '\(name)' (adds, runs or rebuild)")
  }
}

struct CostError: Error, CustomStringConvertible {
  let description: String
  init(_ description: String) { self.description = description }
}

let arguments = Array(CommandLine.arguments.dropFirst())
guard arguments.count == 2, let count = Int(arguments[1]), count > 0 else {
  FileHandle.standardError.write(Data("usage: ferry-cost adds|runs|rebuild|rebuild-churn|open N\n".utf8))
  exit(2)
}
if ferry_cost_available() == 0 {
  FileHandle.standardError.write(
    Data("ferry-cost: built without valgrind's headers; nothing is counted\n".utf8))
}
let keptStore = ProcessInfo.processInfo.environment["FERRY_COST_STORE"]
let path =
  keptStore ?? FileManager.default.temporaryDirectory.path + "/ferry-cost-\(UUID().uuidString.prefix(8))"
let finished = DispatchSemaphore(value: 0)
nonisolated(unsafe) var failure: (any Error)?
Task.detached {
  do { try await workload(arguments[0], count, path: path) } catch { failure = error }
  finished.signal()
}
finished.wait()
if keptStore == nil { try? FileManager.default.removeItem(atPath: path) }
if let failure {
  FileHandle.standardError.write(Data("ferry-cost: \(failure)\n".utf8))
  exit(1)
}
