import Synchronization

/// Hands values to the streams that observe them, in this process: a stream observes one key
/// (a task, a cache key) or everything; a value for no key in particular reaches every stream.
final class Broadcaster<Element: Sendable, Key: Hashable & Sendable>: Sendable {
  private struct State {
    var next = 0
    var subscribers: [Int: (key: Key?, continuation: AsyncStream<Element>.Continuation)] = [:]
    /// Set by `finish`: a stream asked for later ends at once (after what `first` gives).
    var isFinished = false
    /// Told true before a first stream subscribes and false when the last one has ended.
    var whileObserved: (@Sendable (Bool) -> Void)?
  }
  private let state = Mutex(State())
  private let buffer: Int

  /// A broadcaster whose streams keep at most `buffer` values their readers have not taken yet.
  init(buffer: Int) { self.buffer = buffer }

  /// Delivers `value` to the streams of `key` and to those observing everything (to all when nil).
  func publish(_ value: Element, for key: Key?) {
    let targets = state.withLock { s in
      s.subscribers.values.filter { $0.key == nil || key == nil || $0.key == key }.map(\.continuation)
    }
    for continuation in targets { continuation.yield(value) }
  }

  /// The keys observed now (streams of everything not counted).
  var keys: Set<Key> { state.withLock { Set($0.subscribers.values.compactMap(\.key)) } }

  /// Sets what to do while anyone observes: `hook(true)` runs before a stream subscribes when
  /// there is none, `hook(false)` once the last one has ended (not at `finish`: its owner stops
  /// what it started). Both run under the broadcaster's lock, so they alternate in order and a
  /// value published meanwhile waits for the subscription. It must not publish.
  func whileObserved(_ hook: @escaping @Sendable (Bool) -> Void) {
    state.withLock { $0.whileObserved = hook }
  }

  /// A stream of the values for `key` (everything when nil), starting with what `first` gives.
  /// `first` runs while publishing waits, so no value falls between it and the subscription (one
  /// may be seen twice: in `first`'s state and as a value). After `finish`, the stream ends at once.
  func stream(for key: Key?, first: () throws -> Element?) rethrows -> AsyncStream<Element> {
    let (stream, continuation) = AsyncStream<Element>.makeStream(bufferingPolicy: .bufferingNewest(buffer))
    let token = try state.withLock { s -> Int? in
      // What starts with the first stream starts before `first` reads the state: nothing can fall
      // between that read and what it then follows.
      let starts = !s.isFinished && s.subscribers.isEmpty
      if starts { s.whileObserved?(true) }
      do {
        if let value = try first() { continuation.yield(value) }
      } catch {
        if starts { s.whileObserved?(false) }
        throw error
      }
      if s.isFinished { return nil }
      s.next += 1
      s.subscribers[s.next] = (key, continuation)
      return s.next
    }
    guard let token else {
      // Finished (the store closed): nothing will ever be published to it.
      continuation.finish()
      return stream
    }
    continuation.onTermination = { [weak self] _ in
      self?.state.withLock { s in
        if s.subscribers.removeValue(forKey: token) != nil, s.subscribers.isEmpty { s.whileObserved?(false) }
      }
    }
    return stream
  }

  /// Ends every stream.
  func finish() {
    let all = state.withLock { s in
      s.isFinished = true
      s.whileObserved = nil
      defer { s.subscribers = [:] }
      return s.subscribers.values.map(\.continuation)
    }
    for continuation in all { continuation.finish() }
  }
}
