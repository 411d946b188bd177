import FerryLog

extension FerryError {
  /// The app-facing error for a failure of the storage engine, keeping the engine's message: an
  /// app catches every failure with `import Ferry` alone and never sees `FerryLogError`.
  package init(engine error: FerryLogError) {
    switch error {
    case .closed: self = .closed
    case .suspended: self = .suspended
    case .noSuchStore(let path): self = .noSuchStore(path: path)
    case .notAStore(let path, let reason): self = .notAStore(path: path, reason: reason)
    case .alreadyOpen(let path): self = .alreadyOpen(path: path)
    case .permissionDenied(let path, let detail): self = .permissionDenied(path: path, detail: detail)
    case .newerFormat(let path, _, _): self = .newerFormat(path: path, message: error.description)
    case .unsupportedRecordFormat:
      self = .newerFormat(path: nil, message: error.description)
    case .unknownEventType(_, let sequence), .unsupportedSchemaVersion(_, _, _, let sequence):
      // A stored event of a type or schema this code does not know was written by newer
      // software; one being appended is the caller's mistake.
      self =
        sequence == nil
        ? .invalidArgument(error.description) : .newerFormat(path: nil, message: error.description)
    case .unsupportedLMDB(let found, let supported):
      self = .unsupportedLMDB(found: found, supported: supported)
    case .needsRecovery(let path): self = .needsRecovery(path: path)
    case .recoveredCopyFailed(let path, let reason): self = .recoveredCopyFailed(path: path, reason: reason)
    case .damagedStore(let path, _), .lostCommits(let path, _, _):
      self = .damaged(path: path, message: error.description)
    case .corruptRecord, .sequenceGap, .snapshotUnusable:
      self = .damaged(path: nil, message: error.description)
    case .diskFull(let path): self = .diskFull(path: path)
    case .quotaExceeded(let path): self = .quotaExceeded(path: path)
    case .ioError(let path, let detail): self = .ioError(path: path, detail: detail)
    case .invalidEvent, .invalidConfiguration: self = .invalidArgument(error.description)
    case .projectionNotCurrent: self = .notCurrent(error.description)
    case .projectionFailed(_, _, let underlying as FerryError):
      // The queue's own projection refused an event: its error says why.
      self = underlying
    case .projectionFailed(_, _, let underlying as PayloadError):
      // A stored event that no longer decodes while folded: the same damage as read directly.
      self.init(underlying)
    case .storage(let failure) where failure.isDamage:
      self = .damaged(
        path: nil,
        message: "the store is damaged: LMDB found a damaged page or gave up after one (\(failure.message)); "
          + "nothing was changed — `ferry salvage` recovers what is left into a new store")
    case .projectionFailed, .unknownTable, .historyCompacted, .storage:
      self = .storage(error.description)
    }
  }

  /// Any error that reached the API's edge: Ferry's own pass through, the engine's are mapped.
  package init(_ error: any Error) {
    switch error {
    case let error as FerryError: self = error
    case let error as FerryLogError: self.init(engine: error)
    case is CancellationError: self = .cancelled
    case let error as PayloadError:
      self = .damaged(
        path: nil, message: "the store is damaged: stored bytes do not decode (\(error.reason))")
    case let error as StorageFailure: self.init(engine: .storage(error))
    default: self = .storage("\(error)")
    }
  }
}

/// Runs `body`, throwing only ``FerryError``: the edge of the public API, where the engine's
/// errors become the app's.
package func engine<T>(_ body: () throws -> T) throws(FerryError) -> T {
  do { return try body() } catch { throw FerryError(error) }
}

/// Runs `body`, throwing only ``FerryError`` (the async edge).
package func engine<T>(_ body: () async throws -> T) async throws(FerryError) -> T {
  do { return try await body() } catch { throw FerryError(error) }
}
