import FerryLog
import Foundation

/// The task a handler is running.
public struct RunningTask: Sendable {
  /// The task's id.
  public let id: TaskID
  /// Its tag.
  public let tag: String
  /// Its data id.
  public let dataId: String?
  /// Its group.
  public let groupId: String?
  /// This run's attempt number (1 for the first run).
  public let attempt: UInt32
  /// The payload's JSON bytes as they were added, or as the latest
  /// ``TaskQueue/updatePayload(_:to:)`` before this run's claim left them.
  public let payloadBytes: [UInt8]
  /// The key a server deduplicates this change on (send it as an `Idempotency-Key` header): the
  /// same on every attempt, in every process and after every crash, for as long as the payload
  /// stays; never used by another task or store. It is the id of the event that holds the payload
  /// — the task's add, or its latest ``TaskQueue/updatePayload(_:to:)``: a new payload is a new
  /// change, with a key of its own (a server that saw the old one must not drop the new one).
  /// Kept by compaction, `ferry compact --copy`, `ferry salvage` and `ferry export`/`import`.
  public var idempotencyKey: String { payloadEventId.description }
  /// The id of the event that holds the payload (made into text only when a handler asks).
  let payloadEventId: EventID

  /// Decodes the payload; ``FerryError/payload(taskId:reason:)`` when it no longer decodes as `type`
  /// (a handler that lets this error out fails the task for good: retrying cannot help).
  public func payload<Payload: Decodable>(as type: Payload.Type) throws(FerryError) -> Payload {
    do {
      return try JSONDecoder().decode(type, from: Data(payloadBytes))
    } catch {
      throw FerryError.payload(taskId: id, reason: "it does not decode as \(type): \(error)")
    }
  }
}
