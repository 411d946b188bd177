import Synchronization

extension EventLog {
  /// Appends events as one atomic unit and returns their sequence numbers once they are durable.
  ///
  /// An event whose id is already in the log (with idempotent appends on) is not stored again;
  /// its existing sequence number is returned. Throws ``FerryLogError/invalidEvent(reason:)`` for
  /// a bad type or an oversized payload, ``FerryLogError/unknownEventType(type:sequence:)`` for a
  /// type outside the catalog, ``FerryLogError/projectionFailed(projection:sequence:underlying:)``
  /// when a projection rejects an event (nothing of this call is written), ``FerryLogError/closed``.
  ///
  /// Cancelling the calling task does not withdraw events already handed to the writer.
  public func append(_ events: [NewEvent]) async throws -> [UInt64] {
    guard let writer else {
      throw FerryLogError.permissionDenied(path: path, detail: "the store is open read-only")
    }
    if events.isEmpty { return [] }
    if isUnavailable { throw unavailable }
    let prepared = try Self.prepare(events, configuration: configuration)
    let outcome = try await withUnsafeThrowingContinuation {
      (continuation: UnsafeContinuation<GroupCommitWriter.AppendOutcome, any Error>) in
      let request = GroupCommitWriter.AppendRequest(work: .events(prepared), continuation: continuation)
      if !writer.submit(.append(request)) {
        continuation.resume(throwing: unavailable)
      }
    }
    return outcome.sequences
  }

  /// Appends one event and returns its sequence number once it is durable.
  public func append(_ event: NewEvent) async throws -> UInt64 {
    let sequences = try await append([event])
    guard let sequence = sequences.first else {
      throw FerryLogError.invalidEvent(reason: "the writer returned no sequence")
    }
    return sequence
  }

  static func prepare(_ events: [NewEvent], configuration: Configuration) throws -> [PreparedEvent] {
    let now = configuration.clock()
    return try events.map { event in
      guard EventRecord.isValidType(event.type) else {
        throw FerryLogError.invalidEvent(
          reason:
            "event type '\(event.type)' must be 1 to \(EventRecord.maxTypeLength) characters from A-Z a-z 0-9 . _ : -"
        )
      }
      guard event.payload.count <= configuration.maxPayloadSize else {
        throw FerryLogError.invalidEvent(
          reason:
            "payload of \(event.payload.count) bytes exceeds the maximum of \(configuration.maxPayloadSize)")
      }
      guard event.schemaVersion >= 1 else {
        throw FerryLogError.invalidEvent(reason: "schema versions start at 1")
      }
      let catalogType = try configuration.catalog?.validatedType(of: event)
      let timestamp = event.timestamp ?? now
      let id = event.id ?? EventID.make(milliseconds: timestamp)
      let record = try EventRecord.encodeUnsealed(
        type: event.type, schemaVersion: event.schemaVersion, timestamp: timestamp, id: id,
        payload: event.payload, typeChecked: true)
      var current = (version: event.schemaVersion, payload: event.payload)
      // An event at its type's current version is its own upcast.
      if let catalog = configuration.catalog, let catalogType, event.schemaVersion != catalogType.version {
        let probe = LoggedEvent(
          sequence: 0, type: event.type, schemaVersion: event.schemaVersion, timestamp: timestamp, id: id,
          payload: event.payload)
        do {
          let upcast = try catalog.upcast(probe)
          current = (upcast.schemaVersion, upcast.payload)
        } catch {
          throw FerryLogError.invalidEvent(
            reason: "its payload cannot be upcast to the current schema: \(error)")
        }
      }
      return PreparedEvent(
        type: event.type, schemaVersion: event.schemaVersion, currentSchemaVersion: current.version,
        currentPayload: current.payload, timestamp: timestamp, id: id, payload: event.payload, record: record,
        // What the appender already decoded, when the projections see the payload it gave.
        decoded: current.version == event.schemaVersion ? event.decoded : nil)
    }
  }

  /// Whether this open of the log appended the event at `sequence` (as opposed to another process).
  public func appendedHere(_ sequence: UInt64) -> Bool {
    appendedHere(allOf: sequence...sequence)
  }

  /// Whether this open of the log appended every event in `range` (false when another process
  /// appended any of them, or this open no longer remembers).
  public func appendedHere(allOf range: ClosedRange<UInt64>) -> Bool {
    ownRanges.ranges.withLock { ranges in
      var low = 0
      var high = ranges.count
      while low < high {
        let middle = (low + high) / 2
        if ranges[middle].upperBound < range.lowerBound { low = middle + 1 } else { high = middle }
      }
      var next = range.lowerBound
      while low < ranges.count, ranges[low].lowerBound <= next {
        if ranges[low].upperBound >= range.upperBound { return true }
        next = ranges[low].upperBound + 1
        low += 1
      }
      return false
    }
  }
}

/// The sequence ranges one open of a log appended.
final class OwnRanges: Sendable {
  let ranges = Mutex<[ClosedRange<UInt64>]>([])
}
