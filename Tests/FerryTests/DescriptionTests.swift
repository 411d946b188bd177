import Ferry
import FerryLog
import Foundation
import Testing

/// What apps print and show reads as a phrase, and errors carry their message as
/// `localizedDescription` (issue 14).
@Suite struct DescriptionTests {
  @Test func statusesUpdatesAndOutcomesReadAsPhrases() {
    #expect("\(TaskUpdate.current(1, .ready))" == "task 1: ready")
    #expect("\(TaskUpdate.current(2, nil))" == "task 2: not queued")
    #expect("\(TaskStatus.waitingForGroup(behind: 3))" == "waiting for its group (behind task 3)")
    #expect(
      "\(TaskStatus.waiting(until: Date(timeIntervalSince1970: 0)))"
        == "waiting until 1970-01-01T00:00:00.000Z")
    // The millisecond the log keeps, not one less (a date is a binary fraction of a second).
    #expect("\(TaskStatus.waiting(until: at(1_700_000_000_001)))" == "waiting until 2023-11-14T22:13:20.001Z")
    #expect(
      "\(SkipReason.waitingForRetry(until: at(-1)))" == "waiting for its retry at 1969-12-31T23:59:59.999Z")
    #expect("\(TaskUpdate.failed(4, message: "offline", retryAt: nil))" == "task 4 failed: offline, dead")
    #expect("\(RunOutcome.skipped(.noHandler))" == "skipped: no handler for its tag")
    #expect("\(RefreshOutcome.skipped(.notTooOld))" == "skipped: the cache is not too old")
    #expect("\(CacheAge.noCache)" == "no cache")
    let age =
      "\(CacheAge.cache(lastFetched: Date(timeIntervalSince1970: 0), age: .seconds(3_725), isTooOld: true))"
    #expect(age.hasPrefix("fetched 1970-01-01T00:00:00.000Z, 1h 2m 5s old"), "\(age)")
    #expect(age.hasSuffix(", too old"))
    for text in [
      "\(TaskUpdate.running(5, attempt: 2))", "\(TaskStatus.blockedByError)", "\(TaskUpdate.cleared)",
    ] {
      #expect(!text.contains("Optional(") && !text.contains("Ferry."), "\(text)")
    }
  }

  @Test func errorsCarryTheirMessageAsLocalizedDescription() {
    let ferry: any Error = FerryError.invalidArgument("the tag must not be empty")
    #expect(ferry.localizedDescription.contains("the tag must not be empty"))
    let log: any Error = FerryLogError.diskFull(path: "/store")
    #expect(log.localizedDescription.contains("the disk holding /store is full"))
    let damaged: any Error = FerryLogError.lostCommits(path: "/store", acknowledged: 9, found: 7)
    #expect(damaged.localizedDescription.contains("up to sequence 9"))
  }
}
