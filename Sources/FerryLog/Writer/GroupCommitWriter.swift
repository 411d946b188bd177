import CFerryCRC
import CoreMetrics
import Foundation
import LMDB
import Synchronization

/// An event ready for the writer: validated, with its id and timestamp fixed and its record encoded
/// (encoding and the CRC are done by the caller, in parallel, not on the writer thread).
struct PreparedEvent: Sendable {
  let type: String
  /// The schema version stored in the record.
  let schemaVersion: UInt16
  /// The version and payload projections see (upcast through the catalog when older).
  let currentSchemaVersion: UInt16
  let currentPayload: [UInt8]
  let timestamp: Int64
  let id: EventID
  let payload: [UInt8]
  /// The record without its sequence number (given, and the CRC finished, by the writer).
  let record: EventRecord.Unsealed
  /// The appender's decoded form of `currentPayload`, handed to the projections (``NewEvent/decoded``).
  var decoded: (any Sendable)? = nil
}

/// The one thread that writes to the store. Every append waiting when it wakes goes into one
/// write transaction — one commit, one pair of fsyncs — then all those callers are resumed
/// together (group commit). Exclusive jobs (rebuilds) run alone between batches.
final class GroupCommitWriter: @unchecked Sendable {
  // Why @unchecked: the mutable state (`jobs`, `stopping`) is only touched with `condition`
  // held; `statistics` is a Mutex; `batchBytes` is touched only on the writer thread; the rest is
  // immutable after init.

  struct AppendRequest {
    enum Work {
      /// Events prepared by the caller.
      case events([PreparedEvent])
      /// A decision made inside the transaction (see ``CommandContext``).
      case command(@Sendable (CommandContext) throws -> any Sendable)
    }
    let work: Work
    /// Resumed exactly once, by the writer thread: every path of `commit` resumes each request it
    /// took once and drops it, and the thread takes every job submitted before it stops (a
    /// submit refused at stop resumes its own). Unsafe rather than checked: a checked one costs an
    /// allocation and a metadata lookup a call, on the run path.
    let continuation: UnsafeContinuation<AppendOutcome, any Error>

    /// Events counted against a commit's limit (a command's are not known before it runs).
    var weight: Int {
      switch work {
      case .events(let events): return events.count
      case .command: return 1
      }
    }
  }

  /// What one request got: the sequences of the events it appended and a command's result.
  struct AppendOutcome: Sendable {
    var sequences: [UInt64]
    var result: (any Sendable)?
  }

  enum Job {
    case append(AppendRequest)
    case exclusive(@Sendable () -> Void)
  }

  /// Why a batch failed: the error belongs to the request at `index` alone.
  struct RequestFailure: Error {
    let index: Int
    let error: any Error
  }

  let environment: Environment
  let core: StoreCore
  let maxEventsPerCommit: Int
  /// Events a projection may be behind and still be caught up inside an append's transaction;
  /// more are replayed first in chunked transactions of their own.
  let catchUpChunk: Int
  let onCommit: @Sendable (UInt64) -> Void
  /// Called with the new head after a durable commit, before any of its callers is acknowledged.
  let onDurable: @Sendable (UInt64) -> Void
  /// Validates and encodes the events a command appends (on this thread).
  let prepare: @Sendable ([NewEvent]) throws -> [PreparedEvent]
  /// Called with the sequences a transaction is about to commit, and again (false) when it did not.
  let onOwnRange: @Sendable (ClosedRange<UInt64>, Bool) -> Void
  let statistics = Mutex(EventLog.Statistics())
  /// Commit metrics and trace lines (LogMetrics.swift).
  let instruments: LogInstruments
  /// Record bytes of the batch last written (set and read on the writer thread only).
  @exclusivity(unchecked) private var batchBytes = 0
  /// The id of this writer's last transaction that wrote, and the log's head it left. A write
  /// transaction whose id is the next one follows it with no other write between — by any process
  /// (LMDB numbers write transactions across processes): the head is known and no projection can
  /// be behind, so neither is read again.
  @exclusivity(unchecked) private var lastWritten: (transaction: UInt64, head: UInt64)?
  /// The store's write-ahead segment, when it has one: each commit's records go into one flushed
  /// frame before the (unflushed) LMDB commit (`Specs/one-sync-commit.md`).
  let segment: SegmentSession?

