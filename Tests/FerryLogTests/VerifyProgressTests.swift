import FerryLog
import Foundation
import Synchronization
import Testing

@Suite struct VerifyProgressTests {
  /// `verify(progress:)` reports each chunk of the rebuild, moving up to the head — the bar of
  /// `ferry verify` moves on long work instead of jumping from 0 to 100 %.
  @Test func verifyReportsProgressChunkByChunk() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open { $0.rebuildChunkSize = 10 }
    defer { log.close() }
    _ = try await log.append(
      (1...35).map { NewEvent(type: "progress.event", payload: Array("event \($0)".utf8)) })
    var seen: [UInt64] = []
    var heads: Set<UInt64> = []
    let report = try log.verify { reached, head in
      seen.append(reached)
      heads.insert(head)
    }
    #expect(report.isHealthy)
    #expect(seen == [10, 20, 30, 35])
    #expect(heads == [35])
  }

  /// Time travel (`ferry replay --until`) reports its rebuild chunk by chunk too, up to the
  /// sequence asked for, and its state is the same with or without a progress callback.
  @Test func timeTravelReportsProgressChunkByChunk() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open { $0.rebuildChunkSize = 10 }
    defer { log.close() }
    _ = try await log.append(
      (1...35).map { NewEvent(type: "progress.event", payload: Array("event \($0)".utf8)) })
    var seen: [UInt64] = []
    var targets: Set<UInt64> = []
    let head = try log.withProjections(
      asOf: 27,
      progress: { reached, until in
        seen.append(reached)
        targets.insert(until)
      }
    ) { view in try view.head() }
    #expect(head == 27)
    #expect(seen == [10, 20, 27])
    #expect(targets == [27])
  }

  /// A compaction reports how far its one pass over the log has read, every 10,000 events — the
  /// bar of `ferry compact` moves on a long log.
  @Test func compactionReportsProgressAsItReadsTheLog() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open()
    defer { log.close() }
    _ = try await log.append(
      (1...25_000).map { NewEvent(type: "progress.event", payload: Array("e\($0)".utf8)) })
    let seen = Mutex<[[UInt64]]>([])
    let report = try await log.compact(
      removing: { $0.sequence <= 5 },
      progress: { read, head in seen.withLock { $0.append([read, head]) } })
    #expect(report.removed == 5)
    let expected: [[UInt64]] = [[10_000, 25_000], [20_000, 25_000]]
    #expect(seen.withLock { $0 } == expected)
  }
}
