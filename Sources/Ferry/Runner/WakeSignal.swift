import Synchronization

/// Wakes the automatic-running loop: a signal given while nobody waits is kept for the next wait.
final class WakeSignal: Sendable {
  private struct State {
    var pending = false
    var waiter: CheckedContinuation<Void, Never>?
  }
  private let state = Mutex(State())

  func signal() {
    let waiter = state.withLock { s -> CheckedContinuation<Void, Never>? in
      if let waiter = s.waiter {
        s.waiter = nil
        return waiter
      }
      s.pending = true
      return nil
    }
    waiter?.resume()
  }

  /// Takes a signal given while nobody waited; false when there was none.
  func take() -> Bool {
    state.withLock { s in
      defer { s.pending = false }
      return s.pending
    }
  }

  func wait() async {
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
      let now = state.withLock { s -> Bool in
        if s.pending {
          s.pending = false
          return true
        }
        s.waiter = continuation
        return false
      }
      if now { continuation.resume() }
    }
  }
}
