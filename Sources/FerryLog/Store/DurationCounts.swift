/// Durations as whole units for the log's integer times, never trapping: a `Duration` may hold
/// more than `Int64.max` seconds (`.seconds(1e19)`), where reading its `components` traps.
extension Duration {
  /// Whole milliseconds, rounded toward zero, saturating at the limits of `Int64`.
  package var milliseconds: Int64 { wholeUnits(of: .milliseconds(1), perSecond: 1_000) }

  /// Whole nanoseconds, rounded toward zero, saturating at the limits of `Int64`.
  package var nanoseconds: Int64 { wholeUnits(of: .nanoseconds(1), perSecond: 1_000_000_000) }

  /// Whole `unit`s (`perSecond` of them in a second), toward zero, saturating: compared with
  /// `Int64`'s range of units before `components` is read.
  private func wholeUnits(of unit: Duration, perSecond: Int64) -> Int64 {
    if self >= unit * Int64.max { return .max }
    if self <= unit * Int64.min { return .min }
    let (seconds, attoseconds) = components
    let (scaled, overflow) = seconds.multipliedReportingOverflow(by: perSecond)
    if overflow { return seconds < 0 ? .min : .max }
    let (total, sumOverflow) = scaled.addingReportingOverflow(
      attoseconds / (1_000_000_000_000_000_000 / perSecond))
    if sumOverflow { return seconds < 0 ? .min : .max }
    return total
  }
}
