// Modes that compact a store while the parent, or another worker, uses it.
@_spi(Engine) @_spi(Experimental) import Ferry
import FerryLog
import FerryTools
import Foundation
import LMDB

let compactionModes: [String: Mode] = [
  // Runs `ferry compact --copy DIR` (retention 0) in this process, crash points armed from the
  // environment (FERRY_CRASH_POINT=compact.swapped with FERRY_CRASH_SIGNAL=STOP stops it right
  // after the copy was renamed into place, compact.copied right after the copy was made); says
  // "compacted" when it returns, "refused S M" when it throws (its exit status S).
  // FERRY_FAIL_FLUSH=compact.copy (or compact.directory) makes that flush fail.
  "compact-copy": Mode(usage: "DIR") { call in
    CrashPoint.armFromEnvironment()
    DiskFlush.armFromEnvironment()
    call.runAsync {
      do throws(ToolError) {
        try await compact(path: call.directory, retentionMs: 0, copy: true, output: Output(line: { _ in }))
        say("compacted")
      } catch {
        say("refused \(error.status.rawValue) \(error.message)")
      }
    }
  },
  // Opens the existing store with rebuildChunkSize CHUNK (the chunks in which a compaction folds
  // projections left behind; the write-ahead segment when "segment" is given), says "open", then
  // compacts it with a retention of zero again and again, saying "compacted I R" (R events
  // removed) after each, until a line arrives on standard input; then closes and says "closed
  // ROUNDS". Crash points are armed from the environment (FERRY_CRASH_POINT=compaction kills it
  // inside a compaction's transaction, snapshot written and events removed).
  "compact-until-line": Mode(usage: "DIR CHUNK [segment]") { call in
    call.expect(1...2)
    let chunk = call.number(0)
    let segment = call.flag(1, "segment")
    CrashPoint.armFromEnvironment()
    let stop = StopLine()
    call.runAsync(announce: true) {
      let store = try await FerryStore.open(
        at: call.directory, configuration: storeConfiguration(existing: true, segment: segment, chunk: chunk))
      say("open")
      var rounds = 0
      while !stop.hasCome {
        let report = try await store.compact(retention: .zero)
        say("compacted \(rounds) \(report.removed)")
        rounds += 1
        try await Task.sleep(for: .milliseconds(5))
      }
      store.close()
      say("closed \(rounds)")
    }
  },
  // Opens the existing store (the write-ahead segment when "segment" is given), does ACTION —
  // "forget:KEY" forgets a cache key, "cancel:ID" cancels a task, "run:TAG" runs one pass with a
  // handler of TAG that succeeds (saying "ran N") — waits 5 ms (so the event is before a zero
  // retention's cutoff), compacts with a retention of zero, says "compacted R" (R events
  // removed), closes and says "closed".
  "act-then-compact": Mode(usage: "DIR forget:KEY|cancel:ID|run:TAG [segment]") { call in
    call.expect(1...2)
    let action = call.words[0]
    let segment = call.flag(1, "segment")
    call.runAsync {
      let store = try await FerryStore.open(
        at: call.directory, configuration: storeConfiguration(existing: true, segment: segment))
      if action.hasPrefix("forget:") {
        try await store.ledger.forget(String(action.dropFirst("forget:".count)))
      } else if action.hasPrefix("cancel:"), let id = TaskID(String(action.dropFirst("cancel:".count))) {
        try await store.queue.cancel(id)
      } else if action.hasPrefix("run:") {
        let runner = TaskRunner(queue: store.queue)
        runner.register(tag: String(action.dropFirst("run:".count))) { _ in .succeeded }
        let report = try await runner.run()
        say("ran \(report.entries.count)")
      } else {
        fail("unknown action \(action)")
      }
      try await Task.sleep(for: .milliseconds(5))
      let report = try await store.compact(retention: .zero)
      say("compacted \(report.removed)")
      store.close()
      say("closed")
    }
  },
]
