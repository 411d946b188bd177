// Modes that hold a store open, act on it as the operator command does, or cycle it open and
// closed.
@_spi(Engine) @_spi(Experimental) import Ferry
import FerryLog
import FerryTools
import Foundation

let storeModes: [String: Mode] = [
  // Opens the existing store (never creating one), says "open HEAD", and keeps it open until its
  // standard input ends; then closes it and says "closed".
  "hold-open": Mode(usage: "DIR") { call in
    call.runAsync {
      let store = try await FerryStore.open(
        at: call.directory, configuration: storeConfiguration(existing: true))
      say("open \(try store.log.head())")
      while let _ = readLine() {}
      store.close()
      say("closed")
    }
  },
  // Runs the `ferry` operator command ACTION (cancel-group GROUP, cancel ID, pause, resume) on the
  // store in this process, crash points armed from the environment
  // (FERRY_CRASH_POINT=append.beforeCommit or segment.frameFlushed, say); says "status S" when it
  // returns, "refused S M" when it throws.
  "operate": Mode(usage: "DIR cancel-group GROUP | cancel ID | pause | resume") { call in
    let action: OperatorAction
    switch (call.word(0), call.word(1)) {
    case ("cancel-group", let group?): action = .cancelGroup(group)
    case ("cancel", let id?): action = .cancel([TaskID(id) ?? TaskID(rawValue: 0)])
    case ("pause", nil): action = .pause
    case ("resume", nil): action = .resume
    default: call.usageError()
    }
    CrashPoint.armFromEnvironment()
    call.runAsync {
      do throws(ToolError) {
        let status = try await operate(
          path: call.directory, action, json: false, output: Output(line: { _ in }))
        say("status \(status.rawValue)")
      } catch {
        say("refused \(error.status.rawValue) \(error.message)")
      }
    }
  },
  // COUNT times: opens the store (with the write-ahead segment when asked), adds a task, runs a
  // pass, records a cache fetch, reads the queue, closes. Says "fds A B" with the number of open
  // descriptors after the second cycle (A) and after the last (B): a cycle that leaks one (a
  // segment, head-mark, liveness-token or lock file left open) shows as B > A.
  "fd-cycles": Mode(usage: "DIR COUNT [segment]") { call in
    call.expect(1...2)
    let count = call.number(0)
    guard count >= 2 else { call.usageError() }
    let segment = call.flag(1, "segment")
    let openDescriptors: @Sendable () -> Int = {
      (try? FileManager.default.contentsOfDirectory(atPath: openDescriptorsDirectory).count) ?? -1
    }
    call.runAsync {
      // One cycle in a closure of its own, so that its objects are gone when it returns (a runner
      // or store that outlived its cycle would hold descriptors until then, at one count only).
      let runCycle: @Sendable (Int) async throws -> Void = { cycle in
        let store = try await FerryStore.open(
          at: call.directory, configuration: storeConfiguration(segment: segment))
        let id = try await store.queue.add(tag: "t", payload: ["cycle": cycle])
        let runner = TaskRunner(queue: store.queue)
        runner.register(tag: "t") { _ in .succeeded }
        guard case .succeeded = try await runner.run(.task(id)).outcome(of: id) else {
          fail("fd-cycles: task \(id) did not succeed")
        }
        try await store.ledger.recordFetch(key: "k\(cycle % 3)", outcome: .success(isEmpty: false))
        _ = try store.queue.pendingTasks()
        store.close()
      }
      var afterFirst = 0
      for cycle in 1...count {
        try await runCycle(cycle)
        // A closed store's last descriptors may go a moment after `close()` returns (threads ending).
        if cycle == 2 {
          try await Task.sleep(for: .milliseconds(200))
          afterFirst = openDescriptors()
        }
      }
      try await Task.sleep(for: .milliseconds(200))
      say("fds \(afterFirst) \(openDescriptors())")
    }
  },
]
