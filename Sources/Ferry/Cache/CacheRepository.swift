import FerryLog
import Foundation

/// Where a repository's data comes from and goes to: the network, and the app's own cache.
public struct CacheSource<Value: Sendable>: Sendable {
  /// Fetches fresh data from the server.
  public var fetch: @Sendable () async throws -> Value
  /// Saves fetched data into the app's cache. If it throws, the fetch counts as failed.
  public var save: @Sendable (Value) async throws -> Void
  /// Loads what the app's cache holds now (nil when nothing).
  public var load: @Sendable () async throws -> Value?
  /// Whether fetched data is empty (recorded with the fetch).
  public var isEmpty: @Sendable (Value) -> Bool
  /// The app's cache as a stream (Teller's `observeCache`), when the app's database can tell when
  /// it changes: every value it yields — the app's own edits included — is a new state, and the
  /// states show its latest value instead of calling `load` after each change.
  public var observe: (@Sendable () -> AsyncStream<Value?>)?

  /// Describes the source.
  ///
  /// - Parameters:
  ///   - fetch: Fetches fresh data from the server.
  ///   - save: Saves fetched data into the app's cache; a throw fails the fetch.
  ///   - load: Loads what the app's cache holds now (nil when nothing).
  ///   - isEmpty: Whether fetched data is empty (recorded with the fetch).
  ///   - observe: The app's cache as a stream, when its database can tell when it changes; nil: `load` is
  ///     called after each change.
  public init(
    fetch: @escaping @Sendable () async throws -> Value,
    save: @escaping @Sendable (Value) async throws -> Void,
    load: @escaping @Sendable () async throws -> Value?,
    isEmpty: @escaping @Sendable (Value) -> Bool = { _ in false },
    observe: (@Sendable () -> AsyncStream<Value?>)? = nil
  ) {
    self.fetch = fetch
    self.save = save
    self.load = load
    self.isEmpty = isEmpty
    self.observe = observe
  }
}

/// What an observer of a repository sees.
public struct CacheState<Value: Sendable>: Sendable {
  /// The cache itself.
  public enum Content: Sendable {
    /// Never fetched successfully.
    case noCache
    /// Fetched: the app's cached value (nil if its cache holds nothing), when (in whole
    /// milliseconds, as the log keeps it), how long ago, and whether that is older than the max age.
    case cache(Value?, lastFetched: Date, age: Duration, isTooOld: Bool)
  }

  /// The cache.
  public var content: Content
  /// Whether a refresh of the key is under way (by this or another repository of the key).
  public var isRefreshing: Bool
  /// The error of the last refresh that failed, until one succeeds (its `message` for display).
  public var refreshError: RefreshError?
  /// True in the state right after the first successful fetch of a key that had no cache.
  public var justFinishedFirstFetch: Bool
  /// True in the state right after a successful refresh.
  public var justFinishedSuccessfulRefresh: Bool
  /// Tasks of the repository's ``PendingTasksGate`` that can no longer run by themselves — dead,
  /// blocked by an error for the user, manual, or queued behind one of those in their group. The
  /// gate no longer waits for them (a refresh fetches), so their changes have not reached the
  /// server: revive, resolve or run them. Empty without a gate.
  public var stuckTasks: [PendingTask] = []
  /// How many tasks the gate waited for when it last held a refresh back (``RefreshSkipReason/pendingTasks``),
  /// while no fetch has succeeded since; nil when it did not. Other processes' skips count too.
  public var heldBackByPendingTasks: UInt32?
}

/// What a repository's observer reacts to: the ledger's notices and the app's observed cache.
enum RepositoryEvent<Value: Sendable>: Sendable {
  case notice(CacheNotice)
  case observed(Value?)
}

/// A refresh may first require a collection of pending tasks to run successfully, so that fetched
/// data never overwrites a change the server has not seen yet.
public struct PendingTasksGate: Sendable {
  /// The runner that runs the tasks.
  public let runner: TaskRunner
  /// The collection (given in the runner's configuration) of tags to run first.
  public let collection: String

