// Modes that rebuild projections, or change their versions, while the parent reads the store.
@_spi(Engine) @_spi(Experimental) import Ferry
import FerryLog
import Foundation

let rebuildModes: [String: Mode] = [
  // Opens the store (every projection of a FerryStore) with rebuildChunkSize CHUNK — and the
  // write-ahead segment asked for with "segment" — says "open", waits for a line on standard
  // input, rebuilds every projection and says "rebuilt", then waits for another line, closes and
  // says "closed". Crash points are armed from the environment (FERRY_CRASH_POINT=rebuild.chunk
  // kills it after its first chunk of the rebuild).
  "store-rebuild": Mode(usage: "DIR CHUNK [segment]") { call in
    call.expect(1...2)
    let chunk = call.number(0)
    let segment = call.flag(1, "segment")
    CrashPoint.armFromEnvironment()
    call.runAsync {
      let store = try await FerryStore.open(
        at: call.directory, configuration: storeConfiguration(segment: segment, chunk: chunk))
      say("open")
      _ = readLine()
      _ = try await store.log.rebuild()
      say("rebuilt")
      _ = readLine()
      store.close()
      say("closed")
    }
  },
  // Opens the existing store read-write (with rebuildChunkSize CHUNK when given), says "open
  // mapsize M used U", and on a line on standard input reads the queue from inside another
  // EventLog.read (the outer snapshot held): says "read N growths G adoptions A", or "error E"
  // when the read throws; then closes and says "closed". A hang is the failure the caller looks
  // for. Crash points are armed from the environment (FERRY_CRASH_POINT=rebuild.chunk kills it
  // after the first chunk of a catch-up).
  "read-inside-read": Mode(usage: "DIR [CHUNK]") { call in
    call.expect(0...1)
    let chunk = call.word(0).flatMap { Int($0) }
    CrashPoint.armFromEnvironment()
    call.runAsync {
      let store = try await FerryStore.open(
        at: call.directory, configuration: storeConfiguration(existing: true, chunk: chunk))
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
    }
  },
  // Opens the existing store with rebuildChunkSize CHUNK, says "open", then rebuilds every
  // projection ROUNDS times (saying "round I" after each), says "done", closes and says "closed".
  "rebuild-rounds": Mode(usage: "DIR CHUNK ROUNDS") { call in
    call.expect(2...2)
    let chunk = call.number(0)
    let rounds = call.number(1)
    call.runAsync {
      let store = try await FerryStore.open(
        at: call.directory, configuration: storeConfiguration(existing: true, chunk: chunk))
      say("open")
      for round in 0..<rounds {
        _ = try await store.log.rebuild()
        say("round \(round)")
      }
      say("done")
      store.close()
      say("closed")
    }
  },
  // Opens the existing store with rebuildChunkSize CHUNK (and the write-ahead segment when
  // "segment" is given), says "open", then rebuilds every projection again and again, saying
  // "round I" after each, until a line arrives on standard input; then closes and says
  // "closed ROUNDS".
  "rebuild-until-line": Mode(usage: "DIR CHUNK [segment]") { call in
    call.expect(1...2)
    let chunk = call.number(0)
    let segment = call.flag(1, "segment")
    let stop = StopLine()
    call.runAsync(announce: true) {
      let store = try await FerryStore.open(
        at: call.directory, configuration: storeConfiguration(existing: true, segment: segment, chunk: chunk))
      say("open")
      var rounds = 0
      while !stop.hasCome {
        _ = try await store.log.rebuild()
        say("round \(rounds)")
        rounds += 1
      }
      store.close()
      say("closed \(rounds)")
    }
  },
  // Opens the log with one EventTypeCounts projection "attackCounts" at VERSION (a changed
  // version is rebuilt at open), says "open HEAD", and on a line on standard input closes and
  // says "closed".
  "open-at-version": Mode(usage: "DIR VERSION") { call in
    call.expect(1...1)
    let version = call.number(0, as: UInt32.self)
    do {
      let log = try EventLog.open(
        at: call.directory,
        configuration: EventLog.Configuration(projections: [
          EventTypeCounts(name: "attackCounts", version: version)
        ]))
      say("open \(try log.head())")
      _ = readLine()
      log.close()
      say("closed")
    } catch {
      fail("open-at-version failed: \(error)")
    }
  },
  // Opens the log with EventTypeCounts projections named and versioned by SPEC ("name:version,…",
  // or "-" for none), appends COUNT events (types "t0"…"t2", in batches of 50), says "head H",
  // closes and says "closed".
  "append-with-projections": Mode(usage: "DIR SPEC COUNT") { call in
    call.expect(2...2)
    let count = call.number(1)
    var projections: [any Projection] = []
    if call.words[0] != "-" {
      for item in call.words[0].split(separator: ",") {
        let parts = item.split(separator: ":")
        guard parts.count == 2, let version = UInt32(parts[1]) else { call.usageError() }
        projections.append(EventTypeCounts(name: String(parts[0]), version: version))
      }
    }
    let configuration = EventLog.Configuration(projections: projections)
    call.runAsync {
      let log = try EventLog.open(at: call.directory, configuration: configuration)
      var appended = 0
      while appended < count {
        let batch = min(50, count - appended)
        _ = try await log.append(
          (0..<batch).map { NewEvent(type: "t\(($0 + appended) % 3)", payload: Array("w".utf8)) })
        appended += batch
      }
      say("head \(try log.head())")
      log.close()
      say("closed")
    }
  },
  // Opens the log with the "registry" projection at VERSION (a changed version is rebuilt at
  // open, in chunks of one event), appends OPS one by one ("+KEY" a "set" of KEY, "-KEY" an
  // "unset"; comma-separated, "-" for none), says "head H", closes and says "closed". Crash
  // points are armed from the environment (FERRY_CRASH_POINT=rebuild.chunk kills it after the
  // first chunk of that rebuild).
  "registry-append": Mode(usage: "DIR VERSION OPS") { call in
    call.expect(2...2)
    let version = call.number(0, as: UInt32.self)
    let operations = call.words[1].split(separator: ",").filter { $0 != "-" }.map(String.init)
    CrashPoint.armFromEnvironment()
    call.runAsync {
      var configuration = EventLog.Configuration(projections: [WorkerRegistry(version: version)])
      configuration.rebuildChunkSize = 1
      let log = try EventLog.open(at: call.directory, configuration: configuration)
      for op in operations {
        let type = op.hasPrefix("-") ? "unset" : "set"
        _ = try await log.append(NewEvent(type: type, payload: Array(op.dropFirst().utf8)))
      }
      say("head \(try log.head())")
      log.close()
      say("closed")
    }
  },
]

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
