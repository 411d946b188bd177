import FerryLog
import Foundation
import TestSupport
import Testing

/// A read-write open that gets the store's open lock only shared, while no process has LMDB open:
/// the other holder is an open that has not opened LMDB yet (or copies the store to read a
/// recovered copy). The open waits to be alone, for up to 30 s (`one-sync-commit.md` §5).
@Suite(.timeLimit(.minutes(3))) struct OpenLockWaitTests {
  /// A directory path under the temporary directory (not made).
  private func temporaryPath(_ label: String) -> String {
    FileManager.default.temporaryDirectory.path + "/ferry-\(label)-\(UUID().uuidString.prefix(8))"
  }

  private func open(_ path: String) throws -> EventLog {
    try EventLog.open(at: path, configuration: EventLog.Configuration(projections: []))
  }

  /// What a power cut leaves after five acknowledged appends: the data file and the head mark as
  /// the last checkpoint flushed them, the segment holding the five frames.
  private func powerCutImage(_ image: String) async throws {
    let store = temporaryPath("source")
    defer { try? FileManager.default.removeItem(atPath: store) }
    let log = try open(store)
    try FileManager.default.createDirectory(atPath: image, withIntermediateDirectories: true)
    for name in ["data.mdb", "ferry-head"] {
      try FileManager.default.copyItem(atPath: store + "/" + name, toPath: image + "/" + name)
    }
    for i in 0..<5 { _ = try await log.append(NewEvent(type: "plain", payload: Array("\(i)".utf8))) }
    try FileManager.default.copyItem(atPath: store + "/ferry-segment", toPath: image + "/ferry-segment")
    log.close()
  }

  /// A power-cut image at `image`, and a worker holding its open lock shared without LMDB (as an
  /// open does before its LMDB open, or a recovered copy's reader while it copies); a line on
  /// `input` lets it go.
  func lockedPowerCutImage(_ image: String) async throws -> (holder: Child, input: Pipe) {
    try await powerCutImage(image)
    let input = Pipe()
    let holder = try Child(
      "ferry-test-worker", ["hold-open-lock", image], stdin: input.fileHandleForReading)
    _ = try await holder.waitForLine(startingWith: "locked")
    return (holder, input)
  }

  /// Past the wait the open must not follow the store as it stands: it holds commits only its
  /// segment has, which a shared open's first checkpoint would throw away.
  @Test func anOpenThatWaitedInVainNeverReadsAStoreThatNeedsRecovery() async throws {
    let image = temporaryPath("image")
    defer { try? FileManager.default.removeItem(atPath: image) }
    let (holder, input) = try await lockedPowerCutImage(image)
    defer { if holder.process.isRunning { holder.kill() } }

    let started = ContinuousClock.now
    var head: UInt64?
    do {
      let log = try open(image)
      head = try log.head()
      // Its first write checkpoints: whatever it read is what the store keeps.
      _ = try await log.append(NewEvent(type: "plain", payload: Array("late".utf8)))
      log.close()
    } catch let error as FerryLogError {
      guard case .needsRecovery = error else { throw error }
    }
    let waited = ContinuousClock.now - started
    #expect(waited >= .seconds(29), "the open waited \(waited)")
    // Either refused (the store needs an alone open) or, never, the checkpoint's state read as it is.
    #expect(head == nil || head == 5, "the open read head \(head.map(String.init) ?? "-") after \(waited)")

    say("go", to: input)
    _ = try await holder.waitForLine(startingWith: "released")
    let settled = try open(image)
    defer { settled.close() }
    // The five acknowledged events, and the late one if that open was let in.
    #expect(try settled.head() == (head == nil ? 5 : 6))
  }

  /// A read-only open that shares the lock with another open that has not opened LMDB (a second
  /// reader copying the store for a recovered copy) must not read a store that needs recovery as
  /// it stands: a read-write open that comes while it has LMDB open shares the store, and its
  /// first write checkpoints over the frames.
  @Test func aReadOnlyOpenBesideACopyingOneNeverReadsAStoreThatNeedsRecovery() async throws {
    let image = temporaryPath("image")
    defer { try? FileManager.default.removeItem(atPath: image) }
    let (holder, input) = try await lockedPowerCutImage(image)
    defer { if holder.process.isRunning { holder.kill() } }

    var configuration = EventLog.Configuration(projections: [])
    configuration.readOnly = true
    configuration.recoveredCopyIfNeeded = true
    var reader: EventLog?
    do {
      reader = try EventLog.open(at: image, configuration: configuration)
    } catch let error as FerryLogError {
      guard case .needsRecovery = error else { throw error }
    }
    #expect(try reader.map { try $0.head() } ?? 5 == 5, "the read-only open read the store as it stands")
    say("go", to: input)
    _ = try await holder.waitForLine(startingWith: "released")
    // Another process writes while the reader has the store open.
    let writer = try Child("ferry-test-worker", ["append", image, "1"])
    _ = try await writer.waitForLine(startingWith: "ack ")
    writer.process.waitUntilExit()
    reader?.close()
    let settled = try open(image)
    defer { settled.close() }
    #expect(try settled.head() == 6, "acknowledged events were lost")
  }
}