  /// A gate on `collection`, run by `runner`. Checked now, not at the first refresh.
  ///
  /// ```swift
  /// var configuration = TaskRunner.Configuration()
  /// configuration.collections["note-changes"] = ["save-note", "delete-note"]
  /// let runner = TaskRunner(queue: store.queue, configuration: configuration)
  /// let gate = try PendingTasksGate(runner: runner, collection: "note-changes")
  /// ```
  ///
  /// - Parameters:
  ///   - runner: The runner that runs the collection's tasks: the runner of the queue of the store whose
  ///     ledger the repository records in.
  ///   - collection: A collection of the runner's ``TaskRunner/Configuration/collections``.
  /// - Throws: ``FerryError/unknownCollection(_:)`` when the runner's configuration has no such collection;
  ///   ``FerryError/invalidArgument(_:)`` when it has no tags (a gate that could never hold anything back is
  ///   a mistake, not a choice).
  public init(runner: TaskRunner, collection: String) throws(FerryError) {
    guard let tags = runner.configuration.collections[collection] else {
      throw FerryError.unknownCollection(collection)
    }
    guard !tags.isEmpty else {
      throw FerryError.invalidArgument(
        "the collection \"\(collection)\" has no tags: the gate would hold nothing back")
    }
    self.runner = runner
    self.collection = collection
  }

  /// The collection's queued tasks: those that can still run by themselves (ready, running,
  /// waiting for a retry or for their group's head, deferred) — the gate waits for them — and
  /// those that cannot (dead, blocked by an error, manual, or behind one of those in their group).
  func pendingTasks() throws(FerryError) -> (runnable: [PendingTask], stuck: [PendingTask]) {
    let tags = Set(runner.configuration.collections[collection] ?? [])
    let all = try runner.queue.pendingTasks()
    let byId = Dictionary(all.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
    func cannotRunByItself(_ task: PendingTask) -> Bool {
      if task.manual { return true }
      switch task.status {
      case .dead, .blockedByError: return true
      default: return false
      }
    }
    var runnable: [PendingTask] = []
    var stuck: [PendingTask] = []
    for task in all where tags.contains(task.tag) {
      // A task behind its group's head reads which head it waits for: it is as stuck as that head.
      var head: PendingTask?
      if case .waitingForGroup(let behind) = task.status { head = byId[behind] }
      if cannotRunByItself(task) || head.map(cannotRunByItself) == true {
        stuck.append(task)
      } else {
        runnable.append(task)
      }
    }
    return (runnable, stuck)
  }

  /// Throws unless the gate's runner runs the queue of `ledger`'s store.
  func check(against ledger: CacheLedger) throws(FerryError) {
    guard runner.queue.log === ledger.log else {
      throw FerryError.invalidArgument(
        "the pending-tasks gate's runner runs the queue of another store than the repository's ledger")
    }
  }
}

/// Keeps one cache key fresh: refreshes it from the server when it is too old (or asked to), records
/// every fetch in the ledger, and tells observers.
///
/// ```swift
/// let notes = try CacheRepository(key: "notes", ledger: store.ledger, maxAge: .seconds(3600), source: source)
/// for await state in notes.states() { render(state) }   // refreshes by itself when too old
/// ```
public final class CacheRepository<Value: Sendable>: Sendable {
  /// The cache key.
  public let key: String
  /// Older than this, the cache is too old.
  public let maxAge: Duration
  /// The ledger that records its fetches.
  public let ledger: CacheLedger
  let source: CacheSource<Value>
  let automaticRefresh: Bool
  /// While observed, a refresh at least this long after the key's last fetch (nil: none).
  public let refreshInterval: Duration?
  /// What tells the interval's refreshes that the device is offline (nil: they always try).
  let connectivity: (any Connectivity)?
  let gate: PendingTasksGate?
  /// `key` as this process's refreshes, their errors and observers tell keys apart: by its bytes.
  let slot: CacheKeyBytes

