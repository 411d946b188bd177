import LMDB
import Synchronization

extension EventLog {
  /// Waits for queued appends to finish, then closes the store. Later calls throw ``FerryLogError/closed``.
  /// Close a log before opening its directory again in the same process.
  public func close() {
    transitions.withLock { _ in
      let (wasOpen, wasSuspended, session) = life.withLock { life in
        defer { life.isClosed = true }
        return (!life.isClosed, life.isSuspended, life.session)
      }
      guard wasOpen else { return }
      notifier.close()
      // A suspension ended the session already (its open lock's descriptor is closed).
      if !wasSuspended { Self.end(session) }
    }
  }

  /// Stops the session's writer once every write handed to it is committed, and lets go of the
  /// store: checkpoint, environment, open lock. Ending a session twice is harmless.
  private static func end(_ session: Session) {
    session.writer?.stop()
    if let segment = session.segment, !session.environment.isClosed {
      // Everything written becomes the checkpoint (the next open then has nothing to replay);
      // a failure here loses nothing: the frames are still there for the next open. A process
      // that shared the store and never wrote holds no pin and has nothing of its own to flush.
      if segment.holdsPin {
        try? segment.checkpointNow(environment: session.environment, core: session.core)
      }
      segment.releasePin(session.environment)
    }
    session.segment?.closeFile()
    session.headMark?.closeFile()
    session.environment.close()
    session.openLock?.release()
    session.recoveredCopy?.remove()
  }

  /// Lets go of the store without closing the log: waits until every write already handed to the
  /// writer is committed (blocking the calling thread meanwhile), stops the writer, closes the
  /// LMDB environment and gives up every file lock this log holds (LMDB's on `lock.mdb` and
  /// Ferry's on `ferry-open.lock`), so that a process holding it may be suspended — iOS ends a
  /// suspended app that holds a lock in a shared container — and another process may open the
  /// store meanwhile, alone.
  ///
  /// Until ``resume()`` every call that reads or writes throws ``FerryLogError/suspended`` at
  /// once, and so does a call the suspension overtook (its write was not handed to the writer
  /// before the suspension, or its read had not begun); tails (``tail(after:pollInterval:chunkSize:)``)
  /// wait. Suspending a suspended or closed log does nothing.
  public func suspend() {
    transitions.withLock { _ in
      let session = life.withLock { life -> Session? in
        guard !life.isClosed, !life.isSuspended else { return nil }
        life.isSuspended = true
        return life.session
      }
      guard let session else { return }
      Self.end(session)
      instruments.suspended(path: path)
    }
  }

  /// Opens the store again after ``suspend()``, as ``open(at:configuration:)`` would — the same
  /// checks, recovery of the write-ahead segment, and projections caught up with whatever other
  /// processes appended meanwhile — and takes its locks again. Does nothing unless suspended.
  /// When the open fails (the store was damaged or removed meanwhile) the log stays suspended and
  /// the open's error is thrown; resume may be tried again.
  public func resume() throws {
    try transitions.withLock { _ in
      guard life.withLock({ !$0.isClosed && $0.isSuspended }) else { return }
      var again = configuration
      again.storeIdAtCreation = nil
      // The store exists: a resume never creates one where it went missing.
      again.createIfMissing = false
      let opened = try Self.openParts(at: path, configuration: again)
      let session = Self.startSession(
        opened, configuration: configuration, notifier: notifier, ownRanges: ownRanges,
        instruments: instruments)
      life.withLock { life in
        life.session = session
        life.isSuspended = false
      }
      instruments.resumed(path: path, replayed: opened.replayed)
      // Other processes' appends made while suspended: waiting tails read them.
      notifier.publish(opened.head)
    }
  }

  /// Whether the log is suspended (``suspend()``) now.
  public var isSuspended: Bool { life.withLock { $0.isSuspended } }

  /// The error for a call the log cannot serve now: ``FerryLogError/closed`` once closed,
  /// ``FerryLogError/suspended`` otherwise (the writer or environment it used belongs to a
  /// session that a suspension ended).
  var unavailable: FerryLogError {
    life.withLock { $0.isClosed } ? .closed : .suspended
  }

  /// Whether the log was closed or suspended: a call must not begin.
  var isUnavailable: Bool { life.withLock { $0.isClosed || $0.isSuspended } }

  /// Whether ``close()`` was called.
  public var isClosed: Bool { life.withLock { $0.isClosed } }

  /// Runs `body`, turning storage errors into ``FerryLogError`` and refusing work after close.
  func guarded<R>(_ body: () throws -> R) throws -> R {
    let began = life.withLock { life -> Session? in life.isClosed || life.isSuspended ? nil : life.session }
    guard let began else { throw unavailable }
    do {
      return try body()
    } catch let error as LMDBError {
      // A suspension (or close) ended the session under the call: its environment is closed.
      if isUnavailable || began !== session { throw unavailable }
      throw FerryLogError(error, path: path)
    }
  }
}
