import Foundation
import Testing

/// Opening and closing a store gives back every file descriptor it took: the data and lock files,
/// the write-ahead segment, the head mark, the open lock and the runner's liveness token. An app
/// that opens a store per request (an extension woken again and again) would otherwise run out.
/// Counted in a worker process of its own, where no other test opens files meanwhile.
@Suite(.timeLimit(.minutes(20))) struct DescriptorTests {
  @Test(arguments: [false, true]) func openAddRunCloseCyclesLeaveNoDescriptorOpen(segment: Bool) async throws
  {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let child = try Child(
      "ferry-test-worker", ["fd-cycles", fixture.path, "40"] + (segment ? ["segment"] : []))
    #expect(try await child.wait() == 0)
    let line = try #require(child.output.last { $0.hasPrefix("fds ") }, "\(child.output)")
    let counts = line.split(separator: " ").dropFirst().compactMap { Int($0) }
    try #require(counts.count == 2 && counts[0] > 0, "\(line)")
    #expect(counts[1] == counts[0], "38 more cycles left \(counts[1] - counts[0]) descriptors open")
  }
}