  /// A repository of `key`. With `automaticRefresh`, observing it refreshes the cache when there is
  /// none or it is too old (now, or when it crosses its max age while observed).
  ///
  /// With a `refreshInterval`, observing it also refreshes the cache every interval, too old or
  /// not: at least `refreshInterval` after the key's last fetch — successful or failed, by any
  /// repository or process — or the last refresh the gate held back (see ``states()``). That
  /// works with `automaticRefresh` off too. While `connectivity` (by default the gate's runner's)
  /// says offline, the interval's refreshes wait for the network.
  ///
  /// - Parameters:
  ///   - key: The cache key: 1 to ``CacheLedger/maxKeyLength`` UTF-8 bytes.
  ///   - ledger: The ledger that records its fetches (``FerryStore/ledger``).
  ///   - maxAge: Older than this, the cache is too old; not negative.
  ///   - source: Where its data comes from and goes to (``CacheSource``).
  ///   - automaticRefresh: Whether observing it refreshes a cache that is missing or too old.
  ///   - refreshInterval: While observed, refresh at least this long after the key's last fetch, too old or
  ///     not; at least 1 ms. Nil: no interval.
  ///   - connectivity: What tells the interval's refreshes that the device is offline; the gate's runner's
  ///     when nil.
  ///   - gate: Tasks to run before each refresh, so that a fetch never overwrites changes the server has not
  ///     seen (``PendingTasksGate``); nil for none.
  /// - Throws: ``FerryError/invalidArgument(_:)`` for a key that is not 1 to ``CacheLedger/maxKeyLength``
  ///   UTF-8 bytes, a negative `maxAge`, a `refreshInterval` under a millisecond (the log's unit), or a gate
  ///   whose runner runs another store's queue.
  public init(
    key: String, ledger: CacheLedger, maxAge: Duration, source: CacheSource<Value>,
    automaticRefresh: Bool = true,
    refreshInterval: Duration? = nil,
    connectivity: (any Connectivity)? = nil,
    requires gate: PendingTasksGate? = nil
  ) throws(FerryError) {
    try CacheLedger.validate(key)
    try CacheLedger.validate(maxAge: maxAge)
    if let refreshInterval { try CacheLedger.validate(refreshInterval: refreshInterval) }
    try gate?.check(against: ledger)
    self.refreshInterval = refreshInterval
    self.connectivity = connectivity ?? gate?.runner.configuration.connectivity
    self.key = key
    slot = CacheKeyBytes(key)
    self.ledger = ledger
    self.maxAge = maxAge
    self.source = source
    self.automaticRefresh = automaticRefresh
    self.gate = gate
  }

  /// Refreshes the cache if it is too old, made stale by a push
  /// (``TaskResult/succeeded(output:invalidating:)``) or missing. One refresh per key runs at a
  /// time: callers and repositories of the same key share it.
  ///
  /// `force` fetches whatever the cache's age; it does not pass the ``PendingTasksGate``: tasks
  /// of the gate that can still run are run first and, while any is queued, the refresh is
  /// skipped (``RefreshSkipReason/pendingTasks``, logged as `cache.refreshSkipped`) — a forced
  /// refresh must not overwrite a change the server has not seen either. Tasks that cannot run by
  /// themselves (dead, blocked by an error, manual) hold nothing back: the refresh fetches, and
  /// ``CacheState/stuckTasks`` names them.
  ///
  /// - Parameter force: Fetch whatever the cache's age (the gate still applies).
  /// - Returns: How it ended: ``RefreshOutcome/successful``, skipped and why (``RefreshSkipReason``), or
  ///   failed with the error (``RefreshError``). It never throws: a failure is an outcome.
  public func refresh(force: Bool = false) async -> RefreshOutcome {
    if !force, case .cache(_, _, isTooOld: false) = (try? ledger.state(key: key, maxAge: maxAge)) {
      return .skipped(.notTooOld)
    }
    return await sharedRefresh()
  }

  /// Refreshes only when the key has never been fetched successfully. When it has a cache — too
  /// old or not — there is nothing to do, and that is a success (as in Teller: an app checks for
  /// `.successful` and moves on).
  ///
  /// - Returns: ``RefreshOutcome/successful`` at once when the key has a cache; else the refresh's outcome.
  public func refreshIfNoCache() async -> RefreshOutcome {
    if (try? ledger.state(key: key, maxAge: maxAge)) != CacheAge.noCache { return .successful }
    return await sharedRefresh()
  }

  private func sharedRefresh() async -> RefreshOutcome {
    await sharedRefresh(startingIf: { true }) ?? .skipped(.cancelled)
  }

  /// Joins the key's refresh under way, or starts one when `shouldStart` (asked while no refresh
  /// can start or end) says so; nil when it did not.
  private func sharedRefresh(startingIf shouldStart: () -> Bool) async -> RefreshOutcome? {
    if Task.isCancelled { return .skipped(.cancelled) }
    let key = slot
    let refresh = ledger.inFlight.withLock { inFlight -> Task<RefreshOutcome, Never>? in
      if let running = inFlight[key] { return running }
      guard shouldStart() else { return nil }
      let task = Task { [self] in
        await performRefresh()
      }
      inFlight[key] = task
      return task
    }
    return await refresh?.value
  }

