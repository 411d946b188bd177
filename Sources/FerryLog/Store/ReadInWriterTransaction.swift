import Foundation
import LMDB
import Synchronization

extension EventLog {
  /// The last resort of ``read(_:)`` when its projection stays behind the log: `body` runs on the
  /// writer thread inside a write transaction that has first folded what is behind, where the
  /// projections are at the head whatever another process does (it cannot write meanwhile: the
  /// transaction holds LMDB's write lock). Waits for the writer until `deadline`; when the writer
  /// has not begun by then (another process holds LMDB's write lock, or this writer is on a long
  /// job), throws `notCurrent` — its reason saying so — and `body` is never run.
  func readInWriterTransaction<R>(
    _ body: (LogView) throws -> R, writer: GroupCommitWriter, until deadline: DispatchTime,
    notCurrent: FerryLogError
  ) throws -> R {
    // `body` is not escaping, and not Sendable: it is lent to the writer thread only while this
    // thread waits for it (see LentRead). The job holds `lent`, never `body` itself: the writer
    // may keep the job queued long after this read gave up (until another process releases
    // LMDB's write lock), and withoutActuallyEscaping traps if `body` outlives this closure.
    // `lent.end()` takes `body` back before the closure returns, whatever happened; a job that
    // comes later finds nothing to run.
    try withoutActuallyEscaping(body) { body in
      let lent = LentRead(body)
      defer { lent.end() }
      let core = self.core
      let environment = self.environment
      let chunk = configuration.rebuildChunkSize
      let stale = staleProjections
      let segment = self.segment
      let instruments = self.instruments
      let accepted = writer.submit(
        .exclusive {
          Self.readLent(
            lent, core: core, environment: environment, chunk: chunk, stale: stale, segment: segment,
            instruments: instruments)
        })
      guard accepted else { throw unavailable }
      guard lent.wait(until: deadline) else { throw Self.heldUp(notCurrent) }
      readsInWriter.add(1, ordering: .relaxed)
      return try lent.result(or: notCurrent)
    }
  }

  /// `notCurrent` (a `projectionNotCurrent`) with its reason saying that the writer could not take
  /// the read in time: what an operator needs to tell a store whose writer is held up (another
  /// process holding LMDB's write lock) from one whose projection is at another version.
  static func heldUp(_ notCurrent: FerryLogError) -> FerryLogError {
    guard case .projectionNotCurrent(let projection, let reason) = notCurrent else { return notCurrent }
    let late = ", and this process's writer did not get to the read within \(readWriterWaitSeconds) s"
    return .projectionNotCurrent(projection: projection, reason: reason + late)
  }

  /// The writer's side of ``readInWriterTransaction(_:writer:until:notCurrent:)``, on its thread:
  /// folds what is behind in chunked transactions as a catch-up does, then, in one more transaction, folds
  /// what other processes did since (another process's rebuild may have reset a projection in
  /// between; in chunks, as a compaction does) and runs the lent body on it. That transaction
  /// commits what it folded unless the body throws. With a write-ahead segment a checkpoint
  /// follows anything folded — after the reader has its result: the checkpoint waits for LMDB's
  /// write lock, which another process may hold for long, and a failed one loses nothing (folds
  /// are derived rows; `Specs/one-sync-commit.md` §7).
  static func readLent<R>(
    _ lent: LentRead<R>, core: StoreCore, environment: Environment, chunk: Int, stale: [String: String],
    segment: SegmentSession?, instruments: LogInstruments
  ) {
    // The reader gave up while this job waited behind others: nothing is run, nothing is needed.
    guard !lent.isAbandoned else { return }
    var folded = 0
    do {
      folded = try foldBehind(core, environment: environment, chunk: chunk)
      // The transaction runs again from the start when the map grows: its count is its last run's.
      var foldedHere = 0
      try environment.write { txn in
        foldedHere = 0
        while true {
          let progressed = try core.foldFurthestBehind(limit: chunk, txn)
          if progressed == 0 { break }
          foldedHere += progressed
        }
        try lent.run(LogView(core: core, transaction: txn, stale: stale))
      }
      folded += foldedHere
      lent.finish(nil)
    } catch {
      lent.finish(FerryLogError.wrap(error, path: environment.path))
    }
    guard folded > 0, let segment else { return }
    do {
      try segment.checkpointNow(environment: environment, core: core)
    } catch {
      let failure = FerryLogError.wrap(error, path: environment.path)
      instruments.logger?.warning("checkpoint after a read's fold failed (a later one covers it): \(failure)")
    }
  }
}

