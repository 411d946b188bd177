import Foundation
import TestSupport
import Testing

/// What an add and a pass cost in flushes, counted in another process by the C library's calls
/// (the test worker counts fsync, fdatasync and msync), not by Ferry's bookkeeping.
@Suite struct FlushCountTests {
  /// The worker's "add N pass M" for a fresh store.
  private func counts(_ mode: String) async throws -> (add: Int, pass: Int) {
    let fixture = QueueFixture()
    defer { try? FileManager.default.removeItem(atPath: fixture.path) }
    let child = try Child("ferry-test-worker", ["count-flushes", fixture.path, mode])
    let line = try await child.waitForLine(startingWith: "add ")
    let words = line.split(separator: " ")
    let add = try #require(words.count == 4 ? Int(words[1]) : nil, "the worker said: \(line)")
    let pass = try #require(Int(words[3]), "the worker said: \(line)")
    return (add, pass)
  }

  @Test func withTheSegmentAnAddAndAPassEachFlushOnce() async throws {
    let counted = try await counts("SEGMENT")
    #expect(counted.add == 1)
    // The claim's frame rides on the outcome's flush.
    #expect(counted.pass == 1)
  }

  @Test func withFlushedCommitsAnAddFlushesTwiceAndAPassTwiceThat() async throws {
    let counted = try await counts("FLUSHED")
    #expect(counted.add == 2)
    #expect(counted.pass == 4)
  }
}
