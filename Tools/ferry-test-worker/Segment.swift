// Modes that write through the write-ahead segment and are killed, or share it, mid-way.
@_spi(Engine) @_spi(Experimental) import Ferry
import FerryLog
import Foundation

let segmentModes: [String: Mode] = [
  // Opens the log with the write-ahead segment asked for (ON) or not (OFF — it then follows what
  // the store does), appends COUNT events one by one printing "ack SEQ", then says "holding" and
  // waits to be killed (its frames stay past the last checkpoint).
  // With SIZE, each payload is "worker N" padded with "x" to SIZE bytes (a batch past the
  // segment's size when SIZE is large); with CHECKPOINT, segmentCheckpointCommits is that.
  "segment-append": Mode(usage: "DIR COUNT ON|OFF [SIZE [CHECKPOINT]]") { call in
    call.expect(2...4)
    let count = call.number(0)
    var configuration = EventLog.Configuration()
    configuration.writeAheadSegment = call.words[1] == "ON"
    let size = call.word(2).flatMap { Int($0) } ?? 0
    if let checkpointEvery = call.word(3).flatMap({ Int($0) }) {
      configuration.segmentCheckpointCommits = checkpointEvery
    }
    call.runAsync { [configuration] in
      let log = try EventLog.open(at: call.directory, configuration: configuration)
      for i in 0..<count {
        var bytes = Array("worker \(i)".utf8)
        if bytes.count < size { bytes += [UInt8](repeating: UInt8(ascii: "x"), count: size - bytes.count) }
        let sequence = try await log.append(NewEvent(type: "worker.event", payload: bytes))
        say("ack \(sequence)")
      }
      say("holding")
      while true { try await Task.sleep(for: .seconds(60)) }
    }
  },
  // Opens the log (the segment not asked for: it follows what the store does) with the
  // "payloads" projection (each payload by sequence), says "open HEAD", waits for a line on
  // standard input, then rebuilds that projection in chunks of CHUNK events and says "rebuilt".
  // The crash points are armed from the environment (FERRY_CRASH_POINT=rebuild.chunk kills it
  // mid-rebuild).
  "segment-share-rebuild": Mode(usage: "DIR CHUNK") { call in
    call.expect(1...1)
    let chunk = call.number(0)
    CrashPoint.armFromEnvironment()
    call.runAsync {
      var configuration = EventLog.Configuration(projections: [WorkerPayloads()])
      configuration.rebuildChunkSize = chunk
      configuration.createIfMissing = false
      let log = try EventLog.open(at: call.directory, configuration: configuration)
      say("open \(try log.head())")
      _ = readLine()
      _ = try await log.rebuild()
      say("rebuilt")
      while true { try await Task.sleep(for: .seconds(60)) }
    }
  },
  // Opens the store with the write-ahead segment asked for, adds COUNT tasks one by one (tag
  // "app", data id "app-I") printing "ack ID I", says "holding", and on a line on standard input
  // closes the store and says "closed" (or is killed before).
  "store-segment-add": Mode(usage: "DIR COUNT") { call in
    call.expect(1...1)
    let count = call.number(0)
    call.runAsync {
      var configuration = storeConfiguration(segment: true)
      // Every add stays past the open's checkpoint (no checkpoint for freed pages): a test cuts
      // the data file back to what it was before them.
      configuration.segmentCheckpointFreedBytes = 1 << 40
      let store = try await FerryStore.open(at: call.directory, configuration: configuration)
      for i in 0..<count {
        let id = try await store.queue.add(tag: "app", payload: ["n": i], dataId: "app-\(i)")
        say("ack \(id) \(i)")
      }
      say("holding")
      _ = readLine()
      store.close()
      say("closed")
    }
  },
  // Opens the store with the write-ahead segment, says "open", and on a line on standard input
  // reads the pending tasks (saying "read N", or "error E"), then adds COUNT tasks one by one (tag
  // "late", data id "late-I") printing "ack ID I", and says "holding" until killed or a line
  // arrives on standard input; then closes and says "closed".
  "segment-read-then-add": Mode(usage: "DIR COUNT") { call in
    call.expect(1...1)
    let count = call.number(0)
    CrashPoint.armFromEnvironment()
    call.runAsync {
      let store = try await FerryStore.open(
        at: call.directory, configuration: storeConfiguration(segment: true))
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
    }
  },
]
