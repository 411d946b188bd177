// Modes that append to, or read, the event log itself (no FerryStore).
import FerryLog
import Foundation

let logModes: [String: Mode] = [
  // Appends COUNT events of type "worker.event" one by one, printing "ack SEQ" after each.
  "append": Mode(usage: "DIR COUNT") { call in
    call.expect(1...1)
    let count = call.number(0)
    call.runAsync {
      // With the write-ahead segment, the default, unless FERRY_WRITE_AHEAD_SEGMENT=0.
      var configuration = EventLog.Configuration()
      configuration.writeAheadSegment =
        ProcessInfo.processInfo.environment["FERRY_WRITE_AHEAD_SEGMENT"] != "0"
      let log = try EventLog.open(at: call.directory, configuration: configuration)
      for i in 0..<count {
        let sequence = try await log.append(
          NewEvent(type: "worker.event", payload: Array("worker \(i)".utf8)))
        say("ack \(sequence)")
      }
      log.close()
    }
  },
  // Opens the log read-only (no projections) and says "head N"; says "refused E" and exits 4 when
  // the open is refused.
  "log-head": Mode(usage: "DIR") { call in
    do {
      var configuration = EventLog.Configuration()
      configuration.readOnly = true
      let log = try EventLog.open(at: call.directory, configuration: configuration)
      say("head \(try log.head())")
      log.close()
    } catch {
      say("refused \(error)")
      exit(4)
    }
  },
]
