// Modes that run a store's tasks from another process: the runner's side of cross-process tests.
@_spi(Engine) @_spi(Experimental) import Ferry
import FerryLog
import Foundation

/// Word `index` as the runner's concurrency (1 when missing or not a number).
private func concurrency(_ call: Invocation, _ index: Int) -> Int {
  call.word(index).flatMap { Int($0) } ?? 1
}

let runModes: [String: Mode] = [
  // Adds one task and runs it with a handler that never returns, after saying "running ID".
  // The parent kills this process there: a run started and never finished. Crash points are
  // armed from the environment.
  "run-and-hang": Mode(usage: "DIR") { call in
    CrashPoint.armFromEnvironment()
    call.runAsync {
      let queue = try await TaskQueue.open(at: call.directory)
      let id = try await queue.add(tag: "hang", payload: ["item": "milk"], groupId: "list")
      let runner = TaskRunner(queue: queue)
      runner.register(tag: "hang") { task in
        say("running \(task.id)")
        while true { try? await Task.sleep(for: .seconds(60)) }
      }
      _ = try await runner.run()
      say("unexpected end \(id)")
    }
  },
  // Runs passes over the store's "job" tasks until nothing is runnable, printing "ran ID ATTEMPT"
  // as each handler starts. A job's payload says what its handler does: "ok" succeeds, "fail"
  // fails for good, "error" records an error, "crash" kills this process mid-run (SIGKILL) on its
  // first attempt and succeeds after. Every handler sleeps a millisecond first, so that two
  // runners overlap.
  "run-tasks": Mode(usage: "DIR [CONCURRENCY]") { call in
    call.runAsync {
      let queue = try await TaskQueue.open(at: call.directory)
      var configuration = TaskRunner.Configuration()
      configuration.maxConcurrentTasks = concurrency(call, 0)
      let runner = TaskRunner(queue: queue, configuration: configuration)
      runner.register(tag: "job") { task in
        say("ran \(task.id) \(task.attempt)")
        try? await Task.sleep(for: .milliseconds(1))
        switch try task.payload(as: [String: String].self)["kind"] {
        case "fail": return .failed("refused", retryable: false)
        case "error": return .recordError("fix it")
        case "crash" where task.attempt == 1: kill(getpid(), SIGKILL)
        default: break
        }
        return .succeeded
      }
      try await runUntilIdle(runner) { try queue.nextRunnable().map { $0.tag == "job" } ?? false }
      queue.close()
      say("done")
    }
  },
  // Runs passes over the store's offline-created notes until nothing of theirs is runnable: a
  // "create" handler says "key ID ATTEMPT KEY" and returns the server's id as its output (a
  // create whose payload says "crash" SIGKILLs this process on its first attempt, after saying
  // its key: the server applied it, the outcome was never logged); an "edit" handler reads its
  // create's output and says "edit ID SERVERID KEY".
  "sync-run": Mode(usage: "DIR [CONCURRENCY]") { call in
    call.runAsync {
      let store = try await FerryStore.open(at: call.directory)
      var configuration = TaskRunner.Configuration()
      configuration.maxConcurrentTasks = concurrency(call, 0)
      let runner = TaskRunner(queue: store.queue, configuration: configuration)
      runner.register(tag: "create") { task in
        say("key \(task.id) \(task.attempt) \(task.idempotencyKey)")
        if try task.payload(as: [String: String].self)["kind"] == "crash" && task.attempt == 1 {
          kill(getpid(), SIGKILL)
        }
        return .succeeded(output: try TaskOutput("srv-\(task.id)"), invalidating: ["notes"])
      }
      runner.register(tag: "edit") { task in
        guard let create = TaskID(try task.payload(as: [String: String].self)["create"] ?? ""),
          let output = try store.queue.output(of: create)
        else { return .recordError("no server id") }
        say("edit \(task.id) \(try output.decode(as: String.self)) \(task.idempotencyKey)")
        return .succeeded
      }
      try await runUntilIdle(runner) { try store.queue.nextRunnable() != nil }
      store.close()
      say("done")
    }
  },
  // Runs passes with a batched "note" handler (batch size SIZE) until nothing is runnable; each
  // call says "batch ID:ATTEMPT:KEY ..." in the order it was given its tasks. With "kill", a call
  // holding a task whose payload says "crash" on its first attempt SIGKILLs this process after
  // saying so: the server had the batch, the outcomes were never logged. A task whose payload
  // says "fail" fails on its first attempt (retryable at once), and the handler says the rest of
  // the batch succeeded. The crash points are armed from the environment.
  "batch-run": Mode(usage: "DIR SIZE [kill]") { call in
    let size = call.number(0)
    let kills = call.word(1) == "kill"
    CrashPoint.armFromEnvironment()
    call.runAsync {
      let store = try await FerryStore.open(at: call.directory)
      let runner = TaskRunner(queue: store.queue)
      runner.register(tag: "note", batchSize: size, retry: RetryPolicy(initialDelay: .zero, jitter: 0)) {
        tasks in
        say("batch " + tasks.map { "\($0.id):\($0.attempt):\($0.idempotencyKey)" }.joined(separator: " "))
        var results: [TaskID: TaskResult] = [:]
        for task in tasks {
          let kind = try task.payload(as: [String: String].self)["kind"]
          if kills, task.attempt == 1, kind == "crash" {
            kill(getpid(), SIGKILL)
          }
          results[task.id] = kind == "fail" && task.attempt == 1 ? .failed("rejected once") : .succeeded
        }
        return results
      }
      try await runUntilIdle(runner) { try store.queue.nextRunnable() != nil }
      store.close()
      say("done")
    }
  },
  // Adds one "gated" task (in GROUP when given) and runs it; its handler says "running ID
  // ATTEMPT", waits until the file GATE exists, then succeeds. Says "done OUTCOME" after the pass.
  "run-gated": Mode(usage: "DIR GATE [GROUP]") { call in
    call.expect(1...2)
    let gate = call.words[0]
    let group = call.word(1)
    call.runAsync {
      let queue = try await TaskQueue.open(at: call.directory)
      let id = try await queue.add(tag: "gated", payload: ["n": 1], groupId: group)
      let runner = TaskRunner(queue: queue)
      runner.register(tag: "gated") { task in
        say("running \(task.id) \(task.attempt)")
        while !FileManager.default.fileExists(atPath: gate) { try? await Task.sleep(for: .milliseconds(10)) }
        return .succeeded
      }
      let report = try await runner.run()
      say("done \(String(describing: report.outcome(of: id)))")
      queue.close()
    }
  },
  // Runs one task by id (`run(.task(ID))`) with handlers for "gated" and "hang" that say "ran ID
  // ATTEMPT" and succeed; says "waiting" before and "outcome OUTCOME" after.
  "run-one": Mode(usage: "DIR ID") { call in
    call.expect(1...1)
    let id = TaskID(rawValue: call.number(0, as: UInt64.self))
    call.runAsync {
      let queue = try await TaskQueue.open(at: call.directory)
      let runner = TaskRunner(queue: queue)
      for tag in ["gated", "hang"] {
        runner.register(tag: tag) { task in
          say("ran \(task.id) \(task.attempt)")
          return .succeeded
        }
      }
      say("waiting")
      let report = try await runner.run(.task(id))
      say("outcome \(String(describing: report.outcome(of: id)))")
      queue.close()
    }
  },
  // Opens the existing store (it follows the store's mode) and runs one task by id
  // (`run(.task(ID))`) with a handler for every tag in TAGS (comma-separated) that says "ran ID
  // ATTEMPT" and, by RESULT, succeeds ("ok") or fails retryably after 200 ms ("retry"); says
  // "outcome OUTCOME" and exits without running anything else.
  "run-one-with-result": Mode(usage: "DIR ID TAGS ok|retry") { call in
    guard call.words.count == 3, let id = TaskID(call.words[0]) else {
      say("failed usage")
      call.usageError()
    }
    let tags = call.words[1].split(separator: ",").map(String.init)
    let result = call.words[2]
    call.runAsync(announce: true) {
      let queue = try await TaskQueue.open(
        at: call.directory, configuration: storeConfiguration(existing: true))
      var configuration = TaskRunner.Configuration()
      configuration.random = { 0.5 }
      let runner = TaskRunner(queue: queue, configuration: configuration)
      let retry = RetryPolicy(initialDelay: .milliseconds(200), jitter: 0)
      for tag in tags {
        runner.register(tag: tag, retry: retry) { task in
          say("ran \(task.id) \(task.attempt)")
          return result == "retry" ? .failed("try again", retryable: true) : .succeeded
        }
      }
      let report = try await runner.run(.task(id))
      say("outcome \(String(describing: report.outcome(of: id)))")
      queue.close()
    }
  },
  // Adds a task, uses up every file descriptor, runs a pass (says "first ok OUTCOME" or "first
  // error E"), gives the descriptors back and runs again (says "second OUTCOME").
  "run-without-descriptors": Mode(usage: "DIR") { call in
    call.runAsync {
      let queue = try await TaskQueue.open(at: call.directory)
      let id = try await queue.add(tag: "t", payload: ["n": 1])
      let runner = TaskRunner(queue: queue)
      runner.register(tag: "t") { _ in .succeeded }
      var limit = rlimit()
      getrlimit(openFilesLimit, &limit)
      limit.rlim_cur = 256
      setrlimit(openFilesLimit, &limit)
      var hogs: [Int32] = []
      while true {
        let fd = open("/dev/null", O_RDONLY)
        if fd < 0 { break }
        hogs.append(fd)
      }
      do {
        let report = try await runner.run()
        say("first ok \(String(describing: report.outcome(of: id)))")
      } catch {
        say("first error \(error)")
      }
      for fd in hogs { close(fd) }
      let report = try await runner.run()
      say("second \(String(describing: report.outcome(of: id)))")
      queue.close()
    }
  },
  // Opens the existing store (with the write-ahead segment when "segment" is given) and runs
  // passes with CONCURRENCY workers over its "job" tasks until none is ready, running or waiting,
  // printing "ran ID ATTEMPT" as each handler starts. A job's payload "kind" says what its handler
  // does after sleeping a millisecond: "ok" succeeds, "fail" fails for good, "error" records an
  // error, "flaky" fails retryably on its first attempt (retried after 5 ms) and succeeds after.
  // Says "done" after closing.
  "run-jobs-until-idle": Mode(usage: "DIR CONCURRENCY [segment]") { call in
    call.expect(1...2)
    let lanes = call.number(0)
    let segment = call.flag(1, "segment")
    call.runAsync(announce: true) {
      let queue = try await TaskQueue.open(
        at: call.directory, configuration: storeConfiguration(existing: true, segment: segment))
      var configuration = TaskRunner.Configuration()
      configuration.maxConcurrentTasks = lanes
      let runner = TaskRunner(queue: queue, configuration: configuration)
      let retry = RetryPolicy(maxAttempts: 5, initialDelay: .milliseconds(5), jitter: 0)
      runner.register(tag: "job", retry: retry) { task in
        say("ran \(task.id) \(task.attempt)")
        try? await Task.sleep(for: .milliseconds(1))
        switch try task.payload(as: [String: String].self)["kind"] {
        case "fail": return .failed("refused", retryable: false)
        case "error": return .recordError("fix it")
        case "flaky" where task.attempt == 1: return .failed("try again", retryable: true)
        default: return .succeeded
        }
      }
      // A pass's dead-owner check and the queue read below read the projections outside the
      // writer: behind another process resetting them again and again (a rebuild loop) a read
      // runs in this process's writer transaction (EventLog.read), and throws projectionNotCurrent
      // only when that writer does not get to it within four seconds. As an app would, try
      // again; say "notCurrent WHERE".
      func retried<R>(_ label: String, _ body: () async throws -> R) async throws -> R {
        while true {
          do {
            return try await body()
          } catch let error where isNotCurrent(error) {
            say("notCurrent \(label)")
            try await Task.sleep(for: .milliseconds(5))
          }
        }
      }
      var idle = 0
      while idle < 3 {
        let report = try await retried("run") { try await runner.run() }
        let busy = try await retried("read") {
          try queue.pendingTasks().contains { task in
            switch task.status {
            case .ready, .running, .waiting: return true
            default: return false
            }
          }
        }
        idle = report.entries.isEmpty && !busy ? idle + 1 : 0
        if report.entries.isEmpty { try await Task.sleep(for: .milliseconds(5)) }
      }
      queue.close()
      say("done")
    }
  },
  // Opens the existing store (with the write-ahead segment when "segment" is given) and runs its
  // "job" tasks automatically with CONCURRENCY lanes until the file STOP exists; each handler says
  // "ran ID ATTEMPT", sleeps 0-15 ms and then succeeds, or for payload kind "flaky" fails
  // retryably on its first attempt (retried after 5 ms). Says "done".
  "run-automatically-until-stop": Mode(usage: "DIR CONCURRENCY STOP [segment]") { call in
    call.expect(2...3)
    let lanes = call.number(0)
    let stop = call.words[1]
    let segment = call.flag(2, "segment")
    call.runAsync(announce: true) {
      let queue = try await TaskQueue.open(
        at: call.directory, configuration: storeConfiguration(existing: true, segment: segment))
      var configuration = TaskRunner.Configuration()
      configuration.maxConcurrentTasks = lanes
      configuration.deadOwnerCheckInterval = .milliseconds(100)
      let runner = TaskRunner(queue: queue, configuration: configuration)
      let retry = RetryPolicy(maxAttempts: 50, initialDelay: .milliseconds(5), jitter: 0)
      runner.register(tag: "job", retry: retry) { task in
        say("ran \(task.id) \(task.attempt)")
        try? await Task.sleep(for: .milliseconds(Int.random(in: 0...15)))
        if try task.payload(as: [String: String].self)["kind"] == "flaky" && task.attempt == 1 {
          return .failed("try again", retryable: true)
        }
        return .succeeded
      }
      runner.startAutomaticRunning()
      while !FileManager.default.fileExists(atPath: stop) { try await Task.sleep(for: .milliseconds(20)) }
      runner.stop()
      try? await Task.sleep(for: .milliseconds(300))
      queue.close()
      say("done")
    }
  },
]