  private let condition = Condition()
  /// Jobs submitted since start: what a spinning writer watches (it polls without the lock).
  private let submitted = Atomic<Int>(0)
  /// When to poll for the next job before sleeping (touched on the writer thread only).
  @exclusivity(unchecked) private var spin: SpinPolicy
  /// The poll's window in nanoseconds (0: never), as configured (for tests).
  let spinWindow: UInt64
  private var jobs: [Job] = []
  private var stopping = false
  private let finished = DispatchSemaphore(value: 0)

  /// A projection is further behind than one transaction should replay.
  struct FarBehind: Error {}

  init(
    environment: Environment, core: StoreCore, maxEventsPerCommit: Int, catchUpChunk: Int,
    prepare: @escaping @Sendable ([NewEvent]) throws -> [PreparedEvent],
    onOwnRange: @escaping @Sendable (ClosedRange<UInt64>, Bool) -> Void = { _, _ in },
    onDurable: @escaping @Sendable (UInt64) -> Void = { _ in },
    onCommit: @escaping @Sendable (UInt64) -> Void,
    instruments: LogInstruments = LogInstruments(logger: nil, metricsFactory: NOOPMetricsHandler.instance),
    segment: SegmentSession? = nil, spin: Duration = .zero
  ) {
    self.spin = SpinPolicy(window: spin, processors: SpinPolicy.usableProcessors())
    self.spinWindow = self.spin.window
    self.segment = segment
    self.instruments = instruments
    self.onDurable = onDurable
    self.prepare = prepare
    self.onOwnRange = onOwnRange
    self.environment = environment
    self.core = core
    self.maxEventsPerCommit = max(1, maxEventsPerCommit)
    self.catchUpChunk = max(1, catchUpChunk)
    self.onCommit = onCommit
  }

  /// The name of every writer thread (for debuggers and crash reports).
  static let threadName = "ferry.writer"

  /// The writer thread, once it has started. Its name does not tell it (on Linux, Foundation's
  /// `Thread.current.name` there is the name the system gave the thread, not the one set before
  /// it started).
  private let thread = Mutex<ThreadIdentity?>(nil)

  /// Whether the caller runs on this writer's thread: a job there that waited for another job
  /// would wait for itself.
  var isCurrentThread: Bool {
    let current = ThreadIdentity.current
    return thread.withLock { $0 == current }
  }

  func start() {
    let thread = Thread { [self] in
      self.thread.withLock { $0 = .current }
      run()
      finished.signal()
    }
    thread.name = Self.threadName
    thread.start()
  }

  /// Queues a job; false when the writer is stopping (the log is closed).
  func submit(_ job: Job) -> Bool {
    condition.withLock {
      if stopping { return false }
      jobs.append(job)
      submitted.add(1, ordering: .releasing)
      condition.broadcast()
      return true
    }
  }

  /// Lets queued jobs finish, then ends the thread and waits for it.
  func stop() {
    let wasRunning = condition.withLock {
      defer { stopping = true }
      condition.broadcast()
      return !stopping
    }
    if wasRunning { finished.wait() }
  }

