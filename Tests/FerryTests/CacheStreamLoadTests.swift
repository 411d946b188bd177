import FerryLog
import Foundation
import Synchronization
import Testing

@testable import Ferry

@Suite(.timeLimit(.minutes(20))) struct CacheStreamLoadTests {
  /// An app database that can be observed: every write is yielded to every observer.
  final class NotesDatabase: Sendable {
    private let state = Mutex<(notes: [String]?, observers: [AsyncStream<[String]?>.Continuation])>((nil, []))

    func write(_ notes: [String]?) {
      let observers = state.withLock { s in
        s.notes = notes
        return s.observers
      }
      for observer in observers { observer.yield(notes) }
    }

    var notes: [String]? { state.withLock { $0.notes } }

    func observe() -> AsyncStream<[String]?> {
      let (stream, continuation) = AsyncStream<[String]?>.makeStream()
      state.withLock { s in
        continuation.yield(s.notes)
        s.observers.append(continuation)
      }
      return stream
    }
  }

  @Test func theAppsOwnEditsToAnObservedCacheAreNewStates() async throws {
    try await withStore { store, _, _ in
      let database = NotesDatabase()
      let fetches = Mutex(0)
      let source = CacheSource<[String]>(
        fetch: {
          fetches.withLock { $0 += 1 }
          return ["milk"]
        },
        save: { database.write($0) }, load: { database.notes }, observe: { database.observe() })
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(600), source: source)
      var states = notes.states().makeAsyncIterator()
      func value(_ state: CacheState<[String]>?) -> [String]? {
        guard case .cache(let value, _, _, _) = state?.content else { return nil }
        return value
      }
      // No cache: refreshed by itself, and the save shows through the observed database.
      var seen: [[String]?] = []
      while let state = await states.next() {
        seen.append(value(state))
        if value(state) == ["milk"] { break }
      }
      #expect(fetches.withLock { $0 } == 1)
      // The app edits its own database (the user adds an item offline): a new state, no fetch.
      database.write(["milk", "eggs"])
      while let state = await states.next() {
        if value(state) == ["milk", "eggs"] { break }
      }
      #expect(fetches.withLock { $0 } == 1)
      #expect(try store.ledger.record("notes")?.fetchCount == 1)
    }
  }
}
