import Synchronization

/// Wakes tasks waiting for the log's head to pass a sequence number.
final class HeadNotifier: Sendable {
  private struct State {
    var head: UInt64 = 0
    var isClosed = false
    var nextToken = 0
    var waiters: [Int: (after: UInt64, continuation: CheckedContinuation<Void, Never>)] = [:]
    var cancelled: Set<Int> = []
  }

  private let state = Mutex(State())

  /// Records a new head and wakes every waiter it satisfies.
  func publish(_ head: UInt64) {
    let woken = state.withLock { s -> [CheckedContinuation<Void, Never>] in
      s.head = max(s.head, head)
      // Every commit publishes; usually nobody waits (filtering an empty table still built one).
      if s.waiters.isEmpty { return [] }
      let ready = s.waiters.filter { $0.value.after < s.head }
      for token in ready.keys { s.waiters[token] = nil }
      return ready.values.map(\.continuation)
    }
    for continuation in woken { continuation.resume() }
  }

  /// Wakes everyone; later waits return at once.
  func close() {
    let woken = state.withLock { s -> [CheckedContinuation<Void, Never>] in
      s.isClosed = true
      defer { s.waiters = [:] }
      return s.waiters.values.map(\.continuation)
    }
    for continuation in woken { continuation.resume() }
  }

  /// Returns once the head passes `sequence`, the notifier closes, or the task is cancelled.
  func wait(after sequence: UInt64) async {
    let token = state.withLock { s -> Int in
      s.nextToken += 1
      return s.nextToken
    }
    await withTaskCancellationHandler {
      await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
        let resumeNow = state.withLock { s -> Bool in
          if s.isClosed || s.head > sequence || s.cancelled.remove(token) != nil { return true }
          s.waiters[token] = (sequence, continuation)
          return false
        }
        if resumeNow { continuation.resume() }
      }
    } onCancel: {
      let waiter = state.withLock { s -> CheckedContinuation<Void, Never>? in
        if let waiter = s.waiters.removeValue(forKey: token) { return waiter.continuation }
        s.cancelled.insert(token)
        return nil
      }
      waiter?.resume()
    }
    // A cancellation that raced with a normal wake-up leaves its token behind: drop it.
    _ = state.withLock { s in s.cancelled.remove(token) }
  }
}

/// The events of a log from a starting point on, then each new one as it is committed.
///
/// ```swift
/// for try await event in log.tail(after: 0) { print(event.sequence, event.type) }
/// ```
///
/// It ends when the log is closed or the iterating task is cancelled. In-process appends wake it
/// at once; with a `pollInterval` it also looks for appends made by other processes.
public struct LogTail: AsyncSequence, Sendable {
  /// Each element is one logged event.
  public typealias Element = LoggedEvent

  let log: EventLog
  let after: UInt64
  let pollInterval: Duration?
  let chunkSize: Int

  /// Creates the iterator.
  public func makeAsyncIterator() -> Iterator {
    Iterator(log: log, last: after, pollInterval: pollInterval, chunkSize: chunkSize)
  }

  /// Reads chunks of events and waits for more.
  public struct Iterator: AsyncIteratorProtocol {
    let log: EventLog
    var last: UInt64
    let pollInterval: Duration?
    let chunkSize: Int
    var buffer: [LoggedEvent] = []
    var index = 0

    init(log: EventLog, last: UInt64, pollInterval: Duration?, chunkSize: Int) {
      self.log = log
      self.last = last
      self.pollInterval = pollInterval
      self.chunkSize = chunkSize
    }

    /// The next event, waiting for one to be committed; nil when the log closes or the task is cancelled.
    public mutating func next() async throws -> LoggedEvent? {
      while true {
        if index < buffer.count {
          let event = buffer[index]
          index += 1
          last = event.sequence
          return event
        }
        if Task.isCancelled || log.isClosed { return nil }
        do {
          buffer = try log.events(after: last, limit: chunkSize)
        } catch FerryLogError.closed {
          return nil  // closed between the check and the read
        }
        index = 0
        if !buffer.isEmpty { continue }
        let notifier = log.notifier
        let waitingAfter = last
        if let pollInterval {
          await withTaskGroup(of: Void.self) { group in
            group.addTask { await notifier.wait(after: waitingAfter) }
            group.addTask { try? await Task.sleep(for: pollInterval) }
            await group.next()
            group.cancelAll()
          }
        } else {
          await notifier.wait(after: waitingAfter)
        }
      }
    }
  }
}

extension EventLog {
  /// The events after `sequence`, then every new event as it is committed. A runner's claim is
  /// committed before it is durable (``CommandContext/mayDeferFlush()``): a power cut may take it
  /// back, and its sequence number is then given out again.
  ///
  /// Give a `pollInterval` to also see appends made by other processes (they cannot wake this one).
  public func tail(
    after sequence: UInt64 = 0, pollInterval: Duration? = nil, chunkSize: Int = 1000
  ) -> LogTail {
    LogTail(log: self, after: sequence, pollInterval: pollInterval, chunkSize: max(1, chunkSize))
  }
}
