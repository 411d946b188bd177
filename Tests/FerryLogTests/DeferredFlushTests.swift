import FerryLog
import Foundation
import Testing

/// A command that called `mayDeferFlush()` writes its segment frame unflushed: the head mark must
/// not name it until a flush of the segment has carried it (`Specs/one-sync-commit.md` §3).
@Suite struct DeferredFlushTests {
  /// One event, committed without a flush of its own.
  private func deferredAppend(_ log: EventLog, _ text: String) async throws {
    try await log.execute { context in
      try context.append([NewEvent(type: "claim", payload: payload(text))])
      context.mayDeferFlush()
    }
  }

  @Test func aCommandThatAppendsNothingDoesNotMarkAnUnflushedFrameDurable() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open()
    defer { log.close() }
    _ = try await log.append(NewEvent(type: "plain", payload: payload("a")))
    try await deferredAppend(log, "b")
    #expect(try log.head() == 2)
    #expect(EventLog.acknowledgedHead(in: store.path) == 1)
    // Commits no frame, so flushes nothing: the claim's frame is as unflushed as before.
    try await log.execute { _ in () }
    #expect(EventLog.acknowledgedHead(in: store.path) == 1)
  }

  /// What a power cut may leave right after those commits: the segment as last flushed, the data
  /// file and the head mark as written. The deferred event may be lost; the store must open.
  @Test func aPowerCutAfterANoOpCommandLosesTheClaimNotTheStore() async throws {
    let store = TemporaryStore()
    let image = TemporaryStore()
    defer {
      store.remove()
      image.remove()
    }
    let log = try store.open()
    _ = try await log.append(NewEvent(type: "plain", payload: payload("a")))
    let flushedSegment = try Data(contentsOf: URL(fileURLWithPath: store.path + "/ferry-segment"))
    try await deferredAppend(log, "b")
    try await log.execute { _ in () }
    try FileManager.default.createDirectory(atPath: image.path, withIntermediateDirectories: true)
    for name in ["data.mdb", "ferry-head"] {
      try FileManager.default.copyItem(atPath: store.path + "/" + name, toPath: image.path + "/" + name)
    }
    try flushedSegment.write(to: URL(fileURLWithPath: image.path + "/ferry-segment"))
    log.close()
    let reopened = try image.open()
    defer { reopened.close() }
    #expect(try reopened.head() == 1)
  }
}