  private func performRefresh() async -> RefreshOutcome {
    let hadCache = (try? ledger.record(key))??.lastSuccess != nil
    ledger.changes.publish(.refreshStarted, for: slot)
    let result = await fetchAndSave()
    // Leaving the registry and telling observers happen as one step: an observer or caller that
    // arrives in between would otherwise see a refresh under way whose end it never hears of.
    ledger.inFlight.withLock { inFlight in
      inFlight[slot] = nil
      ledger.rememberRefresh(result, for: key)
      ledger.refreshEnded(slot)
      ledger.changes.publish(
        .refreshFinished(result, firstFetch: !hadCache && result == .successful), for: slot)
    }
    return result
  }

  private func fetchAndSave() async -> RefreshOutcome {
    if let gate {
      do {
        // The pass may be a shared `.all` pass whose report covers other tags too: what counts is
        // whether any task of the collection is still queued after it (a failed, skipped or
        // blocked one is; a succeeded or cancelled one is not).
        // The pass starts only what may start now — never a retry before its time, nothing while
        // offline — so refreshing often spends no attempt the backoff would not have.
        _ = try await gate.runner.run(.collection(gate.collection))
        let held = try gate.pendingTasks().runnable.count
        if held > 0 {
          try await ledger.recordSkip(key: key, pendingTasks: UInt32(clamping: held))
          return .skipped(.pendingTasks)
        }
      } catch {
        // The store's failure, as the app's API throws it (never the engine's error).
        let error = FerryError(error)
        return .failed(
          RefreshError(
            stage: .pendingTasks, message: "the pending tasks could not be run: \(error)", underlying: error))
      }
    }
    // A push that makes the key stale while the fetch is in flight may not be in what it got:
    // fetch again (a few times at most) until no such push came after the fetch began.
    for _ in 0..<3 {
      let began = (try? ledger.log.head()) ?? 0
      let result = await fetchSaveAndRecord()
      guard result == .successful, let stale = (try? ledger.record(key))??.invalidatedAt, stale > began else {
        return result
      }
    }
    return .successful
  }

  /// One fetch, its save and its record.
  private func fetchSaveAndRecord() async -> RefreshOutcome {
    if Task.isCancelled { return .skipped(.cancelled) }
    let value: Value
    do {
      value = try await source.fetch()
    } catch {
      return await recordFailure(
        RefreshError(stage: .fetch, message: "fetch failed: \(error)", underlying: error))
    }
    do {
      try await source.save(value)
    } catch {
      return await recordFailure(
        RefreshError(stage: .save, message: "save failed: \(error)", underlying: error))
    }
    do {
      try await ledger.recordFetch(key: key, outcome: .success(isEmpty: source.isEmpty(value)))
      return .successful
    } catch {
      return .failed(
        RefreshError(
          stage: .recording, message: "the fetch could not be recorded: \(error)", underlying: error))
    }
  }

  private func recordFailure(_ failure: RefreshError) async -> RefreshOutcome {
    do {
      try await ledger.recordFetch(key: key, outcome: .failure(failure.message))
    } catch {
      return .failed(
        RefreshError(
          stage: failure.stage, message: failure.message + " (and it could not be recorded: \(error))",
          underlying: failure.underlying))
    }
    return .failed(failure)
  }

  // MARK: Observing

  /// The state now: the ledger's age of the key, the app's cached value, and the error of the
  /// last refresh when it failed after the last success.
  ///
  /// - Returns: The key's state now, with the app's cached value.
  /// - Throws: A ``FerryError`` when the ledger or the gate's queue cannot be read: ``FerryError/closed`` or
  ///   ``FerryError/suspended`` when the store is closed or suspended; ``FerryError/notCurrent(_:)``,
  ///   ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)`` when the read fails.
  public func currentState() async throws(FerryError) -> CacheState<Value> {
    try await state(
      refreshing: ledger.inFlight.withLock { $0[slot] != nil }, error: lastError(), firstFetch: false,
      success: false)
  }

  /// A failure recorded after the last success: the error until a refresh succeeds. Errors seen
  /// thrown in this process keep their underlying error; one read back from the ledger has its
  /// message only.
  private func lastError() -> RefreshError? {
    if let seen = ledger.lastRefreshError(key) { return seen }
    return (try? ledger.record(key))?.flatMap { record -> RefreshError? in
      guard let failure = record.lastFailureMs, failure.at >= (record.lastSuccessMs ?? .min) else {
        return nil
      }
      return RefreshError(stage: .recorded, message: failure.message)
    }
  }

