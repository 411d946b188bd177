import Synchronization

/// Where a pass's handlers leave their ended runs: the pass takes everything there, waiting for
/// the first when there is nothing yet.
final class Mailbox<Item: Sendable>: Sendable {
  private let core = MailboxCore<Item>()

  func put(_ item: Item) { core.put(item) }
  /// Puts `items` at once: a taker gets all of them or none.
  func put(contentsOf items: [Item]) { core.put(contentsOf: items) }
  /// Everything left so far, without waiting.
  func takeAvailable() -> [Item] { core.takeAvailable() }
  /// Everything left so far; waits for the first item when there is none.
  func takeAll() async -> [Item] { await core.takeAll() }
}

/// What a ``Mailbox`` does, in a struct that a class that is not generic can hold.
struct MailboxCore<Item: Sendable>: ~Copyable, Sendable {
  // Not private: Swift 6.3's debug build of another file that holds a `MailboxCore` crashes on
  // a private nested type here ("Global is external, but doesn't have external linkage").
  struct State {
    var items: [Item] = []
    // Unsafe, not checked: `put` takes the waiter out under the lock before resuming it, so it
    // is resumed exactly once (a checked one costs an allocation and a metadata lookup a wait).
    var waiter: UnsafeContinuation<[Item], Never>?
  }
  private let state = Mutex(State())

  func put(contentsOf items: [Item]) {
    let resume = state.withLock { s -> (UnsafeContinuation<[Item], Never>, [Item])? in
      s.items += items
      guard let waiter = s.waiter else { return nil }
      s.waiter = nil
      defer { s.items = [] }
      return (waiter, s.items)
    }
    if let (waiter, items) = resume { waiter.resume(returning: items) }
  }

  func put(_ item: Item) {
    let resume = state.withLock { s -> (UnsafeContinuation<[Item], Never>, [Item])? in
      s.items.append(item)
      guard let waiter = s.waiter else { return nil }
      s.waiter = nil
      defer { s.items = [] }
      return (waiter, s.items)
    }
    if let (waiter, items) = resume { waiter.resume(returning: items) }
  }

  /// Everything left so far, without waiting.
  func takeAvailable() -> [Item] {
    state.withLock { s in
      defer { s.items = [] }
      return s.items
    }
  }

  /// Everything left so far; waits for the first item when there is none.
  func takeAll() async -> [Item] {
    await withUnsafeContinuation { (continuation: UnsafeContinuation<[Item], Never>) in
      let ready = state.withLock { s -> [Item]? in
        if s.items.isEmpty {
          // One waiter at a time (the pass's loop, or one handler call's): a second would be lost.
          assert(s.waiter == nil, "a mailbox has one waiter at a time")
          s.waiter = continuation
          return nil
        }
        defer { s.items = [] }
        return s.items
      }
      if let ready { continuation.resume(returning: ready) }
    }
  }
}
