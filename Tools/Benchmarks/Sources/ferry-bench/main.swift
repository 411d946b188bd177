// Ferry's benchmarks: Ferry, the same queue on SQLite through GRDB, and the bare LMDB floor, in
// one run on this machine. `ferry-bench [--quick] [--json] [--runs N] [--metrics]`. Times are
// reported, never asserted: the targets column says where Ferry stands. `--metrics` bootstraps a
// metrics backend first (as an app exporting Ferry's metrics does), to show what they cost.
import CoreMetrics
@_spi(Engine) @_spi(Experimental) import Ferry
import FerryLog
import Foundation

let arguments = CommandLine.arguments.dropFirst()
if arguments.contains("--help") || arguments.contains("-h") {
  print(
    """
    usage: ferry-bench [--quick] [--json] [--runs N] [--only K[,K…]]
           ferry-bench --profile-rebuild N | --profile-runloop N [LANES] [segment] [poll|poll=µs|nopoll] | --profile-adds N [segment] [callers=K] [poll|poll=µs|nopoll]
    (Tools/bench.sh builds it; `bash Tools/bench.sh --instructions` adds callgrind's instruction
    counts from Tools/cost.sh)
    """)
  exit(0)
}
let sizes: Sizes = {
  var sizes = arguments.contains("--quick") ? Sizes.quick : Sizes()
  if let index = arguments.firstIndex(of: "--runs"), arguments.index(after: index) < arguments.endIndex,
    let runs = Int(arguments[arguments.index(after: index)])
  {
    sizes.runs = max(1, runs)
  }
  return sizes
}()
let json = arguments.contains("--json")
if arguments.contains("--metrics") { MetricsSystem.bootstrap(BenchMetrics()) }

// `--profile-rebuild N`: build a log of N events, then only rebuild it (for callgrind).
if let index = arguments.firstIndex(of: "--profile-rebuild"),
  arguments.index(after: index) < arguments.endIndex,
  let count = Int(arguments[arguments.index(after: index)])
{
  let finished = DispatchSemaphore(value: 0)
  Task.detached {
    let path = scratchPath("profile")
    do {
      try await buildLog(path, events: count)
      let store = try await FerryStore.open(at: path)
      let before = anonymousMemory()
      let sampler = AnonymousMemorySampler()
      let rate = Double(count) / (try await seconds { _ = try await store.log.rebuild() })
      let peak = sampler.stop()
      print(
        String(
          format:
            "rebuilt %d events at %.0f events/s; anonymous RSS %.1f MiB before, %.1f MiB at most during it",
          count, rate, Double(before) / 1_048_576, Double(peak) / 1_048_576))
      store.close()
    } catch {
      print("profile failed: \(error)")
    }
    remove(path)
    finished.signal()
  }
  finished.wait()
  exit(0)
}

// `--profile-adds N [segment] [callers=K]`: N sequential adds by one caller, with the write-ahead segment when
// asked (for strace, perf or callgrind).
if let index = arguments.firstIndex(of: "--profile-adds"),
  arguments.index(after: index) < arguments.endIndex,
  let count = Int(arguments[arguments.index(after: index)])
{
  let segment = arguments.contains("segment")
  // `callers=K`: K callers adding at once (one by default).
  let callers =
    arguments.compactMap { $0.hasPrefix("callers=") ? Int($0.dropFirst(8)) : nil }.first.map { max(1, $0) }
    ?? 1
  let finished = DispatchSemaphore(value: 0)
  Task.detached {
    let path = scratchPath("profile")
    do {
      var configuration = FerryStore.Configuration()
      configuration.writeAheadSegment = segment
      if arguments.contains("nopoll") { configuration.writerSpin = .zero }
      if arguments.contains("poll") { configuration.writerSpin = .microseconds(50) }
      if let window = arguments.compactMap({ $0.hasPrefix("poll=") ? Int($0.dropFirst(5)) : nil }).first {
        configuration.writerSpin = .microseconds(window)
      }
      let store = try await FerryStore.open(at: path, configuration: configuration)
      let before = store.log.statistics.commits
      let rate =
        Double(count)
        / (try await seconds {
          try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<callers {
              group.addTask {
                for _ in 0..<(count / callers) {
                  try await store.queue.add(tag: "t", payload: Item(name: "milk"))
                }
              }
            }
            try await group.waitForAll()
          }
        })
      let commits = store.log.statistics.commits - before
      let polls = store.log.statistics.writerSpins
      let sizeBefore =
        (try? FileManager.default.attributesOfItem(atPath: path + "/data.mdb")[.size] as? Int) ?? 0
      store.close()
      let after = (try? FileManager.default.attributesOfItem(atPath: path + "/data.mdb")[.size] as? Int) ?? 0
      print(
        String(
          format:
            "%d adds by %d caller(s) at %.0f/s%@, %.1f a commit; data file %.1f MiB (%.1f MiB after close); the writer polled %d times",
          count / callers * callers, callers, rate, segment ? " (write-ahead segment)" : "",
          Double(count / callers * callers) / Double(max(1, commits)), Double(sizeBefore) / 1_048_576,
          Double(after) / 1_048_576, polls))
    } catch {
      print("profile failed: \(error)")
    }
    remove(path)
    finished.signal()
  }
  finished.wait()
  exit(0)
}