  private func state(
    refreshing: Bool, error: RefreshError?, firstFetch: Bool, success: Bool, observed: Value?? = nil
  ) async throws(FerryError) -> CacheState<Value> {
    let content: CacheState<Value>.Content
    switch try ledger.state(key: key, maxAge: maxAge) {
    case .noCache: content = .noCache
    case .cache(let lastFetched, let age, let isTooOld):
      // The observed value when the app's cache is a stream; else a load (one that fails shows as
      // an empty cache rather than no state at all).
      let value: Value?
      if let observed { value = observed } else { value = try? await source.load() }
      content = .cache(value, lastFetched: lastFetched, age: age, isTooOld: isTooOld)
    }
    var state = CacheState(
      content: content, isRefreshing: refreshing, refreshError: error, justFinishedFirstFetch: firstFetch,
      justFinishedSuccessfulRefresh: success)
    if let gate { state.stuckTasks = try gate.pendingTasks().stuck }
    state.heldBackByPendingTasks = try ledger.record(key)?.lastSkipMs?.pendingTasks
    return state
  }

  /// The repository's states: the current one first, then one after every change — a refresh
  /// starting or ending, a fetch recorded (here or by another process on the store), the cache
  /// crossing its max age. It never emits an
  /// "unknown" state. With automatic refresh on, a cache that is missing or too old while observed
  /// is refreshed. With a ``refreshInterval``, the key is also refreshed (as by `refresh(force:
  /// true)`, so the gate applies) each time its last fetch — successful or failed, by anyone — or
  /// its last held-back refresh is an interval old: all observers and repositories of the key in
  /// the process share one fetch per interval, and none is made while the connectivity input is
  /// offline. Ends when the observing task is cancelled, and its timers with it; cancelling it
  /// does not cancel a refresh other callers share.
  ///
  /// - Returns: The states, ending when the observing task is cancelled.
  public func states() -> AsyncStream<CacheState<Value>> {
    let (stream, continuation) = AsyncStream<CacheState<Value>>.makeStream(
      bufferingPolicy: .bufferingNewest(16))
    let notices = ledger.changes.stream(for: slot) { nil }
    // The app's cache as a stream: its values arrive as notices too, merged in order.
    let (events, eventSink) = AsyncStream<RepositoryEvent<Value>>.makeStream()
    let noticeFeed = Task {
      for await notice in notices { eventSink.yield(.notice(notice)) }
      eventSink.finish()
    }
    let observedFeed = source.observe.map { observe in
      Task {
        for await value in observe() { eventSink.yield(.observed(value)) }
      }
    }
    let observer = Task { [self] in
      defer {
        noticeFeed.cancel()
        observedFeed?.cancel()
      }
      // The latest value of an observed cache (nil: nothing observed yet, so `load` is asked).
      var observed: Value??
      var refreshing = ledger.inFlight.withLock { $0[slot] != nil }
      // A failure after the last success is the error until a refresh succeeds.
      var lastError = lastError()
      var timer: Task<Void, Never>?
      defer { timer?.cancel() }
      let everyInterval = refreshInterval.map(refreshEveryInterval)
      defer { everyInterval?.cancel() }
      // Whether the last state yielded had a cache.
      var yieldedCache = false
      // Automatic refresh starts only when observing starts and when the cache crosses its max
      // age: after a failed refresh it waits for the next of those (a failing server is not
      // asked again and again).
      func emit(firstFetch: Bool = false, success: Bool = false, mayRefresh: Bool = false) async {
        guard
          let current = try? await state(
            refreshing: refreshing, error: lastError, firstFetch: firstFetch, success: success,
            observed: observed)
        else { return }
        continuation.yield(current)
        if case .noCache = current.content { yieldedCache = false } else { yieldedCache = true }
        timer?.cancel()
        timer = tooOldTimer(current)
        guard automaticRefresh && mayRefresh && !refreshing else { return }
        switch current.content {
        case .noCache, .cache(_, _, _, isTooOld: true): Task { _ = await refresh() }
        default: break
        }
      }
      await emit(mayRefresh: true)
      for await event in events {
        let notice: CacheNotice
        switch event {
        case .observed(let value):
          observed = .some(value)
          await emit()
          continue
        case .notice(let received): notice = received
        }
        switch notice {
        case .changed:
          // A key forgotten while observed has no cache: fetch it (a failed fetch is recorded
          // while the refresh is under way, so this cannot repeat on its own).
          let hadCache = (try? ledger.record(key))??.lastSuccess != nil
          // A fetch recorded by another process (or another caller) may end the error or be one:
          // read it as a new observer would, unless a refresh under way will settle it.
          if !refreshing { lastError = self.lastError() }
          await emit(mayRefresh: !hadCache)
        case .mayHaveChanged:
          // Another process's events were compacted away unread: read the state again, and
          // fetch when it lost its cache (forgotten there) — not because of the notice alone.
          let hasCache = (try? ledger.record(key))??.lastSuccess != nil
          if !refreshing { lastError = self.lastError() }
          await emit(mayRefresh: yieldedCache && !hasCache)
        case .crossedMaxAge, .invalidated: await emit(mayRefresh: true)
        case .refreshStarted:
          refreshing = true
          await emit()
        case .refreshFinished(let result, let firstFetch):
          refreshing = false
          if case .failed(let error) = result { lastError = error }
          if result == .successful { lastError = nil }
          await emit(firstFetch: firstFetch, success: result == .successful)
        }
      }
      continuation.finish()
    }
    continuation.onTermination = { _ in observer.cancel() }
    return stream
  }

