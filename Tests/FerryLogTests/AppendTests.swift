import Foundation
import Testing

@testable import FerryLog

@Suite(.timeLimit(.minutes(20))) struct AppendTests {
  @Test func appendsAreNumberedFromOneAndReadBack() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open { $0.clock = { 1_700_000_000_000 } }
    defer { log.close() }
    #expect(log.wasCreated)
    #expect(try log.head() == 0)
    let first = try await log.append(NewEvent(type: "item.added", payload: payload("milk")))
    let rest = try await log.append([
      NewEvent(type: "item.added", payload: payload("eggs")),
      NewEvent(type: "item.removed", schemaVersion: 2, payload: payload("milk"), timestamp: 42),
    ])
    #expect(first == 1)
    #expect(rest == [2, 3])
    #expect(try log.head() == 3)

    let third = try #require(try log.event(at: 3))
    #expect(third.type == "item.removed")
    #expect(third.schemaVersion == 2)
    #expect(third.timestamp == 42)
    #expect(third.payload == payload("milk"))
    let second = try #require(try log.event(at: 2))
    #expect(second.timestamp == 1_700_000_000_000)
    #expect(second.id.bytes[6] >> 4 == 7)  // a generated id has the UUID version 7 layout
    #expect(try log.event(at: 4) == nil)
    #expect(try log.events(after: 1, limit: 10).map(\.sequence) == [2, 3])
    #expect(try log.events(after: 0, limit: 2).map(\.sequence) == [1, 2])
    #expect(try counts(log) == ["item.added": 2, "item.removed": 1])

    var visited: [UInt64] = []
    try log.forEachEvent(from: 2, chunkSize: 1) { visited.append($0.sequence) }
    #expect(visited == [2, 3])
    let raw = try #require(try log.record(at: 1))
    #expect(try EventRecord.decode(raw, sequence: 1).payload == payload("milk"))
  }

  @Test func reopeningKeepsEveryEventAndProjectionRow() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    var log = try store.open([CountByType(), PayloadsBySequence()])
    var written: [LoggedEvent] = []
    for i in 0..<300 {
      _ = try await log.append(NewEvent(type: i % 3 == 0 ? "a" : "b", payload: payload("event \(i)")))
    }
    try log.forEachEvent { written.append($0) }
    log.close()

    log = try store.open([CountByType(), PayloadsBySequence()])
    defer { log.close() }
    #expect(!log.wasCreated)
    #expect(log.eventsReplayedAtOpen == 0)
    var reread: [LoggedEvent] = []
    try log.forEachEvent(chunkSize: 7) { reread.append($0) }
    #expect(reread == written)
    #expect(try counts(log) == ["a": 100, "b": 200])
    let next = try await log.append(NewEvent(type: "a", payload: []))
    #expect(next == 301)
    #expect(try log.verify().isHealthy)
  }

  @Test func sixtyFourConcurrentAppendersShareCommits() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open([CountByType(), PayloadsBySequence()])
    defer { log.close() }
    let callers = 64
    // 200 each: enough for commits to be shared, few enough for a loaded machine's fsyncs.
    let perCaller = 200
    let acknowledged = try await withThrowingTaskGroup(of: [UInt64].self) { group in
      for caller in 0..<callers {
        group.addTask {
          var sequences: [UInt64] = []
          for i in 0..<perCaller {
            sequences.append(
              try await log.append(NewEvent(type: "c\(caller)", payload: payload("\(caller):\(i)"))))
          }
          return sequences
        }
      }
      var all: [[UInt64]] = []
      for try await sequences in group { all.append(sequences) }
      return all
    }
    let total = callers * perCaller
    for sequences in acknowledged {
      #expect(sequences == sequences.sorted())  // one caller's appends stay in its order
    }
    let flat = acknowledged.flatMap { $0 }
    #expect(flat.count == total)
    #expect(Set(flat).count == total)
    #expect(Set(flat) == Set(1...UInt64(total)))
    #expect(try log.head() == UInt64(total))

    // Every acknowledged sequence holds the event its caller appended.
    let stored = try log.read { view in try view.tables(of: "payloads").count("bySequence") }
    #expect(stored == total)
    var seen = 0
    try log.forEachEvent(chunkSize: 5000) { event in
      let text = String(decoding: event.payload, as: UTF8.self)
      if text.hasPrefix(event.type.dropFirst() + ":") { seen += 1 }
    }
    #expect(seen == total)

    let statistics = log.statistics
    #expect(statistics.appendCalls == total)
    #expect(statistics.eventsAppended == total)
    #expect(statistics.commits < total)  // group commit happened
    #expect(statistics.largestBatch > 1)
    print(
      "\(callers) callers x \(perCaller): \(statistics.commits) commits for \(total) appends, largest batch \(statistics.largestBatch)"
    )
    #expect(try counts(log).values.reduce(0, +) == UInt64(total))
  }

  @Test func aTinyMapGrowsThroughAHundredThousandAppends() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open { $0.initialMapSize = 64 << 10 }
    defer { log.close() }
    let before = try log.storageInfo().mapSize
    for batch in 0..<100 {
      let events = (0..<1000).map { NewEvent(type: "grow", payload: payload("batch \(batch) event \($0)")) }
      let sequences = try await log.append(events)
      #expect(sequences.first == UInt64(batch * 1000 + 1))
    }
    #expect(try log.head() == 100_000)
    #expect(log.storageCounters.mapGrowths > 0)
    #expect(try log.storageInfo().mapSize > before)
    #expect(try counts(log) == ["grow": 100_000])
    let last = try #require(try log.event(at: 100_000))
    #expect(last.payload == payload("batch 99 event 999"))
    #expect(try log.verify().isHealthy)
  }

  @Test func invalidEventsAreRefusedBeforeAnythingIsWritten() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open { $0.maxPayloadSize = 100 }
    defer { log.close() }
    await #expect(throws: FerryLogError.self) { try await log.append(NewEvent(type: "", payload: [])) }
    await #expect(throws: FerryLogError.self) {
      try await log.append(NewEvent(type: "has space", payload: []))
    }
    await #expect(throws: FerryLogError.self) {
      try await log.append(NewEvent(type: String(repeating: "x", count: 65), payload: []))
    }
    await #expect(throws: FerryLogError.self) {
      try await log.append(NewEvent(type: "ok", payload: [UInt8](repeating: 0, count: 101)))
    }
    await #expect(throws: FerryLogError.self) {
      try await log.append(NewEvent(type: "ok", schemaVersion: 0, payload: []))
    }
    // One bad event in a call refuses the whole call.
    await #expect(throws: FerryLogError.self) {
      try await log.append([NewEvent(type: "ok", payload: []), NewEvent(type: "bad type", payload: [])])
    }
    #expect(try log.head() == 0)
    _ = try await log.append(
      NewEvent(type: String(repeating: "x", count: 64), payload: [UInt8](repeating: 0, count: 100)))
    #expect(try log.head() == 1)
  }

  @Test func appendsAfterCloseAreRefused() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open()
    _ = try await log.append(NewEvent(type: "a", payload: []))
    log.close()
    do {
      _ = try await log.append(NewEvent(type: "a", payload: []))
      Issue.record("append after close succeeded")
    } catch FerryLogError.closed {
    }
    #expect(throws: FerryLogError.self) { try log.head() }
  }

  @Test func theSameEventIdIsStoredOnce() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    var log = try store.open { $0.idempotentAppends = true }
    let id = try #require(EventID(hex: "0190c6a2-7e1b-7c3d-8e4f-a1b2c3d4e5f6"))
    let first = try await log.append(NewEvent(type: "pay", payload: payload("once"), id: id))
    let again = try await log.append(NewEvent(type: "pay", payload: payload("once"), id: id))
    #expect(first == again)
    // Twice within one call, and concurrently from many callers.
    let other = EventID.make()
    let inOneCall = try await log.append([
      NewEvent(type: "pay", payload: [], id: other), NewEvent(type: "pay", payload: [], id: other),
    ])
    #expect(inOneCall[0] == inOneCall[1])
    let shared = EventID.make()
    let concurrent = try await withThrowingTaskGroup(of: UInt64.self) { group in
      for _ in 0..<16 {
        group.addTask { [log] in try await log.append(NewEvent(type: "pay", payload: [], id: shared)) }
      }
      var result = Set<UInt64>()
      for try await sequence in group { result.insert(sequence) }
      return result
    }
    #expect(concurrent.count == 1)
    #expect(try log.head() == 3)
    #expect(log.statistics.duplicatesSkipped == 1 + 1 + 15)
    #expect(try counts(log) == ["pay": 3])
    log.close()

    // The index survives a reopen, and is rebuilt when idempotent appends are turned back on.
    log = try store.open { $0.idempotentAppends = false }
    _ = try await log.append(NewEvent(type: "pay", payload: [], id: id))
    #expect(try log.head() == 4)
    log.close()
    log = try store.open { $0.idempotentAppends = true }
    defer { log.close() }
    #expect(log.eventsReplayedAtOpen == 1)
    #expect(try await log.append(NewEvent(type: "pay", payload: [], id: id)) == first)
    #expect(try log.verify().isHealthy)
  }
}