// `--profile-runloop N [LANES]`: queue N tasks over 8 groups, then only run them in one pass with
// LANES lanes (8 by default) and a no-op handler (for perf or callgrind).
if let index = arguments.firstIndex(of: "--profile-runloop"),
  arguments.index(after: index) < arguments.endIndex,
  let count = Int(arguments[arguments.index(after: index)])
{
  let lanesIndex = arguments.index(index, offsetBy: 2)
  let lanes = lanesIndex < arguments.endIndex ? Int(arguments[lanesIndex]) ?? 8 : 8
  let finished = DispatchSemaphore(value: 0)
  Task.detached {
    let path = scratchPath("profile")
    do {
      var storeConfiguration = FerryStore.Configuration()
      storeConfiguration.writeAheadSegment = arguments.contains("segment")
      if arguments.contains("nopoll") { storeConfiguration.writerSpin = .zero }
      if arguments.contains("poll") { storeConfiguration.writerSpin = .microseconds(50) }
      if let window = arguments.compactMap({ $0.hasPrefix("poll=") ? Int($0.dropFirst(5)) : nil }).first {
        storeConfiguration.writerSpin = .microseconds(window)
      }
      let store = try await FerryStore.open(at: path, configuration: storeConfiguration)
      let queue = store.queue
      let events = (0..<count).map { i in
        NewEvent(
          type: "task.added", schemaVersion: 3,
          payload: profileAddPayload(tag: "noop", payload: Array("{\"i\":\(i)}".utf8), group: "g\(i % 8)"))
      }
      for chunk in stride(from: 0, to: events.count, by: 5000) {
        _ = try await queue.log.append(Array(events[chunk..<min(chunk + 5000, events.count)]))
      }
      var configuration = TaskRunner.Configuration()
      configuration.maxConcurrentTasks = lanes
      let runner = TaskRunner(queue: queue, configuration: configuration)
      runner.register(tag: "noop") { _ in .succeeded }
      let before = queue.log.statistics.commits
      let rate = Double(count) / (try await seconds { _ = try await runner.run() })
      print(
        String(
          format:
            "ran %d tasks in %d lanes at %.0f tasks/s, %d commits; the writer polled %d times, %d caught",
          count, lanes, rate, queue.log.statistics.commits - before, queue.log.statistics.writerSpins,
          queue.log.statistics.writerSpinsCaught))
      store.close()
    } catch {
      print("profile failed: \(error)")
    }
    remove(path)
    finished.signal()
  }
  finished.wait()
  exit(0)
}

/// A `task.added` payload at schema version 2 (`Specs/task-events.md` §2), for building queues fast.
func profileAddPayload(tag: String, payload: [UInt8], group: String?) -> [UInt8] {
  func string(_ text: String) -> [UInt8] {
    let utf8 = Array(text.utf8)
    return withUnsafeBytes(of: UInt32(utf8.count).bigEndian, Array.init) + utf8
  }
  var bytes = string(tag) + withUnsafeBytes(of: UInt32(payload.count).bigEndian, Array.init) + payload
  bytes += [0]  // no data id
  if let group { bytes += [1] + string(group) } else { bytes += [0] }
  bytes += [0, 0]  // not manual, unique append
  bytes += [0, 0]  // priority normal, no deadline
  bytes += [0, 0]  // no start time, no interval (schema version 3)
  return bytes
}