  private func run() {
    while true {
      condition.lock()
      if jobs.isEmpty && !stopping {
        // The clock only for a writer that may poll (none without the segment, by default).
        let idleSince = spin.window > 0 ? SpinPolicy.now() : 0
        if spin.shouldSpin {
          // Jobs have been coming close together (a caller adding one after another, a runner
          // finishing one task and claiming the next): poll for the next one a few microseconds
          // before sleeping, since waking a sleeping thread costs more than that on many
          // machines. Bounded by the window, and only while jobs keep arriving within a few
          // windows of each other — an idle store's writer sleeps.
          let seen = submitted.load(ordering: .acquiring)
          condition.unlock()
          let deadline = idleSince &+ spin.window
          var caught = false
          repeat {
            ferry_cpu_relax()
            if submitted.load(ordering: .acquiring) != seen {
              caught = true
              break
            }
          } while SpinPolicy.now() < deadline
          statistics.withLock { s in
            s.writerSpins += 1
            if caught { s.writerSpinsCaught += 1 }
          }
          condition.lock()
        }
        while jobs.isEmpty && !stopping { condition.wait() }
        if spin.window > 0 { spin.waited(SpinPolicy.now() &- idleSince) }
      }
      if jobs.isEmpty {
        condition.unlock()
        return
      }
      var batch: [AppendRequest] = []
      var exclusive: (@Sendable () -> Void)?
      var eventCount = 0
      var taken = 0
      for job in jobs {
        switch job {
        case .exclusive(let work):
          if batch.isEmpty {
            exclusive = work
            taken += 1
          }
        case .append(let request):
          if batch.isEmpty || eventCount + request.weight <= maxEventsPerCommit {
            batch.append(request)
            eventCount += request.weight
            taken += 1
            continue
          }
        }
        break
      }
      jobs.removeFirst(taken)
      condition.unlock()

      if let exclusive {
        exclusive()
      } else {
        commit(batch)
      }
    }
  }

  /// Writes the requests in one transaction. A request whose events a projection rejects (or a
  /// command that throws after appending) is failed alone and the others are written in a fresh
  /// transaction; a command that throws before appending anything fails alone in the same one.
  private func commit(_ requests: [AppendRequest]) {
    var live = requests
    while !live.isEmpty {
      var pending: ClosedRange<UInt64>?
      let started = instruments.measures ? LogInstruments.now() : 0
      var bodyEnded: UInt64 = 0
      // Whether this commit flushed a frame of the segment: only then is its head durable (a
      // commit without a frame may follow an unflushed claim's frame, of any process).
      var flushedFrame = false
      do {
        let (results, head, _, duplicates, _, written, _) = try environment.write { txn in
          let begun = try segment?.beginCommit(environment: environment, txn: txn, core: core)
          let outcome = try appendBatch(live, txn)
          if let segment, let begun, let records = outcome.records, !records.isEmpty {
            try segment.writeFrame(
              environment: environment, txn: txn, core: core, begun: begun, first: outcome.first,
              records: records, flush: !outcome.defersFlush)
            flushedFrame = !outcome.defersFlush
          }
          if outcome.head >= outcome.first {
            pending = outcome.first...outcome.head
            onOwnRange(outcome.first...outcome.head, true)
          }
          if started > 0 { bodyEnded = LogInstruments.now() }
          return outcome
        }
        // Committed: a transaction that wrote nothing left LMDB's numbering where it was, and the
        // last one that wrote still stands.
        if let written { lastWritten = (written, head) }
        segment?.confirmFrame()
        CrashPoint.reach(CrashPoint.afterCommit)
        let eventsWritten = results.reduce(0) { total, result in
          total + ((try? result.get().sequences.count) ?? 0)
        }
        spin.committed(requests: live.count, events: eventsWritten)
        statistics.withLock { s in
          s.commits += 1
          s.appendCalls += live.count
          s.eventsAppended += eventsWritten - duplicates
          s.duplicatesSkipped += duplicates
          s.largestBatch = max(s.largestBatch, live.count)
        }
        // An unflushed frame is not durable yet: the mark waits for the next flushed frame, whose
        // flush of the same file carries this one with it. Without the segment LMDB flushed.
        if segment == nil || flushedFrame { onDurable(head) }
        instruments.committed(
          events: eventsWritten - duplicates, bytes: batchBytes, calls: live.count, head: head,
          started: started,
          bodyEnded: bodyEnded)
        for (request, result) in zip(live, results) { request.continuation.resume(with: result) }
        onCommit(head)
        return
      } catch is FarBehind {
        segment?.abandonFrame()
        if let pending { onOwnRange(pending, false) }
        do {
          // Only fold (never reset): a projection another process stored at another version, or
          // whose state disappeared, is left alone, and the next try refuses it in catchUpInline.
          _ = try EventLog.foldBehind(core, environment: environment, chunk: catchUpChunk)
        } catch {
          for request in live {
            request.continuation.resume(throwing: FerryLogError.wrap(error, path: environment.path))
          }
          return
        }
      } catch let failure as RequestFailure {
        segment?.abandonFrame()
        if let pending { onOwnRange(pending, false) }
        if let lmdb = failure.error as? LMDBError, lmdb == .transactionFull, live.count > 1 {
          // Too much for one transaction: write the batch in two halves.
          let half = live.count / 2
          commit(Array(live[..<half]))
          commit(Array(live[half...]))
          return
        }
        instruments.requestFailed(FerryLogError.wrap(failure.error, path: environment.path))
        live[failure.index].continuation.resume(
          throwing: FerryLogError.wrap(failure.error, path: environment.path))
        live.remove(at: failure.index)
      } catch {
        segment?.abandonFrame()
        if let pending { onOwnRange(pending, false) }
        instruments.commitFailed(FerryLogError.wrap(error, path: environment.path), calls: live.count)
        for request in live {
          request.continuation.resume(throwing: FerryLogError.wrap(error, path: environment.path))
        }
        return
      }
    }
  }

