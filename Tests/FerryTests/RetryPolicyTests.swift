import Foundation
import PropertyBased
import Testing

@testable import Ferry

/// `RetryPolicy.maxDelay` is a cap the delay never exceeds: jitter is applied first, the cap last
/// (`Specs/task-events.md` §4.4).
@Suite struct RetryPolicyTests {
  @Test func jitterNeverTakesADelayPastItsCap() {
    // 3 s × 1.2 was 3.6 s with a 3 s cap: the cap was applied before the jitter.
    let policy = RetryPolicy(
      maxAttempts: 10, initialDelay: .seconds(1), multiplier: 2, maxDelay: .seconds(3), jitter: 0.2)
    #expect(policy.delay(afterAttempt: 3, random: 0.999) == .seconds(3))
    #expect(policy.delay(afterAttempt: 2, random: 0.999) <= .seconds(3))
    #expect(policy.delay(afterAttempt: 2, random: 0) == .milliseconds(1600))
    // At the cap the jitter still spreads retries out, below it.
    #expect(policy.delay(afterAttempt: 9, random: 0) == .milliseconds(2400))
  }

  @Test func everyDelayIsBetweenZeroAndTheCap() async {
    await propertyCheck(
      count: 500,
      input: Gen.int64(in: -10_000...10_000_000), Gen.int64(in: -10_000...10_000_000),
      Gen.double(in: 0.5...1000), Gen.double(in: -0.5...1.5), Gen.uint32(in: 0...2000), Gen.double(in: 0...1)
    ) { initialMs, maxMs, multiplier, jitter, attempt, random in
      let policy = RetryPolicy(
        maxAttempts: 3, initialDelay: .milliseconds(initialMs), multiplier: multiplier,
        maxDelay: .milliseconds(maxMs), jitter: jitter)
      let delay = policy.delay(afterAttempt: attempt, random: random)
      #expect(delay >= .zero)
      #expect(delay <= policy.maxDelay, "\(policy) after attempt \(attempt), random \(random)")
    }
  }
}
