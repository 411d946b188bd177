import FerryLog
import Foundation
import Testing

@_spi(Engine) @_spi(Experimental) @testable import Ferry

/// The data file's growth under the write-ahead segment stays within its stated bound
/// (`Specs/one-sync-commit.md` §10): a queue workload of adds and runs leaves a data file at most
/// the freed-bytes limit, plus slack, larger than the same workload without the segment.
@Suite(.timeLimit(.minutes(30))) struct SegmentGrowthTests {
  /// The data file's size after `rounds` adds, each followed by a run of that task, by each of
  /// `callers` callers at once.
  static func dataFileSize(
    segment: Bool, callers: Int, rounds: Int,
    configure: (inout FerryStore.Configuration) -> Void = { _ in }
  ) async throws -> Int {
    let path =
      FileManager.default.temporaryDirectory.path + "/ferry-growth-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: path) }
    var configuration = FerryStore.Configuration()
    configuration.writeAheadSegment = segment
    configure(&configuration)
    let store = try await FerryStore.open(at: path, configuration: configuration)
    defer { store.close() }
    let queue = store.queue
    let run = runner(queue)
    run.register(tag: "t") { _ in .succeeded }
    try await withThrowingTaskGroup(of: Void.self) { group in
      for caller in 0..<callers {
        group.addTask {
          for round in 0..<rounds {
            let id = try await queue.add(tag: "t", payload: ["caller": caller, "round": round])
            _ = try await run.run(.task(id))
          }
        }
      }
      try await group.waitForAll()
    }
    #expect(try queue.pendingTasks().isEmpty)
    let attributes = try FileManager.default.attributesOfItem(atPath: path + "/data.mdb")
    return (attributes[.size] as? Int) ?? 0
  }

  /// The data file's excess over the flushed path's after the same workload, against the stated
  /// bound: the default freed-bytes limit, 8 MiB (a constant here, so that raising the default
  /// fails this), plus the pages of the commit that crossed it (under 1 MiB: a group commit of 64
  /// tasks frees well under that).
  static func expectWithinBound(callers: Int, rounds: Int) async throws {
    let limit = 8 << 20
    #expect(EventLog.Configuration().segmentCheckpointFreedBytes <= limit)
    let flushed = try await dataFileSize(segment: false, callers: callers, rounds: rounds)
    let withSegment = try await dataFileSize(segment: true, callers: callers, rounds: rounds)
    #expect(
      withSegment <= flushed + limit + (1 << 20),
      "data.mdb with the segment: \(withSegment) bytes; without: \(flushed); bound: \(limit) + 1 MiB more")
  }

  /// One caller adding a task and running it, over and over: about three commits a task, each
  /// freeing a few pages. The old limit of 256 commits left a data file 11 MB larger.
  @Test func aSerialAddAndRunLoopStaysWithinTheBound() async throws {
    try await Self.expectWithinBound(callers: 1, rounds: 1_500)
  }

  /// 64 callers at once: group commits of many tasks, each freeing many pages, checkpoint after
  /// fewer commits; a limit in commits alone let such a file grow 13 MB past the flushed one.
  @Test func sixtyFourCallersStayWithinTheBound() async throws {
    try await Self.expectWithinBound(callers: 64, rounds: 40)
  }
}