  private func appendBatch(
    _ requests: [AppendRequest], _ txn: Transaction
  ) throws -> (
    results: [Result<AppendOutcome, any Error>], head: UInt64, first: UInt64, duplicates: Int,
    records: [[UInt8]]?,
    written: UInt64?, defersFlush: Bool
  ) {
    let start: UInt64
    let caughtUp: Bool
    if let last = lastWritten, txn.id == last.transaction &+ 1 {
      start = last.head
      caughtUp = false
    } else {
      start = try core.head(txn)
      caughtUp = try catchUpInline(to: start, txn)
    }
    let batch = BatchAppender(core: core, txn: txn, head: start, collectsRecords: segment != nil)
    // Whether every request lets its events wait for the next flushed commit (commands that
    // called `mayDeferFlush`); plain appends never do.
    var deferrable = segment != nil
    var results: [Result<AppendOutcome, any Error>] = []
    results.reserveCapacity(requests.count)
    for (index, request) in requests.enumerated() {
      let before = batch.head
      do {
        switch request.work {
        case .events(let events):
          deferrable = false
          var sequences: [UInt64] = []
          sequences.reserveCapacity(events.count)
          for event in events { sequences.append(try batch.append(event)) }
          results.append(.success(AppendOutcome(sequences: sequences, result: nil)))
        case .command(let decide):
          let context = CommandContext(batch: batch, prepare: prepare)
          defer { context.finish() }
          do {
            let result = try decide(context)
            if !context.defersFlush { deferrable = false }
            results.append(.success(AppendOutcome(sequences: context.sequences, result: result)))
          } catch let error as LMDBError where error == .mapFull {
            throw error
          } catch {
            // Nothing appended: the command alone fails, and the batch goes on in this transaction.
            guard batch.head != before || txn.firstFailure != nil else {
              results.append(.failure(FerryLogError.wrap(error, path: environment.path)))
              continue
            }
            throw error
          }
        }
        // A projection may have caught an LMDB error and carried on; LMDB refuses the rest of the
        // transaction after most errors, so the request during which it happened owns it.
        if let failure = txn.firstFailure { throw failure }
      } catch let error as LMDBError where error == .mapFull {
        throw error
      } catch {
        throw RequestFailure(index: index, error: error)
      }
    }
    // A batch of commands that appended nothing (and no catch-up) leaves the transaction clean:
    // its commit writes and flushes nothing.
    let wrote = batch.head != start || caughtUp
    if wrote {
      for target in core.projections {
        try core.setState(
          ProjectionState(version: target.projection.version, position: batch.head), of: target, txn)
      }
    }
    CrashPoint.reach(CrashPoint.beforeCommit)
    batchBytes = batch.bytesAppended
    return (
      results, batch.head, start + 1, batch.duplicates, batch.records, wrote ? txn.id : nil,
      deferrable && !results.isEmpty
    )
  }