/// A read's `body`, lent to the writer thread by
/// ``EventLog/readInWriterTransaction(_:writer:until:notCurrent:)``, and what became of it.
///
/// The reader waits (``wait(until:)``) until the writer has run `body`, or until its deadline:
/// then, if the writer has not begun `body`, the read is abandoned — `run` will not call it — and
/// otherwise the reader waits for it to end. Either way the reader takes `body` back (``end()``)
/// before it returns.
final class LentRead<R>: @unchecked Sendable {
  // Why @unchecked: `body` is a non-escaping, non-Sendable closure (made escapable by
  // withoutActuallyEscaping) and `outcome` holds an R that need not be Sendable. Calling `body` on
  // the writer thread is safe because the thread that lent it is blocked in `wait(until:)` for as
  // long as the writer may call it — from before the job is queued until `run` has returned, or
  // until `wait(until:)`, giving up, made sure that `run` never calls it — so `body` and whatever
  // it captures are used by one thread at a time, and outlive every call. `body`, `state` and
  // `outcome` are read and written only with `lock` held; `outcome` passes from the writer to the
  // reader once, and the writer keeps no reference to it (nor to `body`) after `run` returns.
  private enum State {
    /// Not begun: the reader may still abandon it.
    case queued
    /// The writer has begun `body` (or runs it again, its transaction re-run after the map grew).
    case running
    /// The writer is done with it; `outcome` is final.
    case finished
    /// The reader gave up before the writer began: `body` is never run.
    case abandoned
  }

  private let lock = Condition()
  private let done = DispatchSemaphore(value: 0)
  private var body: ((LogView) throws -> R)?
  private var state = State.queued
  private var outcome: Result<R, any Error>?

  init(_ body: @escaping (LogView) throws -> R) {
    self.body = body
  }

  /// Whether the reader gave up before the writer began.
  var isAbandoned: Bool { lock.withLock { state == .abandoned } }

  /// The writer, inside its transaction: runs `body` on `view` unless the reader gave up, and
  /// rethrows its error (so that the transaction is aborted).
  func run(_ view: LogView) throws {
    let lent: ((LogView) throws -> R)? = lock.withLock {
      switch state {
      case .queued, .running:
        state = .running
        return body
      case .finished, .abandoned:
        return nil
      }
    }
    guard let lent else { return }
    let result = Result { try lent(view) }
    lock.withLock { outcome = result }
    _ = try result.get()
  }

  /// The writer, once its job is over: `error` when it failed — the body's error, or the store's.
  func finish(_ error: (any Error)?) {
    lock.withLock {
      guard state != .abandoned else { return }
      if let error { outcome = .failure(error) }
      state = .finished
    }
    done.signal()
  }

  /// The reader: waits for the writer until `deadline`. False when the writer had not begun
  /// `body` by then: the read is abandoned, and `body` never runs. When the writer has begun it,
  /// waits for it to end, however long — that is the body's own work and this process's commit,
  /// not another process's lock.
  func wait(until deadline: DispatchTime) -> Bool {
    if done.wait(timeout: deadline) == .success { return true }
    let begun = lock.withLock { () -> Bool in
      guard state == .queued else { return true }
      state = .abandoned
      return false
    }
    guard begun else { return false }
    done.wait()
    return true
  }

  /// The reader, after ``wait(until:)`` returned true: what `body` returned or threw (or the
  /// store's error); `notCurrent` if the job ended without running it, which it does not.
  func result(or notCurrent: FerryLogError) throws -> R {
    let outcome = lock.withLock { self.outcome }
    guard let outcome else { throw notCurrent }
    return try outcome.get()
  }

  /// The reader, before it returns: takes `body` back, so that nothing holds it any longer; a
  /// job not yet begun never runs it.
  func end() {
    lock.withLock {
      body = nil
      if state == .queued { state = .abandoned }
    }
  }
}
