import FerryLog
import Foundation

// Tags as the app's own type: an enum of the app's kinds of work instead of string literals
// scattered over the code. The log stores the raw value, so a typed tag and its string are the
// same tag — a store written with strings reads the same with an enum, and `ferry` shows the raw
// value.
//
// ```swift
// enum Work: String { case saveNote = "save-note", deleteNote = "delete-note" }
//
// runner.register(tag: Work.saveNote) { task in ... }
// try await store.queue.add(tag: Work.saveNote, payload: note, groupId: note.id)
// try await store.queue.cancel(tag: Work.deleteNote)
// ```

extension TaskQueue {
  /// Adds a task whose tag is `tag.rawValue` (see
  /// ``add(tag:payload:dataId:groupId:options:)-(String,_,_,_,_)``).
  @discardableResult
  public func add<Tag: RawRepresentable, Payload: Encodable & Sendable>(
    tag: Tag, payload: Payload, dataId: String? = nil, groupId: String? = nil, options: TaskOptions = []
  ) async throws(FerryError) -> TaskID where Tag.RawValue == String {
    try await engine {
      try await add(tag: tag.rawValue, payload: payload, dataId: dataId, groupId: groupId, options: options)
    }
  }

  /// Cancels the queued tasks of `tag.rawValue` (see ``cancel(tag:)-(String)``).
  ///
  /// - Parameter tag: The tag, as the app's tag type.
  /// - Returns: What was cancelled, and the tasks left to their runs (``CancelReport``).
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  @discardableResult
  public func cancel<Tag: RawRepresentable>(tag: Tag) async throws(FerryError) -> CancelReport
  where Tag.RawValue == String {
    try await engine {
      try await cancel(tag: tag.rawValue)
    }
  }

  /// The queued tasks of `tag.rawValue`, optionally only those of a group and data id.
  ///
  /// - Parameters:
  ///   - tag: The tag, as the app's tag type.
  ///   - groupId: Only tasks of this group; nil for any.
  ///   - dataId: Only tasks with this data id; nil for any.
  /// - Returns: The queued tasks that match, in id order.
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public func pendingTasks<Tag: RawRepresentable>(
    tag: Tag, groupId: String? = nil, dataId: String? = nil
  ) throws(FerryError) -> [PendingTask] where Tag.RawValue == String {
    try engine {
      try pendingTasks(tag: tag.rawValue, groupId: groupId, dataId: dataId)
    }
  }
}

extension TaskRunner {
  /// Registers the handler of `tag.rawValue` (see
  /// ``register(tag:retry:timeLimit:isReadyToRun:handler:)``).
  ///
  /// - Parameters:
  ///   - tag: The tag, as the app's tag type.
  ///   - retry: The retry policy of its failures; ``Configuration/defaultRetry`` when nil.
  ///   - timeLimit: The most a run may take; ``Configuration/defaultTimeLimit`` when nil.
  ///   - isReadyToRun: Asked before each run: `false` skips the task (``SkipReason/notReady``).
  ///   - handler: Runs one task and returns its outcome.
  public func register<Tag: RawRepresentable>(
    tag: Tag, retry: RetryPolicy? = nil, timeLimit: Duration? = nil,
    isReadyToRun: (@Sendable (PendingTask) async -> Bool)? = nil,
    handler: @escaping @Sendable (RunningTask) async throws -> TaskResult
  ) where Tag.RawValue == String {
    register(
      tag: tag.rawValue, retry: retry, timeLimit: timeLimit, isReadyToRun: isReadyToRun, handler: handler)
  }
}

extension PendingTask {
  /// The task's tag as the app's tag type, or nil when its raw value is not one of the type's
  /// values (a tag written by another version of the app).
  public func tag<Tag: RawRepresentable>(as type: Tag.Type) -> Tag? where Tag.RawValue == String {
    Tag(rawValue: tag)
  }
}

extension RunningTask {
  /// The task's tag as the app's tag type, or nil when its raw value is not one of the type's values.
  public func tag<Tag: RawRepresentable>(as type: Tag.Type) -> Tag? where Tag.RawValue == String {
    Tag(rawValue: tag)
  }
}