  /// Another process may have appended without this process's projections: fold what they missed
  /// into them first, in the same transaction. Returns whether it folded anything.
  private func catchUpInline(to head: UInt64, _ txn: Transaction) throws -> Bool {
    var folded = false
    for target in core.projections {
      guard let state = try core.state(of: target, txn) else {
        throw FerryLogError.projectionNotCurrent(
          projection: target.name,
          reason: "its stored state disappeared while this process had the store open")
      }
      guard state.version == target.projection.version else {
        throw FerryLogError.projectionNotCurrent(
          projection: target.name,
          reason:
            "another process changed its version to \(state.version) while this one runs version \(target.projection.version)"
        )
      }
      if state.position < head {
        guard head - state.position <= UInt64(catchUpChunk) else { throw FarBehind() }
        _ = try core.replay(
          after: state.position, limit: catchUpChunk, through: head, into: [target], targetTxn: txn,
          logTxn: txn)
        folded = true
      }
    }
    return folded
  }
}

/// When the writer polls for its next job before it sleeps (``EventLog/Configuration/writerSpin``):
/// for up to `window` nanoseconds, on a machine with more than one processor (with one, the job's
/// maker cannot run while the writer polls), and only while one caller is writing alone, in small
/// steps and without pause — the last ``singlesNeeded`` commits each served one request of at most
/// two events (an add; a runner's finish of one task and claim of the next), and the last wait
/// ended within four windows. With more to gather — several callers, or a runner whose lanes share
/// each command — the writer sleeps instead, so that the work gathers into one commit while it
/// does (polling would commit the first piece alone, and take a processor from the callers).
struct SpinPolicy {
  /// Nanoseconds to poll; 0 never.
  let window: UInt64
  /// The last wait for a job, from an empty queue to a job, in nanoseconds (polling included).
  private(set) var lastWait: UInt64 = .max
  /// Commits in a row, up to the last, that served one request of at most two events.
  private(set) var singles = 0
  /// How many such commits in a row make a caller "alone".
  static let singlesNeeded = 8

  init(window: Duration, processors: Int) {
    // At most 10 ms; a negative window is none (`nanoseconds` saturates, never traps).
    let nanoseconds = min(max(window.nanoseconds, 0), 10_000_000)
    self.window = processors > 1 ? UInt64(nanoseconds) : 0
  }

  /// Whether to poll before this wait.
  var shouldSpin: Bool { window > 0 && singles >= Self.singlesNeeded && lastWait <= window &* 4 }

  /// Records how long the last wait took.
  mutating func waited(_ nanoseconds: UInt64) { lastWait = nanoseconds }

  /// Records a commit of `requests` requests that appended `events` events.
  mutating func committed(requests: Int, events: Int) {
    singles = requests == 1 && events <= 2 ? min(singles + 1, Self.singlesNeeded) : 0
  }

  /// The processors this process may run on: Foundation's count (online processors, and on Linux
  /// a cgroup's CPU quota), and no more than the affinity mask allows — on Linux Foundation's count
  /// ignores the mask, and a process confined to one processor (`taskset -c 0`, a container's
  /// cpuset) polled there, where the job's maker cannot run while the writer polls.
  static func usableProcessors() -> Int {
    let online = ProcessInfo.processInfo.activeProcessorCount
    let affinity = Int(ferry_affinity_processors())
    return affinity > 0 ? min(online, affinity) : online
  }

  /// Monotonic nanoseconds.
  static func now() -> UInt64 { DispatchTime.now().uptimeNanoseconds }
}
