@_spi(Engine) @testable import Ferry
import FerryLog

// Tests name ids by number (`#expect(id == 3)`). Only here, never in Ferry: an app's literal id
// would compile anywhere an id goes and name whatever task the log gave that number.
extension TaskID: ExpressibleByIntegerLiteral {
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
