// A helper process for Ferry's own tests: it acts on a store from another process, which is the
// only way to exercise what LMDB does across processes (map resizing, concurrent readers, locks).
import CFerryLMDB
@_spi(Engine) @_spi(Experimental) import Ferry
import FerryLog
import FerryTools
import Foundation
import LMDB
import Synchronization

/// A directory that lists this process's open descriptors (Apple platforms have no /proc).
#if canImport(Glibc)
  let openDescriptorsDirectory = "/proc/self/fd"
#else
  let openDescriptorsDirectory = "/dev/fd"
#endif

/// The resource `getrlimit` names the open-descriptor limit by: an enum case on Linux, a plain
/// number on Apple platforms.
#if canImport(Glibc)
  let openFilesLimit = Int32(RLIMIT_NOFILE.rawValue)
#else
  let openFilesLimit = RLIMIT_NOFILE
#endif

/// Writes a line straight to file descriptor 1 (no buffering), so the parent sees it even if this
/// process is killed right after.
func say(_ line: String) {
  FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// Runs passes until three in a row ran nothing while `workLeft` said no: tasks of a tag this
/// process has no handler for stay runnable for ever and must not keep the loop spinning.
func runUntilIdle(_ runner: TaskRunner, workLeft: () throws -> Bool) async throws {
  var idle = 0
  while idle < 3 {
    let report = try await runner.run()
    let ranSomething = report.entries.contains { entry in
      if case .skipped = entry.outcome { return false } else { return true }
    }
    idle = try ranSomething || workLeft() ? 0 : idle + 1
  }
}

func fail(_ message: String) -> Never {
  FileHandle.standardError.write(Data((message + "\n").utf8))
  exit(2)
}

let arguments = CommandLine.arguments
guard arguments.count >= 3 else {
  fail(
    "usage: ferry-test-worker grow-map DIR BYTES | append DIR COUNT | add-tasks DIR COUNT | run-and-hang DIR"
      + " | hold-open DIR")
}
let command = arguments[1]
let directory = arguments[2]

switch command {
case "grow-map":
  // Writes into database "data" until the map has grown to at least BYTES.
  guard arguments.count == 4, let target = Int(arguments[3]) else { fail("grow-map DIR BYTES") }
  do {
    let env = try Environment.open(path: directory, databases: ["data"])
    let db = try env.database("data")
    var key: UInt64 = 1 << 32
    while env.mapSize < target {
      try env.write { txn in
        for _ in 0..<64 {
          key += 1
          try txn.put(db, key: key.bigEndianBytes, value: [UInt8](repeating: 7, count: 4096))
        }
      }
    }
    say("mapsize \(env.mapSize)")
    env.close()
  } catch {
    fail("grow-map failed: \(error)")
  }
case "append":
  // Appends COUNT events of type "worker.event" one by one, printing "ack SEQ" after each.
  guard arguments.count == 4, let count = Int(arguments[3]) else { fail("append DIR COUNT") }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      let log = try EventLog.open(at: directory)
      for i in 0..<count {
        let sequence = try await log.append(
          NewEvent(type: "worker.event", payload: Array("worker \(i)".utf8)))
        say("ack \(sequence)")
      }
      log.close()
    } catch {
      fail("append failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "add-tasks":
  // Opens the store (creating it when missing) and adds COUNT tasks one by one, tag "app" and
  // data id "app-I", printing "ack ID I" once each add has returned. Exits 3 when the open fails.
  guard arguments.count == 4, let count = Int(arguments[3]) else { fail("add-tasks DIR COUNT") }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    let queue: TaskQueue
    do {
      queue = try await TaskQueue.open(at: directory)
    } catch {
      FileHandle.standardError.write(Data("open failed: \(error)\n".utf8))
      exit(3)
    }
    do {
      for i in 0..<count {
        let id = try await queue.add(tag: "app", payload: ["n": i], dataId: "app-\(i)")
        say("ack \(id) \(i)")
      }
      queue.close()
    } catch {
      fail("add-tasks failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "run-and-hang":
  // Adds one task and runs it with a handler that never returns, after saying "running ID".
  // The parent kills this process there: a run started and never finished. Crash points are
  // armed from the environment.
  CrashPoint.armFromEnvironment()
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      let queue = try await TaskQueue.open(at: directory)
      let id = try await queue.add(tag: "hang", payload: ["item": "milk"], groupId: "list")
      let runner = TaskRunner(queue: queue)
      runner.register(tag: "hang") { task in
        say("running \(task.id)")
        while true { try? await Task.sleep(for: .seconds(60)) }
      }
      _ = try await runner.run()
      say("unexpected end \(id)")
    } catch {
      fail("run-and-hang failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "run-tasks":
  // Runs passes over the store's "job" tasks until nothing is runnable, printing "ran ID ATTEMPT"
  // as each handler starts. A job's payload says what its handler does: "ok" succeeds, "fail"
  // fails for good, "error" records an error, "crash" kills this process mid-run (SIGKILL) on its first attempt and succeeds after.
  // Every handler sleeps a millisecond first, so that two runners overlap.
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      let queue = try await TaskQueue.open(at: directory)
      var configuration = TaskRunner.Configuration()
      configuration.maxConcurrentTasks = arguments.count > 3 ? Int(arguments[3]) ?? 1 : 1
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
    } catch {
      fail("run-tasks failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "sync-run":
  // Runs passes over the store's offline-created notes until nothing of theirs is runnable: a
  // "create" handler says "key ID ATTEMPT KEY" and returns the server's id as its output (a
  // create whose payload says "crash" SIGKILLs this process on its first attempt, after saying
  // its key: the server applied it, the outcome was never logged); an "edit" handler reads its
  // create's output and says "edit ID SERVERID KEY".
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      let store = try await FerryStore.open(at: directory)
      var configuration = TaskRunner.Configuration()
      configuration.maxConcurrentTasks = arguments.count > 3 ? Int(arguments[3]) ?? 1 : 1
      let runner = TaskRunner(queue: store.queue, configuration: configuration)
      runner.register(tag: "create") { task in
        say("key \(task.id) \(task.attempt) \(task.idempotencyKey)")
        if try task.payload(as: [String: String].self)["kind"] == "crash" && task.attempt == 1 {
          kill(getpid(), SIGKILL)
        }
        return .succeeded(output: try TaskOutput("srv-\(task.id)"), invalidating: ["notes"])
      }
      runner.register(tag: "edit") { task in
        guard let create = UInt64(try task.payload(as: [String: String].self)["create"] ?? ""),
          let output = try store.queue.output(of: create)
        else { return .recordError("no server id") }
        say("edit \(task.id) \(try output.decode(as: String.self)) \(task.idempotencyKey)")
        return .succeeded
      }
      try await runUntilIdle(runner) { try store.queue.nextRunnable() != nil }
      store.close()
      say("done")
    } catch {
      fail("sync-run failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "batch-run":
  // Runs passes with a batched "note" handler (batch size SIZE) until nothing is runnable; each
  // call says "batch ID:ATTEMPT:KEY ..." in the order it was given its tasks. With "kill", a call
  // holding a task whose payload says "crash" on its first attempt SIGKILLs this process after
  // saying so: the server had the batch, the outcomes were never logged. A task whose payload
  // says "fail" fails on its first attempt (retryable at once), and the handler says the rest of
  // the batch succeeded. The crash points are armed from the environment.
  guard arguments.count >= 4, let size = Int(arguments[3]) else { fail("batch-run DIR SIZE [kill]") }
  let kills = arguments.count > 4 && arguments[4] == "kill"
  CrashPoint.armFromEnvironment()
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      let store = try await FerryStore.open(at: directory)
      let runner = TaskRunner(queue: store.queue)
      runner.register(tag: "note", batchSize: size, retry: RetryPolicy(initialDelay: .zero, jitter: 0)) { tasks in
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
    } catch {
      fail("batch-run failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "record-fetch":
  // Records a successful fetch of KEY (now, or at MS: Unix milliseconds — the time of a parent's
  // test clock) in the store, as another process refreshing a cache.
  guard arguments.count == 4 || arguments.count == 5 else { fail("record-fetch DIR KEY [MS]") }
  let at: Date?
  if arguments.count == 5 {
    guard let ms = Double(arguments[4]) else { fail("record-fetch DIR KEY [MS]: MS is not a number") }
    at = Date(timeIntervalSince1970: ms / 1000)
  } else {
    at = nil
  }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      let store = try await FerryStore.open(at: directory)
      try await store.ledger.recordFetch(key: arguments[3], outcome: .success(isEmpty: false), at: at)
      store.close()
      say("recorded")
    } catch {
      fail("record-fetch failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "segment-append":
  // Opens the log with the write-ahead segment asked for (ON) or not (OFF — it then follows what
  // the store does), appends COUNT events one by one printing "ack SEQ", then says "holding" and
  // waits to be killed (its frames stay past the last checkpoint).
  // With SIZE, each payload is "worker N" padded with "x" to SIZE bytes (a batch past the
  // segment's size when SIZE is large); with CHECKPOINT, segmentCheckpointCommits is that.
  guard (5...7).contains(arguments.count), let count = Int(arguments[3]) else {
    fail("segment-append DIR COUNT ON|OFF [SIZE [CHECKPOINT]]")
  }
  let size = arguments.count > 5 ? Int(arguments[5]) ?? 0 : 0
  let checkpointEvery = arguments.count > 6 ? Int(arguments[6]) : nil
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var configuration = EventLog.Configuration()
      configuration.writeAheadSegment = arguments[4] == "ON"
      if let checkpointEvery { configuration.segmentCheckpointCommits = checkpointEvery }
      let log = try EventLog.open(at: directory, configuration: configuration)
      for i in 0..<count {
        var bytes = Array("worker \(i)".utf8)
        if bytes.count < size { bytes += [UInt8](repeating: UInt8(ascii: "x"), count: size - bytes.count) }
        let sequence = try await log.append(NewEvent(type: "worker.event", payload: bytes))
        say("ack \(sequence)")
      }
      say("holding")
      while true { try await Task.sleep(for: .seconds(60)) }
    } catch {
      fail("segment-append failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "segment-share-rebuild":
  // Opens the log (the segment not asked for: it follows what the store does) with the
  // "payloads" projection (each payload by sequence), says "open", waits for a line on standard
  // input, then rebuilds that projection in chunks of CHUNK events and says "rebuilt". The crash
  // points are armed from the environment (FERRY_CRASH_POINT=rebuild.chunk kills it mid-rebuild).
  guard arguments.count == 4, let chunk = Int(arguments[3]) else { fail("segment-share-rebuild DIR CHUNK") }
  CrashPoint.armFromEnvironment()
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var configuration = EventLog.Configuration(projections: [WorkerPayloads()])
      configuration.rebuildChunkSize = chunk
      configuration.createIfMissing = false
      let log = try EventLog.open(at: directory, configuration: configuration)
      say("open \(try log.head())")
      _ = readLine()
      _ = try await log.rebuild()
      say("rebuilt")
      while true { try await Task.sleep(for: .seconds(60)) }
    } catch {
      fail("segment-share-rebuild failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "store-rebuild":
  // Opens the store (every projection of a FerryStore) with rebuildChunkSize CHUNK — and the
  // write-ahead segment asked for with "segment" — says "open", waits for a line on standard
  // input, rebuilds every projection and says "rebuilt", then waits for another line, closes and
  // says "closed". Crash points are armed from the environment (FERRY_CRASH_POINT=rebuild.chunk
  // kills it after its first chunk of the rebuild).
  guard (4...5).contains(arguments.count), let chunk = Int(arguments[3]),
    arguments.count == 4 || arguments[4] == "segment"
  else { fail("store-rebuild DIR CHUNK [segment]") }
  CrashPoint.armFromEnvironment()
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var configuration = FerryStore.Configuration()
      configuration.rebuildChunkSize = chunk
      configuration.writeAheadSegment = arguments.count == 5
      let store = try await FerryStore.open(at: directory, configuration: configuration)
      say("open")
      _ = readLine()
      _ = try await store.log.rebuild()
      say("rebuilt")
      _ = readLine()
      store.close()
      say("closed")
    } catch {
      fail("store-rebuild failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "attack-nested-read":
  // Opens the store read-write (with rebuildChunkSize CHUNK when given), says "open", and on a
  // line on standard input reads the queue from inside another
  // EventLog.read (the outer snapshot held): says "read N growths G adoptions A", or
  // "error E" when the read throws; then closes and says "closed". A hang is the failure
  // the caller looks for. Crash points are armed from the environment (FERRY_CRASH_POINT=
  // rebuild.chunk kills it after the first chunk of a catch-up).
  CrashPoint.armFromEnvironment()
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var configuration = FerryStore.Configuration()
      configuration.createIfMissing = false
      if arguments.count == 4, let chunk = Int(arguments[3]) { configuration.rebuildChunkSize = chunk }
      let store = try await FerryStore.open(at: directory, configuration: configuration)
      let info = try store.log.storageInfo()
      say("open mapsize \(info.mapSize) used \(info.usedBytes)")
      _ = readLine()
      do {
        // The inner read is the engine's own: its refusal is what the outer read catches up on.
        let n = try store.log.read { _ in try store.log.read { try FerryStore.snapshot(of: $0) }.tasks.count }
        let counters = store.log.storageCounters
        say("read \(n) growths \(counters.mapGrowths) adoptions \(counters.mapAdoptions)")
      } catch {
        say("error \(error)")
      }
      store.close()
      say("closed")
    } catch {
      fail("attack-nested-read failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "attack-version-open":
  // Opens the log with one EventTypeCounts projection "attackCounts" at VERSION (a changed
  // version is rebuilt at open), says "open HEAD", and on a line on standard input closes and
  // says "closed".
  guard arguments.count == 4, let version = UInt32(arguments[3]) else { fail("attack-version-open DIR VERSION") }
  do {
    let log = try EventLog.open(
      at: directory,
      configuration: EventLog.Configuration(projections: [EventTypeCounts(name: "attackCounts", version: version)]))
    say("open \(try log.head())")
    _ = readLine()
    log.close()
    say("closed")
  } catch {
    fail("attack-version-open failed: \(error)")
  }
case "attack-projections-append":
  // Opens the log with EventTypeCounts projections named and versioned by SPEC ("name:version,…",
  // or "-" for none), appends COUNT events (types "t0"…"t2", in batches of 50), says "head H",
  // closes and says "closed".
  guard arguments.count == 5, let count = Int(arguments[4]) else { fail("attack-projections-append DIR SPEC COUNT") }
  let projections: [any Projection] =
    arguments[3] == "-"
    ? []
    : arguments[3].split(separator: ",").map { item in
      let parts = item.split(separator: ":")
      return EventTypeCounts(name: String(parts[0]), version: UInt32(parts[1])!)
    }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      let log = try EventLog.open(at: directory, configuration: EventLog.Configuration(projections: projections))
      var appended = 0
      while appended < count {
        let batch = min(50, count - appended)
        _ = try await log.append((0..<batch).map { NewEvent(type: "t\(($0 + appended) % 3)", payload: Array("w".utf8)) })
        appended += batch
      }
      say("head \(try log.head())")
      log.close()
      say("closed")
    } catch {
      fail("attack-projections-append failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "attack-rebuild-loop":
  // Opens the store with rebuildChunkSize CHUNK, says "open", then rebuilds every projection
  // ROUNDS times (saying "round I" after each), says "done", closes and says "closed".
  guard arguments.count == 5, let chunk = Int(arguments[3]), let rounds = Int(arguments[4]) else {
    fail("attack-rebuild-loop DIR CHUNK ROUNDS")
  }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var configuration = FerryStore.Configuration()
      configuration.rebuildChunkSize = chunk
      configuration.createIfMissing = false
      let store = try await FerryStore.open(at: directory, configuration: configuration)
      say("open")
      for round in 0..<rounds {
        _ = try await store.log.rebuild()
        say("round \(round)")
      }
      say("done")
      store.close()
      say("closed")
    } catch {
      fail("attack-rebuild-loop failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "attack-segment-read-add":
  // Opens the store with the write-ahead segment, says "open", and on a line on standard input
  // reads the pending tasks (saying "read N", or
  // "error E"), then adds COUNT tasks one by one (tag "late", data id "late-I") printing
  // "ack ID I", and says "holding" until killed or a line arrives on standard input.
  guard arguments.count == 4, let count = Int(arguments[3]) else { fail("attack-segment-read-add DIR COUNT") }
  CrashPoint.armFromEnvironment()
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var configuration = FerryStore.Configuration()
      configuration.writeAheadSegment = true
      let store = try await FerryStore.open(at: directory, configuration: configuration)
      say("open")
      _ = readLine()
      do {
        say("read \(try store.queue.pendingTasks().count)")
      } catch {
        say("error \(error)")
      }
      for i in 0..<count {
        let id = try await store.queue.add(tag: "late", payload: ["n": i], dataId: "late-\(i)")
        say("ack \(id) \(i)")
      }
      say("holding")
      _ = readLine()
      store.close()
      say("closed")
    } catch {
      fail("attack-segment-read-add failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "store-segment-add":
  // Opens the store with the write-ahead segment asked for, adds COUNT tasks one by one (tag
  // "app", data id "app-I") printing "ack ID I", says "holding", and on a line on standard input
  // closes the store and says "closed" (or is killed before).
  guard arguments.count == 4, let count = Int(arguments[3]) else { fail("store-segment-add DIR COUNT") }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var configuration = FerryStore.Configuration()
      configuration.writeAheadSegment = true
      let store = try await FerryStore.open(at: directory, configuration: configuration)
      for i in 0..<count {
        let id = try await store.queue.add(tag: "app", payload: ["n": i], dataId: "app-\(i)")
        say("ack \(id) \(i)")
      }
      say("holding")
      _ = readLine()
      store.close()
      say("closed")
    } catch {
      fail("store-segment-add failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "compact-copy":
  // Runs `ferry compact --copy DIR` (retention 0) in this process, crash points armed from the
  // environment (FERRY_CRASH_POINT=compact.swapped with FERRY_CRASH_SIGNAL=STOP stops it right
  // after the copy was renamed into place, compact.copied right after the copy was made); says "compacted" when it returns, "refused S M" when
  // it throws (its exit status S). FERRY_FAIL_FLUSH=compact.copy (or compact.directory) makes
  // that flush fail.
  CrashPoint.armFromEnvironment()
  DiskFlush.armFromEnvironment()
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do throws(ToolError) {
      try await compact(path: directory, retentionMs: 0, copy: true, output: Output(line: { _ in }))
      say("compacted")
    } catch {
      say("refused \(error.status.rawValue) \(error.message)")
    }
    done.signal()
  }
  done.wait()
case "log-head":
  // Opens the log read-only (no projections) and says "head N"; exits 4 when the open is refused.
  do {
    var configuration = EventLog.Configuration()
    configuration.readOnly = true
    let log = try EventLog.open(at: directory, configuration: configuration)
    say("head \(try log.head())")
    log.close()
  } catch {
    say("refused \(error)")
    exit(4)
  }
case "hold-open":
  // Opens the existing store (never creating one), says "open HEAD", and keeps it open until its
  // standard input ends; then closes it and says "closed".
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var configuration = FerryStore.Configuration()
      configuration.createIfMissing = false
      let store = try await FerryStore.open(at: directory, configuration: configuration)
      say("open \(try store.log.head())")
      while let _ = readLine() {}
      store.close()
      say("closed")
    } catch {
      fail("hold-open failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "attack-run-gated":
  // (RunTaskWaitTests and others) Adds one "gated" task (in GROUP when given) and runs it; its handler says
  // "running ID ATTEMPT", waits until the file GATE exists, then succeeds. Says "done OUTCOME"
  // after the pass.
  guard arguments.count == 4 || arguments.count == 5 else { fail("attack-run-gated DIR GATE [GROUP]") }
  let gate = arguments[3]
  let group = arguments.count == 5 ? arguments[4] : nil
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      let queue = try await TaskQueue.open(at: directory)
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
    } catch {
      fail("attack-run-gated failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "attack-run-one":
  // (RunTaskWaitTests) Runs one task by id (`run(.task(ID))`) with handlers for "gated" and "hang"
  // that say "ran ID ATTEMPT" and succeed; says "outcome OUTCOME".
  guard arguments.count == 4, let id = UInt64(arguments[3]) else { fail("attack-run-one DIR ID") }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      let queue = try await TaskQueue.open(at: directory)
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
    } catch {
      fail("attack-run-one failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "push-run-one":
  // (PushCompanyTests) Opens the existing store (it follows the store's mode) and runs one
  // task by id (`run(.task(ID))`) with a handler for every tag in TAGS (comma-separated) that says
  // "ran ID ATTEMPT" and, by RESULT, succeeds ("ok") or fails retryably after 200 ms ("retry");
  // says "outcome OUTCOME" and exits without running anything else.
  guard arguments.count == 6, let id = UInt64(arguments[3]) else {
    say("failed usage")
    fail("push-run-one DIR ID TAGS RESULT")
  }
  let tags = arguments[4].split(separator: ",").map(String.init)
  let result = arguments[5]
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var storeConfiguration = FerryStore.Configuration()
      storeConfiguration.createIfMissing = false
      let queue = try await TaskQueue.open(at: directory, configuration: storeConfiguration)
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
    } catch {
      say("failed \(error)")
      fail("push-run-one failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "push-unique":
  // (PushCompanyTests) Opens the existing store (with the write-ahead segment when "segment"
  // is given) and adds COUNT "job" tasks (payload kind "ok") with data id "dN" (N = i mod 3),
  // unique keep or replace chosen by SEED, printing "ack ID POLICY DATAID" once each add returned.
  guard (5...6).contains(arguments.count), let count = Int(arguments[3]), var seed = UInt64(arguments[4]) else {
    say("failed usage")
    fail("push-unique DIR COUNT SEED [segment]")
  }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var storeConfiguration = FerryStore.Configuration()
      storeConfiguration.createIfMissing = false
      storeConfiguration.writeAheadSegment = arguments.count == 6
      let queue = try await TaskQueue.open(at: directory, configuration: storeConfiguration)
      for i in 0..<count {
        seed = seed &* 6364136223846793005 &+ 1442695040888963407
        let policy: UniquePolicy = (seed >> 33) % 2 == 0 ? .keep : .replace
        let dataId = "d\(i % 3)"
        let id = try await queue.add(tag: "job", payload: ["kind": "ok"], dataId: dataId, unique: policy)
        say("ack \(id) \(policy == .keep ? "keep" : "replace") \(dataId)")
      }
      queue.close()
      say("done")
    } catch {
      say("failed \(error)")
      fail("push-unique failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "attack-run-without-fds":
  // (OwnerTokenTests) Adds a task, uses up every file descriptor, runs a pass (says "first OK|ERROR"),
  // gives the descriptors back and runs again (says "second OUTCOME").
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      let queue = try await TaskQueue.open(at: directory)
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
    } catch {
      fail("attack-run-without-fds failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "fd-cycles":
  // (DescriptorTests) COUNT times: opens the store (with the write-ahead segment when asked),
  // adds a task, runs a pass, records a cache fetch, reads the queue, closes. Says "fds A B" with
  // the number of open descriptors after the second cycle (A) and after the last (B): a cycle that
  // leaks one (a segment, head-mark, liveness-token or lock file left open) shows as B > A.
  guard (4...5).contains(arguments.count), let count = Int(arguments[3]), count >= 2,
    arguments.count == 4 || arguments[4] == "segment"
  else { fail("fd-cycles DIR COUNT [segment]") }
  let openDescriptors: @Sendable () -> Int = {
    (try? FileManager.default.contentsOfDirectory(atPath: openDescriptorsDirectory).count) ?? -1
  }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      // One cycle in a closure of its own, so that its objects are gone when it returns (a runner
      // or store that outlived its cycle would hold descriptors until then, at one count only).
      let runCycle: @Sendable (Int) async throws -> Void = { cycle in
        var configuration = FerryStore.Configuration()
        configuration.writeAheadSegment = arguments.count == 5
        let store = try await FerryStore.open(at: directory, configuration: configuration)
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
    } catch {
      fail("fd-cycles failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "attack2-open-add-close-loop":
  // (CompactCopyRaceTests) For MS milliseconds: opens the store, adds one "app" task with data id
  // "app-I", says "ack ID I" once the add returned, closes, pauses 0-3 ms; again and again. Opens that fail are
  // retried.
  guard arguments.count == 4, let ms = Int(arguments[3]) else { fail("attack2-open-add-close-loop DIR MS") }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    let deadline = Date().addingTimeInterval(Double(ms) / 1000)
    var i = 0
    while Date() < deadline {
      guard let queue = try? await TaskQueue.open(at: directory) else { continue }
      do {
        let id = try await queue.add(tag: "app", payload: ["n": i], dataId: "app-\(i)")
        say("ack \(id) \(i)")
        i += 1
      } catch {
        say("error \(error)")
      }
      queue.close()
      usleep(UInt32.random(in: 0...3000))
    }
    done.signal()
  }
  done.wait()
case "dmg-churn":
  // (damage attack tests) COUNT times: adds a "job" task and runs it to success, printing
  // "done ID" after each run, so that the store gains events compaction may remove.
  guard arguments.count == 4, let count = Int(arguments[3]) else { fail("dmg-churn DIR COUNT") }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      let queue = try await TaskQueue.open(at: directory)
      let runner = TaskRunner(queue: queue)
      runner.register(tag: "job") { _ in .succeeded }
      for i in 0..<count {
        let id = try await queue.add(tag: "job", payload: ["n": i])
        _ = try await runner.run(.task(id))
        say("done \(id)")
      }
      queue.close()
    } catch {
      fail("dmg-churn failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "company-run":
  // (RebuildCompactionCompanyTests) Opens the existing store (with the write-ahead segment when "segment" is
  // given) and runs passes with CONCURRENCY workers over its "job" tasks until none is ready,
  // running or waiting, printing "ran ID ATTEMPT" as each handler starts. A job's payload "kind"
  // says what its handler does after sleeping a millisecond: "ok" succeeds, "fail" fails for good,
  // "error" records an error, "flaky" fails retryably on its first attempt (retried after 5 ms)
  // and succeeds after. Says "done" after closing.
  guard (4...5).contains(arguments.count), let concurrency = Int(arguments[3]),
    arguments.count == 4 || arguments[4] == "segment"
  else { fail("company-run DIR CONCURRENCY [segment]") }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var storeConfiguration = FerryStore.Configuration()
      storeConfiguration.createIfMissing = false
      storeConfiguration.writeAheadSegment = arguments.count == 5
      let queue = try await TaskQueue.open(at: directory, configuration: storeConfiguration)
      var configuration = TaskRunner.Configuration()
      configuration.maxConcurrentTasks = concurrency
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
    } catch {
      say("failed \(error)")
      fail("company-run failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "cancel-race-run":
  // (CancelAndReplaceDuringRunTests) Opens the existing store (with the write-ahead segment when
  // "segment" is given) and runs its "job" tasks automatically with CONCURRENCY lanes until the
  // file STOP exists; each handler says "ran ID ATTEMPT", sleeps 0-15 ms and then succeeds, or for
  // payload kind "flaky" fails retryably on its first attempt (retried after 5 ms). Says "done".
  guard (5...6).contains(arguments.count), let concurrency = Int(arguments[3]),
    arguments.count == 5 || arguments[5] == "segment"
  else { fail("cancel-race-run DIR CONCURRENCY STOP [segment]") }
  let stop = arguments[4]
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var storeConfiguration = FerryStore.Configuration()
      storeConfiguration.createIfMissing = false
      storeConfiguration.writeAheadSegment = arguments.count == 6
      let queue = try await TaskQueue.open(at: directory, configuration: storeConfiguration)
      var configuration = TaskRunner.Configuration()
      configuration.maxConcurrentTasks = concurrency
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
    } catch {
      say("failed \(error)")
      fail("cancel-race-run failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "company-rebuild":
  // (RebuildCompactionCompanyTests) Opens the existing store with rebuildChunkSize CHUNK (and the write-ahead
  // segment when "segment" is given), says "open", then rebuilds every projection again and again,
  // saying "round I" after each, until a line arrives on standard input; then closes and says
  // "closed ROUNDS".
  guard (4...5).contains(arguments.count), let chunk = Int(arguments[3]),
    arguments.count == 4 || arguments[4] == "segment"
  else { fail("company-rebuild DIR CHUNK [segment]") }
  let stop = DispatchSemaphore(value: 0)
  Thread.detachNewThread {
    _ = readLine()
    stop.signal()
  }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var configuration = FerryStore.Configuration()
      configuration.rebuildChunkSize = chunk
      configuration.createIfMissing = false
      configuration.writeAheadSegment = arguments.count == 5
      let store = try await FerryStore.open(at: directory, configuration: configuration)
      say("open")
      var rounds = 0
      while stop.wait(timeout: .now()) == .timedOut {
        _ = try await store.log.rebuild()
        say("round \(rounds)")
        rounds += 1
      }
      store.close()
      say("closed \(rounds)")
    } catch {
      say("failed \(error)")
      fail("company-rebuild failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "company-compact":
  // (RebuildCompactionCompanyTests) Opens the existing store with rebuildChunkSize CHUNK (the chunks in which
  // a compaction folds projections left behind; the write-ahead segment when "segment" is given),
  // says "open", then compacts it with a retention of zero again and again, saying "compacted I R"
  // (R events removed) after each, until a line arrives on standard input; then closes and says
  // "closed ROUNDS". Crash points are armed from the environment (FERRY_CRASH_POINT=compaction
  // kills it inside a compaction's transaction, snapshot written and events removed).
  guard (4...5).contains(arguments.count), let chunk = Int(arguments[3]),
    arguments.count == 4 || arguments[4] == "segment"
  else { fail("company-compact DIR CHUNK [segment]") }
  CrashPoint.armFromEnvironment()
  let stop = DispatchSemaphore(value: 0)
  Thread.detachNewThread {
    _ = readLine()
    stop.signal()
  }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var configuration = FerryStore.Configuration()
      configuration.rebuildChunkSize = chunk
      configuration.createIfMissing = false
      configuration.writeAheadSegment = arguments.count == 5
      let store = try await FerryStore.open(at: directory, configuration: configuration)
      say("open")
      var rounds = 0
      while stop.wait(timeout: .now()) == .timedOut {
        let report = try await store.compact(retention: .zero)
        say("compacted \(rounds) \(report.removed)")
        rounds += 1
        try await Task.sleep(for: .milliseconds(5))
      }
      store.close()
      say("closed \(rounds)")
    } catch {
      say("failed \(error)")
      fail("company-compact failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "attack-registry":
  // (RebuildCompactionCompanyTests) Opens the log with the "registry" projection at VERSION (a changed
  // version is rebuilt at open, in chunks of one event), appends OPS one by one ("+KEY" a "set" of
  // KEY, "-KEY" an "unset"; comma-separated, "-" for none), says "head H", closes and says
  // "closed". Crash points are armed from the environment (FERRY_CRASH_POINT=rebuild.chunk kills
  // it after the first chunk of that rebuild).
  guard arguments.count == 5, let version = UInt32(arguments[3]) else {
    fail("attack-registry DIR VERSION OPS")
  }
  CrashPoint.armFromEnvironment()
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var configuration = EventLog.Configuration(projections: [WorkerRegistry(version: version)])
      configuration.rebuildChunkSize = 1
      let log = try EventLog.open(at: directory, configuration: configuration)
      for op in arguments[4].split(separator: ",") where op != "-" {
        let type = op.hasPrefix("-") ? "unset" : "set"
        _ = try await log.append(NewEvent(type: type, payload: Array(op.dropFirst().utf8)))
      }
      say("head \(try log.head())")
      log.close()
      say("closed")
    } catch {
      fail("attack-registry failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "hold-write-lock":
  // (RebuildCompactionCompanyTests) Opens the store's LMDB environment and begins a write transaction, which
  // holds LMDB's writer lock (every other process's commit waits), says "locked", and on a line on
  // standard input aborts it, closes and says "released".
  var env: OpaquePointer?
  guard mdb_env_create(&env) == MDB_SUCCESS, let env else { fail("mdb_env_create failed") }
  guard mdb_env_set_maxdbs(env, 64) == MDB_SUCCESS,
    mdb_env_open(env, directory, UInt32(MDB_NOTLS), 0o600) == MDB_SUCCESS
  else { fail("opening \(directory) failed") }
  var txn: OpaquePointer?
  guard mdb_txn_begin(env, nil, 0, &txn) == MDB_SUCCESS, let txn else {
    fail("beginning a write transaction failed")
  }
  say("locked")
  _ = readLine()
  mdb_txn_abort(txn)
  mdb_env_close(env)
  say("released")
case "unpublished-commit":
  // (FerryToolsTests.CompactCopyTests) Commits one key ("k" = "v") into the database
  // "unpublished" through an environment opened with MDB_NOLOCK, which never touches lock.mdb: the
  // data file's newest meta page then names a transaction that processes sharing lock.mdb do not
  // see — the state every commit is in from its meta-page write to its publication in lock.mdb,
  // held here for as long as the test needs. Says "committed TXN".
  var env: OpaquePointer?
  guard mdb_env_create(&env) == MDB_SUCCESS, let env else { fail("mdb_env_create failed") }
  guard mdb_env_set_maxdbs(env, 64) == MDB_SUCCESS,
    mdb_env_open(env, directory, UInt32(MDB_NOLOCK | MDB_NOTLS), 0o600) == MDB_SUCCESS
  else { fail("opening \(directory) with MDB_NOLOCK failed") }
  var txn: OpaquePointer?
  var dbi = MDB_dbi(0)
  guard mdb_txn_begin(env, nil, 0, &txn) == MDB_SUCCESS, let txn,
    mdb_dbi_open(txn, "unpublished", UInt32(MDB_CREATE), &dbi) == MDB_SUCCESS
  else { fail("beginning the unpublished commit failed") }
  let id = mdb_txn_id(txn)
  var key = Array("k".utf8)
  var value = Array("v".utf8)
  let put = key.withUnsafeMutableBytes { k in
    value.withUnsafeMutableBytes { v in
      var keyValue = MDB_val(mv_size: k.count, mv_data: k.baseAddress)
      var dataValue = MDB_val(mv_size: v.count, mv_data: v.baseAddress)
      return mdb_put(txn, dbi, &keyValue, &dataValue, 0)
    }
  }
  guard put == MDB_SUCCESS, mdb_txn_commit(txn) == MDB_SUCCESS else { fail("the unpublished commit failed") }
  mdb_env_close(env)
  say("committed \(id)")
case "operate":
  // (OperatorCompanyTests) Runs the `ferry` operator command ACTION (cancel-group GROUP,
  // cancel ID, pause, resume) on the store in this process, crash points armed from the
  // environment (FERRY_CRASH_POINT=append.beforeCommit or segment.frameFlushed, say); says "status
  // S" when it returns, "refused S M" when it throws.
  guard arguments.count >= 4 else { fail("operate DIR ACTION [ARGUMENT]") }
  CrashPoint.armFromEnvironment()
  let action: OperatorAction
  switch arguments[3] {
  case "cancel-group" where arguments.count == 5: action = .cancelGroup(arguments[4])
  case "cancel" where arguments.count == 5: action = .cancel([UInt64(arguments[4]) ?? 0])
  case "pause": action = .pause
  case "resume": action = .resume
  default: fail("operate DIR cancel-group GROUP | cancel ID | pause | resume")
  }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do throws(ToolError) {
      let status = try await operate(path: directory, action, json: false, output: Output(line: { _ in }))
      say("status \(status.rawValue)")
    } catch {
      say("refused \(error.status.rawValue) \(error.message)")
    }
    done.signal()
  }
  done.wait()
case "pull-act-compact":
  // (CrossProcessObservationTests) Opens the existing store (the write-ahead segment when "segment" is
  // given), does ACTION — "forget:KEY" forgets a cache key, "cancel:ID" cancels a task, "run:TAG"
  // runs one pass with a handler of TAG that succeeds (saying "ran N") — waits
  // 5 ms (so the event is before a zero retention's cutoff), compacts with a retention of zero,
  // says "compacted R" (R events removed), closes and says "closed".
  guard (4...5).contains(arguments.count), arguments.count == 4 || arguments[4] == "segment" else {
    fail("pull-act-compact DIR forget:KEY|cancel:ID|run:TAG [segment]")
  }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var configuration = FerryStore.Configuration()
      configuration.createIfMissing = false
      configuration.writeAheadSegment = arguments.count == 5
      let store = try await FerryStore.open(at: directory, configuration: configuration)
      let action = arguments[3]
      if action.hasPrefix("forget:") {
        try await store.ledger.forget(String(action.dropFirst("forget:".count)))
      } else if action.hasPrefix("cancel:"), let id = UInt64(action.dropFirst("cancel:".count)) {
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
    } catch {
      fail("pull-act-compact failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "pull-grow":
  // (CrossProcessObservationTests) Opens the existing store and records COUNT failed fetches of keys
  // "big-I", each with a message of 60 KiB (so the map grows), one by one, saying "ack I" after
  // each; then closes and says "closed".
  guard arguments.count == 4, let count = Int(arguments[3]) else { fail("pull-grow DIR COUNT") }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var configuration = FerryStore.Configuration()
      configuration.createIfMissing = false
      let store = try await FerryStore.open(at: directory, configuration: configuration)
      let message = String(repeating: "x", count: 60 * 1024)
      for i in 0..<count {
        try await store.ledger.recordFetch(key: "big-\(i)", outcome: .failure(message + "\(i)"))
        say("ack \(i)")
      }
      store.close()
      say("closed")
    } catch {
      fail("pull-grow failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "spin-append":
  // (WriterSpinRaceTests) Opens the log with the write-ahead segment (projection CountByType
  // under "countByType"), the writer's poll window WINDOW in microseconds ("default": nil, the
  // store's default), says "processors P window W", then appends COUNT events of type
  // "worker.event" one by one (payload "worker I"; with "bare", opened without the projection),
  // printing "ack SEQ I SPINS" after each (SPINS:
  // the writer's polls so far), then "spins S caught C", closes and says "closed".
  guard (5...6).contains(arguments.count), let count = Int(arguments[3]) else {
    fail("spin-append DIR COUNT WINDOW|default [bare]")
  }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      // "bare" (a fifth argument): no projection, so that another process's projection falls behind.
      let bare = arguments.count > 5 && arguments[5] == "bare"
      var configuration = EventLog.Configuration(
        projections: bare ? [] : [EventTypeCounts(name: "countByType", version: 1)])
      configuration.writeAheadSegment = true
      if let micros = Int64(arguments[4]) { configuration.writerSpin = .microseconds(micros) }
      let log = try EventLog.open(at: directory, configuration: configuration)
      say("processors \(ProcessInfo.processInfo.activeProcessorCount) segment \(FileManager.default.fileExists(atPath: directory + "/ferry-segment"))")
      for i in 0..<count {
        let sequence = try await log.append(NewEvent(type: "worker.event", payload: Array("worker \(i)".utf8)))
        say("ack \(sequence) \(i) \(log.statistics.writerSpins)")
      }
      let statistics = log.statistics
      say("spins \(statistics.writerSpins) caught \(statistics.writerSpinsCaught)")
      log.close()
      say("closed")
    } catch {
      fail("spin-append failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "spin-add-tasks":
  // (WriterSpinRaceTests) Opens the store with the write-ahead segment, adds COUNT "job" tasks
  // one by one (payload kind "ok", data id "PREFIX-I"), printing "ack ID I" after each, then
  // "spins S caught C processors P", closes and says "closed".
  guard arguments.count == 5, let count = Int(arguments[3]) else { fail("spin-add-tasks DIR COUNT PREFIX") }
  let prefix = arguments[4]
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      var configuration = FerryStore.Configuration()
      configuration.writeAheadSegment = true
      // A window of 2 ms (polls after waits under 8 ms): the test checks that this writer polled,
      // which the default 50 µs may not do at all on a machine loaded by a whole test run.
      configuration.writerSpin = .milliseconds(2)
      let store = try await FerryStore.open(at: directory, configuration: configuration)
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
    } catch {
      fail("spin-add-tasks failed: \(error)")
    }
    done.signal()
  }
  done.wait()
case "spin-run-tasks":
  // (WriterSpinRaceTests) Opens the store (following its write-ahead segment) and runs serial
  // passes (one task at a time) over its "job" tasks until a line "stop" has come on standard
  // input and then three passes ran nothing; says "ran ID ATTEMPT" as each handler starts and,
  // at the end, "spins S caught C", then closes and says "closed".
  let stopAsked = Mutex(false)
  Thread.detachNewThread {
    while let line = readLine() { if line == "stop" { break } }
    stopAsked.withLock { $0 = true }
  }
  let done = DispatchSemaphore(value: 0)
  Task.detached {
    do {
      let store = try await FerryStore.open(at: directory)
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
        if ranSomething || !stopAsked.withLock({ $0 }) {
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
    } catch {
      fail("spin-run-tasks failed: \(error)")
    }
    done.signal()
  }
  done.wait()
default:
  fail("unknown command \(command)")
}

/// Each event's payload by its sequence (the same projection as the tests' `PayloadsBySequence`,
/// without its poison rule): a projection with a row per event, so a rebuild rewrites many pages.
struct WorkerPayloads: Projection {
  let name = "payloads"
  let version: UInt32 = 1
  let tables = ["bySequence"]

  func apply(_ event: LoggedEvent, to tables: ProjectionTables) throws {
    try tables.put("bySequence", key: event.sequence.bigEndianBytes, value: event.payload)
  }
}

/// The keys "set" and not "unset" since (the same projection as RebuildCompactionCompanyTests' `Registry`):
/// version 1 stores each key as it is, any other version under "vN:" — another version of an app
/// laying out its rows differently.
struct WorkerRegistry: Projection {
  let name = "registry"
  let version: UInt32
  let tables = ["entries"]

  func apply(_ event: LoggedEvent, to tables: ProjectionTables) throws {
    let key = (version == 1 ? [] : Array("v\(version):".utf8)) + event.payload
    switch event.type {
    case "set": try tables.put("entries", key: key, value: [1])
    case "unset": _ = try tables.delete("entries", key: key)
    default: break
    }
  }
}

/// Whether a read was refused because its projection is not current: the engine's error, or
/// Ferry's for the same refusal.
func isNotCurrent(_ error: any Error) -> Bool {
  if case FerryLogError.projectionNotCurrent = error { return true }
  if case FerryError.notCurrent = error { return true }
  return false
}
