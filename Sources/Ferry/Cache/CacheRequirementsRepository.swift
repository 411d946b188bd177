import FerryLog
import Synchronization

/// One repository whose *requirements* change — the signed-in user, the page, the search query —
/// instead of one repository per key (Teller's `Repository.requirements`). Each requirements value
/// is a cache key of its own, with its own age and refreshes; `states()` follows the current one.
///
/// ```swift
/// let feed = CacheRequirementsRepository<String, [Post]>(
///   ledger: store.ledger, maxAge: .seconds(600), key: { "feed:\($0)" },
///   source: { user in CacheSource(fetch: { try await api.feed(user) }, save: { ... }, load: { ... }) })
/// try feed.setRequirements("alice")          // observes alice's feed, refreshing it if too old
/// for await state in feed.states() { render(state) }   // nil while there are no requirements
/// try feed.setRequirements(nil)              // signed out: states() says nil
/// ```
public final class CacheRequirementsRepository<Requirements: Hashable & Sendable, Value: Sendable>: Sendable {
  /// The ledger that records every key's fetches.
  public let ledger: CacheLedger
  /// Older than this, a key's cache is too old.
  public let maxAge: Duration
  let key: @Sendable (Requirements) -> String
  let source: @Sendable (Requirements) -> CacheSource<Value>
  let automaticRefresh: Bool
  /// Each key's refresh interval while observed (nil: none).
  public let refreshInterval: Duration?
  let connectivity: (any Connectivity)?
  let gate: PendingTasksGate?

  private struct Current {
    var requirements: Requirements?
    var repository: CacheRepository<Value>?
    /// Bumped on every change, so that a state of the previous requirements is never shown after
    /// the next one's.
    var generation = 0
  }
  private let current = Mutex(Current())
  private let changes = Broadcaster<Int, Int>(buffer: 16)

  /// A repository keyed by `key(requirements)`, fetching and loading through `source(requirements)`.
  /// Each key's repository gets `refreshInterval` and `connectivity` (see
  /// ``CacheRepository/refreshInterval``).
  ///
  /// - Parameters:
  ///   - ledger: The ledger that records every key's fetches (``FerryStore/ledger``).
  ///   - maxAge: Older than this, a key's cache is too old; not negative.
  ///   - key: The cache key of a requirements value.
  ///   - source: Where a requirements value's data comes from and goes to.
  ///   - automaticRefresh: Whether observing refreshes a cache that is missing or too old.
  ///   - refreshInterval: Each key's refresh interval while observed; at least 1 ms. Nil: none.
  ///   - connectivity: What tells the interval's refreshes that the device is offline.
  ///   - gate: Tasks to run before each refresh (``PendingTasksGate``); nil for none.
  /// - Throws: ``FerryError/invalidArgument(_:)`` for a negative `maxAge`, a `refreshInterval` under a
  ///   millisecond, or a gate whose runner runs another store's queue.
  public init(
    ledger: CacheLedger, maxAge: Duration, key: @escaping @Sendable (Requirements) -> String,
    source: @escaping @Sendable (Requirements) -> CacheSource<Value>, automaticRefresh: Bool = true,
    refreshInterval: Duration? = nil, connectivity: (any Connectivity)? = nil,
    requires gate: PendingTasksGate? = nil
  ) throws(FerryError) {
    try CacheLedger.validate(maxAge: maxAge)
    if let refreshInterval { try CacheLedger.validate(refreshInterval: refreshInterval) }
    self.refreshInterval = refreshInterval
    self.connectivity = connectivity
    try gate?.check(against: ledger)
    self.ledger = ledger
    self.maxAge = maxAge
    self.key = key
    self.source = source
    self.automaticRefresh = automaticRefresh
    self.gate = gate
  }

  /// The requirements states follow (nil: none, as when signed out).
  public var requirements: Requirements? { current.withLock { $0.requirements } }

  /// Changes what the repository is about; observers switch to the new key's states at once (a
  /// state of the old one is never shown after it).
  ///
  /// - Parameter requirements: What the repository is about now; nil for nothing (signed out).
  /// - Throws: ``FerryError/invalidArgument(_:)`` when `key(requirements)` is not 1 to
  ///   ``CacheLedger/maxKeyLength`` UTF-8 bytes; the requirements are then unchanged.
  public func setRequirements(_ requirements: Requirements?) throws(FerryError) {
    try engine {
      let repository = try requirements.map { requirements in
        try CacheRepository(
          key: key(requirements), ledger: ledger, maxAge: maxAge, source: source(requirements),
          automaticRefresh: automaticRefresh, refreshInterval: refreshInterval, connectivity: connectivity,
          requires: gate)
      }
      let generation = current.withLock { state -> Int in
        if state.requirements == requirements, requirements != nil { return state.generation }
        state.requirements = requirements
        state.repository = repository
        state.generation += 1
        return state.generation
      }
      changes.publish(generation, for: nil)
    }
  }

  /// The repository of the current requirements, if any.
  public var repository: CacheRepository<Value>? { current.withLock { $0.repository } }

  /// Refreshes the current requirements' cache (see ``CacheRepository/refresh(force:)``).
  ///
  /// - Parameter force: Fetch whatever the cache's age (the gate still applies).
  /// - Returns: The refresh's outcome; ``RefreshOutcome/skipped(_:)`` with ``RefreshSkipReason/cancelled``
  ///   when there are no requirements.
  public func refresh(force: Bool = false) async -> RefreshOutcome {
    guard let repository else { return .skipped(.cancelled) }
    return await repository.refresh(force: force)
  }

  /// The states of the current requirements: nil while there are none; on a change, the new key's
  /// current state first, then its changes (a refresh when it is missing or too old, with
  /// automatic refresh on).
  ///
  /// - Returns: The states, nil while there are no requirements; the stream ends when the observing task is
  ///   cancelled.
  public func states() -> AsyncStream<CacheState<Value>?> {
    let (stream, continuation) = AsyncStream<CacheState<Value>?>.makeStream(
      bufferingPolicy: .bufferingNewest(16))
    let switches = changes.stream(for: nil) { nil }
    let observer = Task { [self] in
      var forwarding: Task<Void, Never>?
      /// Follows the current requirements; returns the generation it follows.
      func follow() -> Int {
        forwarding?.cancel()
        let (repository, generation) = current.withLock { ($0.repository, $0.generation) }
        guard let repository else {
          continuation.yield(nil)
          forwarding = nil
          return generation
        }
        forwarding = Task { [self] in
          for await state in repository.states() {
            // A state of requirements that were replaced meanwhile is dropped.
            let stillCurrent = self.current.withLock { $0.generation == generation }
            guard stillCurrent, !Task.isCancelled else { return }
            continuation.yield(state)
          }
        }
        return generation
      }
      var seen = follow()
      for await generation in switches where generation > seen {
        seen = follow()
      }
      forwarding?.cancel()
      continuation.finish()
    }
    continuation.onTermination = { _ in observer.cancel() }
    return stream
  }
}
