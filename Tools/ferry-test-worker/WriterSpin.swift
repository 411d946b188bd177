// Modes that load the writer from another process, so that its poll window (writerSpin) is
// exercised against a real competitor.
@_spi(Engine) @_spi(Experimental) import Ferry
import FerryLog
import Foundation

let writerSpinModes: [String: Mode] = [
  // Opens the log with the write-ahead segment (projection EventTypeCounts under "countByType";
  // with "bare", none, so that another process's projection falls behind), the writer's poll
  // window WINDOW in microseconds ("default": the store's default), says "processors P segment
  // S", then appends COUNT events of type "worker.event" one by one (payload "worker I"),
  // printing "ack SEQ I SPINS" after each (SPINS: the writer's polls so far), then "spins S caught
  // C", closes and says "closed".
  "spin-append": Mode(usage: "DIR COUNT WINDOW|default [bare]") { call in
    call.expect(2...3)
    let count = call.number(0)
    let bare = call.flag(2, "bare")
    var configuration = EventLog.Configuration(
      projections: bare ? [] : [EventTypeCounts(name: "countByType", version: 1)])
    configuration.writeAheadSegment = true
    if let micros = Int64(call.words[1]) { configuration.writerSpin = .microseconds(micros) }
    call.runAsync { [configuration] in
      let log = try EventLog.open(at: call.directory, configuration: configuration)
      let segment = FileManager.default.fileExists(atPath: call.directory + "/ferry-segment")
      say("processors \(ProcessInfo.processInfo.activeProcessorCount) segment \(segment)")
      for i in 0..<count {
        let sequence = try await log.append(
          NewEvent(type: "worker.event", payload: Array("worker \(i)".utf8)))
        say("ack \(sequence) \(i) \(log.statistics.writerSpins)")
      }
      let statistics = log.statistics
      say("spins \(statistics.writerSpins) caught \(statistics.writerSpinsCaught)")
      log.close()
      say("closed")
    }
  },
  // Opens the store with the write-ahead segment, adds COUNT "job" tasks one by one (payload kind
  // "ok", data id "PREFIX-I"), printing "ack ID I" after each, then "spins S caught C processors
  // P", closes and says "closed".
  "spin-add-tasks": Mode(usage: "DIR COUNT PREFIX") { call in
    call.expect(2...2)
    let count = call.number(0)
    let prefix = call.words[1]
    call.runAsync {
      var configuration = storeConfiguration(segment: true)
      // A window of 2 ms (polls after waits under 8 ms): the test checks that this writer polled,
      // which the default 50 µs may not do at all on a machine loaded by a whole test run.
      configuration.writerSpin = .milliseconds(2)
      let store = try await FerryStore.open(at: call.directory, configuration: configuration)
      for i in 0..<count {
        let id = try await store.queue.add(tag: "job", payload: ["kind": "ok"], dataId: "\(prefix)-\(i)")
        say("ack \(id) \(i)")
      }
      let statistics = store.log.statistics
      say(
        "spins \(statistics.writerSpins) caught \(statistics.writerSpinsCaught) "
          + "processors \(ProcessInfo.processInfo.activeProcessorCount)")
      store.close()
      say("closed")
    }
  },
  // Opens the store (following its write-ahead segment) and runs serial passes (one task at a
  // time) over its "job" tasks until a line "stop" has come on standard input and then three
  // passes ran nothing; says "ran ID ATTEMPT" as each handler starts and, at the end, "spins S
  // caught C", then closes and says "closed".
  "spin-run-tasks": Mode(usage: "DIR") { call in
    let stopAsked = StopLine { $0 == "stop" }
    call.runAsync {
      let store = try await FerryStore.open(at: call.directory)
      let runner = TaskRunner(queue: store.queue)
      runner.register(tag: "job") { task in
        say("ran \(task.id) \(task.attempt)")
        return .succeeded
      }
      var idle = 0
      while idle < 3 {
        let report = try await runner.run()
        let ranSomething = report.entries.contains { entry in
          if case .skipped = entry.outcome { return false } else { return true }
        }
        if ranSomething || !stopAsked.hasCome {
          idle = 0
          if !ranSomething { try await Task.sleep(for: .milliseconds(2)) }
        } else {
          idle += 1
        }
      }
      let statistics = store.log.statistics
      say("spins \(statistics.writerSpins) caught \(statistics.writerSpinsCaught)")
      store.close()
      say("closed")
    }
  },
]
