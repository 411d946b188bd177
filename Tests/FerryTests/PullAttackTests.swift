import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@testable import Ferry

/// The pull side and observation with company: another process forgets, cancels, compacts and
/// grows the map while this one observes `states()` and `updates()`.
@Suite(.timeLimit(.minutes(3))) struct PullAttackTests {
  /// Collects what a stream yields, on a task of its own, so that a test can wait for a condition
  /// (and detect a hang) without holding the stream's iterator.
  final class Collected<Element: Sendable>: Sendable {
    private let items = Mutex<[Element]>([])
    private let finished = Mutex(false)
    private let task = Mutex<Task<Void, Never>?>(nil)

    init<S: AsyncSequence & Sendable>(_ stream: S) where S.Element == Element {
      let task = Task { [self] in
        do {
          for try await item in stream { items.withLock { $0.append(item) } }
        } catch {}
        finished.withLock { $0 = true }
      }
      self.task.withLock { $0 = task }
    }

    var values: [Element] { items.withLock { $0 } }
    var isFinished: Bool { finished.withLock { $0 } }
    func cancel() { task.withLock { $0?.cancel() } }
  }

  /// Polls `condition` every 5 ms for up to `limit` (a hang detector, not a timed assertion).
  static func eventually(within limit: Duration = .seconds(20), _ condition: () -> Bool) async throws -> Bool {
    let start = ContinuousClock.now
    while !condition() {
      if ContinuousClock.now - start > limit { return false }
      try await Task.sleep(for: .milliseconds(5))
    }
    return true
  }

  static func source() -> CacheSource<String> {
    CacheSource(fetch: { "fresh" }, save: { _ in }, load: { "saved" })
  }

  // MARK: Observing a closed store

  /// A repository observed after its store closed: the stream must end (before, it never did — the
  /// broadcaster that `close` finished took the new subscriber and never finished it).
  @Test func cacheStatesOfAClosedStoreEnd() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    let notes = try CacheRepository(
      key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: Self.source(), automaticRefresh: false)
    store.close()
    let states = Collected(notes.states())
    defer { states.cancel() }
    #expect(try await Self.eventually { states.isFinished }, "states() of a closed store never ended")
  }

  /// The queue's update streams asked for after the store closed end too.
  @Test func queueUpdatesOfAClosedStoreEnd() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    store.close()
    let updates = Collected(store.queue.updates())
    defer { updates.cancel() }
    #expect(try await Self.eventually { updates.isFinished }, "updates() of a closed store never ended")
  }
}