func format(_ value: Double, _ unit: String) -> String {
  switch unit {
  case "/s": return value >= 1000 ? String(format: "%.0f/s", value) : String(format: "%.1f/s", value)
  case "µs": return String(format: "%.1f µs", value)
  case "ms": return String(format: "%.2f ms", value)
  case "MiB": return String(format: "%.1f MiB", value)
  case "entries": return String(format: "%.0f entries", value)
  default: return String(format: "%.2f", value)
  }
}

let done = DispatchSemaphore(value: 0)
Task.detached {
  do {
    let machine = machineDescription()
    if !json {
      print("machine: \(machine)")
      print(
        "mode: \(arguments.contains("--quick") ? "quick (small sizes, a smoke run)" : "full"), medians of \(sizes.runs) run(s)"
          + (arguments.contains("--metrics") ? ", metrics bootstrapped" : "")
      )
    }
    let recordSize = try await ferryRecordSize()
    var figures: [Figure] = []
    // `--only 3` (or `--only 1,3`): just those numbered workloads, for a quick look at one line.
    let only: Set<Int>? = arguments.firstIndex(of: "--only").flatMap { index in
      let next = arguments.index(after: index)
      guard next < arguments.endIndex else { return nil }
      return Set(arguments[next].split(separator: ",").compactMap { Int($0) })
    }
    let workloads: [(Int, @Sendable () async throws -> [Figure])] = [
      (1, { try await sequentialAdds(sizes, recordSize: recordSize) }),
      (2, { try await concurrentAdds(sizes, recordSize: recordSize) }),
      (3, { try await runLoop(sizes) }), (3, { try await batchedRunLoop(sizes) }),
      (3, { try await passWithOneRunnable(sizes) }),
      (4, { try await lookups(sizes) }), (4, { try await dueRetryLookups(sizes) }),
      (4, { try await delayedLookups(sizes) }),
      (5, { try await rebuildAndOpen(sizes) }),
    ]
    for (number, workload) in workloads {
      if let only, !only.contains(number) { continue }
      let new = try await workload()
      figures += new
      if !json {
        for figure in new {
          var line = figure.workload.padding(toLength: 50, withPad: " ", startingAt: 0)
          line +=
            " ferry " + format(figure.ferry, figure.unit).padding(toLength: 14, withPad: " ", startingAt: 0)
          if let sqlite = figure.sqlite {
            line +=
              " sqlite " + format(sqlite, figure.unit).padding(toLength: 13, withPad: " ", startingAt: 0)
            if figure.unit == "/s" {
              line += String(format: " (%.1f× sqlite)", figure.ferry / max(sqlite, 1e-9))
            }
            if figure.unit == "µs" || figure.unit == "ms" {
              line +=
                figure.ferry <= sqlite
                ? String(format: " (%.1f× faster)", sqlite / max(figure.ferry, 1e-9))
                : String(format: " (%.1f× slower)", figure.ferry / max(sqlite, 1e-9))
            }
          }
          if let floor = figure.floor {
            let name =
              figure.baseline
              ?? (figure.unit == "MiB" ? "before" : (figure.workload.hasPrefix("5") ? "bare scan" : "floor"))
            line += " \(name) " + format(floor, figure.unit)
            if figure.unit == "/s" || figure.unit == "µs" || figure.unit == "ms" {
              line += String(format: " (%.2f× %@)", figure.ferry / max(floor, 1e-9), name)
            }
          }
          line += "  target: \(figure.target)" + (figure.meets.map { $0 ? " ✓" : " ✗" } ?? "")
          print(line)
        }
      }
    }
    if json {
      struct Report: Codable {
        var machine: String
        var quick: Bool
        var runs: Int
        var figures: [Figure]
      }
      let encoder = JSONEncoder()
      encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
      let data = try encoder.encode(
        Report(machine: machine, quick: arguments.contains("--quick"), runs: sizes.runs, figures: figures))
      print(String(decoding: data, as: UTF8.self))
    }
  } catch {
    FileHandle.standardError.write(Data("ferry-bench: \(error)\n".utf8))
    exit(1)
  }
  done.signal()
}
done.wait()
