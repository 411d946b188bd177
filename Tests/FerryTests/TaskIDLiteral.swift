import FerryLog

@_spi(Engine) @testable import Ferry

// Tests name ids by number (`#expect(id == 3)`). Only in test targets, never in Ferry: an app's literal id
// would compile anywhere an id goes and name whatever task the log gave that number.
extension TaskID: ExpressibleByIntegerLiteral {
  /// The id whose add event has sequence number `value`.
  public init(integerLiteral value: UInt64) { self.init(rawValue: value) }
}

extension EventLog {
  /// The event that added task `id` (its id is that event's sequence).
  func event(at id: TaskID) throws -> LoggedEvent? { try event(at: id.rawValue) }
}

extension TaskID {
  /// An id read from a child process's output line.
  init?(_ text: Substring) { self.init(String(text)) }
}
