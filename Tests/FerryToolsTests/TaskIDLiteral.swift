import Ferry

// Tests name ids by number (`report.outcome(of: 1)`). Only in test targets, never in Ferry: an
// app's literal id would compile anywhere an id goes and name whatever task had that number.
extension TaskID: ExpressibleByIntegerLiteral {
  /// The id whose add event has sequence number `value`.
  public init(integerLiteral value: UInt64) { self.init(rawValue: value) }
}