  // MARK: Refreshing every interval

  /// While observing: refreshes the key whenever its last fetch (or held-back refresh, or refresh
  /// ended in this process) is `interval` old. Every observer of the key runs one, and they share
  /// one refresh per interval: the check that one is due and its start happen while no refresh of
  /// the key can start or end, and a refresh that ended counts as a fetch for the next check.
  private func refreshEveryInterval(_ interval: Duration) -> Task<Void, Never> {
    Task { [self] in
      let step = interval.milliseconds
      while !Task.isCancelled {
        let times = intervalTimes()
        await ledger.sleep(Self.intervalDue(times, step: step, now: ledger.clock()))
        if Task.isCancelled { return }
        if let connectivity, !connectivity.isOnline {
          // Offline: no fetch, and no wake-up, until the network is back (then one at once when due).
          let changes = connectivity.changes()
          var back = connectivity.isOnline
          if !back {
            for await online in changes where online {
              back = true
              break
            }
          }
          // An input whose stream ended while offline would have this loop spin: wait an interval.
          if !back { await ledger.sleep(ledger.clock().addingSaturating(step)) }
          continue
        }
        // Read before the check: a fetch recorded in this process since shows as a refresh ended.
        let recorded = recordedIntervalTimes()
        _ = await sharedRefresh(startingIf: { [ledger, slot] in
          let now = ledger.clock()
          let times = recorded + [ledger.lastRefreshEnd(slot)].compactMap { $0 }
          return Self.intervalDue(times, step: step, now: now) <= now
        })
      }
    }
  }

  /// The times the interval is measured from: the last fetch recorded (any outcome, any
  /// process), the last refresh held back by the gate, and the end of this process's last refresh
  /// of the key (which counts one that recorded nothing: a gate that could not run, a fetch that
  /// could not be recorded).
  private func intervalTimes() -> [Int64] {
    recordedIntervalTimes() + [ledger.lastRefreshEnd(slot)].compactMap { $0 }
  }

  private func recordedIntervalTimes() -> [Int64] {
    // A record that cannot be read counts as no fetch: the refresh it leads to ends, and that end
    // is the next interval's start, so it cannot repeat at once.
    guard let record = (try? ledger.record(key)) ?? nil else { return [] }
    return [record.lastAttemptMs, record.lastSkipMs?.at].compactMap { $0 }
  }

  /// When the next interval refresh is due: `step` after the latest of `times` that is not after
  /// `now`. A time after `now` (a clock set back, another process's clock ahead) cannot be
  /// measured from and is passed over; with no time left, it is due now.
  static func intervalDue(_ times: [Int64], step: Int64, now: Int64) -> Int64 {
    guard let latest = times.filter({ $0 <= now }).max() else { return now }
    return latest.addingSaturating(step)
  }

  /// A timer that tells observers when the cache crosses its max age.
  private func tooOldTimer(_ current: CacheState<Value>) -> Task<Void, Never>? {
    guard case .cache(_, let lastFetched, _, isTooOld: false) = current.content else { return nil }
    let (end, overflow) = lastFetched.unixMilliseconds.addingReportingOverflow(maxAge.milliseconds)
    guard !overflow, end < .max else { return nil }  // a max age that never ends: no timer
    let crossing = end + 1
    return Task { [ledger, slot] in
      await ledger.sleep(crossing)
      if !Task.isCancelled { ledger.changes.publish(.crossedMaxAge, for: slot) }
    }
  }
}
