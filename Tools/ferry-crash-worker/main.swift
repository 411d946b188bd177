import FerryCrashWorkload
// The crash tests' worker, spawned (never forked) by the harness and killed at random moments or
// at labelled crash points (FERRY_CRASH_POINT): `workload` runs the seeded workload and prints an
// `ack` line after each durable event; `runner` is a second process running passes on the same
// store; `check` reopens a store after a kill and checks every
// invariant against the acknowledgements read from a file. The work is FerryCrashWorkload's (tested in FerryToolsTests).
import FerryLog
import Foundation
import Synchronization

func say(_ line: String) { FileHandle.standardOutput.write(Data((line + "\n").utf8)) }

func fail(_ message: String) -> Never {
  FileHandle.standardError.write(Data((message + "\n").utf8))
  exit(2)
}

CrashPoint.armFromEnvironment()  // only this worker is killed at labelled points
let arguments = CommandLine.arguments
guard arguments.count >= 3 else {
  fail("usage: ferry-crash-worker workload DIR SEED [OPS] | runner DIR SEED | check DIR ACKFILE")
}
let done = DispatchSemaphore(value: 0)
let status = Mutex<Int32>(0)

switch arguments[1] {
case "workload":
  guard arguments.count >= 4, let seed = UInt64(arguments[3]) else { fail("workload DIR SEED [OPS]") }
  let operations = arguments.count >= 5 ? Int(arguments[4]) : nil
  Task.detached {
    do {
      try await runCrashWorkload(path: arguments[2], seed: seed, operations: operations, ack: say)
    } catch {
      fail("workload failed: \(error)")
    }
    done.signal()
  }
case "runner":
  guard arguments.count >= 4, let seed = UInt64(arguments[3]) else { fail("runner DIR SEED") }
  Task.detached {
    do {
      try await runCrashRunner(path: arguments[2], seed: seed, ack: say)
    } catch {
      fail("runner failed: \(error)")
    }
    done.signal()
  }
case "check":
  guard arguments.count == 4 else { fail("check DIR ACKFILE") }
  let text = (try? String(contentsOfFile: arguments[3], encoding: .utf8)) ?? ""
  let acks = text.split(separator: "\n").compactMap { Acknowledgement(line: $0) }
  Task.detached {
    let report = await checkAfterCrash(path: arguments[2], acknowledged: acks)
    report.lines.forEach(say)
    status.withLock { $0 = report.violations.isEmpty ? 0 : 1 }
    done.signal()
  }
default:
  fail("unknown command \(arguments[1])")
}
done.wait()
exit(status.withLock { $0 })
