import Ferry
import Synchronization

/// A clock a test moves by hand: "now" stays put until ``advance(by:)`` or ``set(_:)``, and
/// everything that waits for a time (retry timers, max-age notices) wakes exactly when the test
/// moves past it. Tests never sleep.
///
/// ```swift
/// let clock = TestClock()
/// var configuration = FerryStore.Configuration()
/// clock.install(in: &configuration)
/// let store = try await FerryStore.open(at: path, configuration: configuration)
/// clock.advance(by: .seconds(3600))
/// ```
public final class TestClock: Sendable {
  private struct Sleeper {
    let until: Int64
    let continuation: CheckedContinuation<Void, Never>
  }
  private struct State {
    var now: Int64
    var next = 0
    var sleepers: [Int: Sleeper] = [:]
    var cancelled: Set<Int> = []
  }
  private let state: Mutex<State>

  /// A clock reading `now` (Unix milliseconds; by default 2023-11-14 22:13:20 UTC).
  public init(now: Int64 = 1_700_000_000_000) {
    state = Mutex(State(now: now))
  }

  /// The time now, in Unix milliseconds.
  public var now: Int64 { state.withLock { $0.now } }

  /// How many tasks are waiting for a time to come.
  public var sleeperCount: Int { state.withLock { $0.sleepers.count } }

  /// Moves the clock forward (or back, for a negative duration) and wakes every waiter whose time came.
  public func advance(by duration: Duration) {
    move { now in now.addingSaturating(TestClock.milliseconds(duration)) }
  }

  /// Sets the clock and wakes every waiter whose time came.
  public func set(_ time: Int64) { move { _ in time } }

  private func move(_ change: (Int64) -> Int64) {
    let woken = state.withLock { s -> [CheckedContinuation<Void, Never>] in
      let time = change(s.now)
      s.now = time
      let due = s.sleepers.filter { $0.value.until <= time }
      for token in due.keys { s.sleepers[token] = nil }
      return due.values.map(\.continuation)
    }
    for continuation in woken { continuation.resume() }
  }

  /// Waits until the clock reads at least `time`, or the task is cancelled.
  public func sleep(until time: Int64) async {
    let token = state.withLock { s -> Int in
      s.next += 1
      return s.next
    }
    await withTaskCancellationHandler {
      await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
        let now = state.withLock { s -> Bool in
          if s.now >= time || s.cancelled.remove(token) != nil { return true }
          s.sleepers[token] = Sleeper(until: time, continuation: continuation)
          return false
        }
        if now { continuation.resume() }
      }
    } onCancel: {
      let sleeper = state.withLock { s -> Sleeper? in
        if let sleeper = s.sleepers.removeValue(forKey: token) { return sleeper }
        s.cancelled.insert(token)
        return nil
      }
      sleeper?.continuation.resume()
    }
    _ = state.withLock { $0.cancelled.remove(token) }
  }

  /// Makes a store configuration read this clock and wait on it.
  public func install(in configuration: inout FerryStore.Configuration) {
    configuration.clock = { [self] in now }
    configuration.sleep = { [self] time in await sleep(until: time) }
  }

  /// Waits (yielding, never sleeping) until at least `count` tasks wait on the clock, so a test can
  /// advance past a timer it knows is set. Gives up after a great many yields.
  public func waitForSleepers(_ count: Int = 1) async {
    for _ in 0..<1_000_000 where sleeperCount < count { await Task.yield() }
  }
}

extension CacheLedger {
  /// Puts `key` in the state of a key never fetched.
  public func makeNeverFetched(_ key: String) async throws {
    try await forget(key)
  }

  /// Puts `key` in the state of a key fetched just now.
  public func makeFresh(_ key: String) async throws {
    try await recordFetch(key: key, outcome: .success(isEmpty: false), at: now)
  }

  /// Puts `key` in the state of a key too old for `maxAge`: fetched one millisecond more than
  /// `maxAge` ago (exactly `maxAge` would not be too old).
  public func makeTooOld(_ key: String, maxAge: Duration) async throws {
    let ms = TestClock.milliseconds(maxAge)
    try await recordFetch(
      key: key, outcome: .success(isEmpty: false), at: now.addingSaturating(-ms).addingSaturating(-1))
  }
}

extension TestClock {
  /// Whole milliseconds of a duration, saturating at the limits of `Int64`.
  static func milliseconds(_ duration: Duration) -> Int64 {
    let (seconds, attoseconds) = duration.components
    let (ms, overflow) = seconds.multipliedReportingOverflow(by: 1000)
    if overflow { return seconds < 0 ? .min : .max }
    return ms.addingSaturating(attoseconds / 1_000_000_000_000_000)
  }
}

extension Int64 {
  /// `self + other`, clamped to the limits of `Int64`.
  func addingSaturating(_ other: Int64) -> Int64 {
    let (sum, overflow) = addingReportingOverflow(other)
    if overflow { return other < 0 ? .min : .max }
    return sum
  }
}
