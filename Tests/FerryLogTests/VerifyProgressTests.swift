import FerryLog
import Foundation
import Testing

@Suite struct VerifyProgressTests {
  /// `verify(progress:)` reports each chunk of the rebuild, moving up to the head — the bar of
  /// `ferry verify` moves on long work instead of jumping from 0 to 100 %.
  @Test func verifyReportsProgressChunkByChunk() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open { $0.rebuildChunkSize = 10 }
    defer { log.close() }
    _ = try await log.append((1...35).map { NewEvent(type: "progress.event", payload: Array("event \($0)".utf8)) })
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
    _ = try await log.append((1...35).map { NewEvent(type: "progress.event", payload: Array("event \($0)".utf8)) })
    var seen: [UInt64] = []
    var targets: Set<UInt64> = []
    let head = try log.withProjections(asOf: 27, progress: { reached, until in
      seen.append(reached)
      targets.insert(until)
    }) { view in try view.head() }
    #expect(head == 27)
    #expect(seen == [10, 20, 27])
    #expect(targets == [27])
  }
}
