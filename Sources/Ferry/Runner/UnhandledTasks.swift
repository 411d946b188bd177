import Synchronization

/// The tasks a runner found no handler for, since its last `register`. A pass remembers what it
/// found under the generation it started with: a `register` in between starts a new generation,
/// and what an older pass found then is not remembered (it may have a handler now).
final class UnhandledTasks: Sendable {
  private let state = Mutex<(generation: Int, ids: Set<TaskID>)>((0, []))

  var generation: Int { state.withLock { $0.generation } }
  func contains(_ id: TaskID) -> Bool { state.withLock { $0.ids.contains(id) } }
  /// Remembers a task found without a handler under `generation`; false when it was known already
  /// (or the generation is over: then nothing is remembered, and the skip is reported).
  func insert(_ id: TaskID, generation: Int) -> Bool {
    state.withLock { s in
      guard s.generation == generation else { return true }
      return s.ids.insert(id).inserted
    }
  }
  func forget() {
    state.withLock { s in
      s.generation += 1
      s.ids = []
    }
  }
}
