import Foundation
import TestSupport
import Testing

@_spi(Engine) @_spi(Experimental) @testable import Ferry

/// A file-level copy of a store taken while an app adds to it (`cp -R`, as a device backup of the
/// app's container does) is never a silent loss (the DocC article "Backing up a store"): `ferry
/// recover` opens it whole — every add acknowledged before the copy began is there — or refuses
/// it by name (status 6: lost commits, damage) and `ferry salvage` then builds a store that holds
/// them all, or names what it could not recover. With the segment most such copies are refused:
/// the copy takes `ferry-head` after `ferry-segment`, so the mark is ahead of the segment's chain.
@Suite(.timeLimit(.minutes(20))) struct BackupCopyTests {
  @Test(arguments: [true, false]) func aCopyTakenWhileAWriterAddsHoldsEveryAcknowledgedAddOrIsRefusedByName(
    segment: Bool
  ) async throws {
    let base = FileManager.default.temporaryDirectory.path + "/ferry-backup-\(UUID().uuidString.prefix(8))"
    try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: base) }
    let path = base + "/store"
    let mode = segment ? "store-segment-add" : "add-tasks"
    let child = try Child("ferry-test-worker", [mode, path, "1000000"])
    defer { if child.process.isRunning { child.kill() } }
    var copies: [(path: String, acknowledged: Int)] = []
    for k in 1...4 {
      try await pollUntil { child.acknowledgedIds.count >= 40 * k }
      let acknowledged = child.acknowledgedIds.count
      let copy = base + "/copy\(k)"
      let cp = Process()
      cp.executableURL = URL(fileURLWithPath: "/bin/cp")
      cp.arguments = ["-R", path, copy]
      try cp.run()
      cp.waitUntilExit()
      #expect(cp.terminationStatus == 0)
      copies.append((copy, acknowledged))
    }
    child.kill()
    _ = try await child.wait()
    for (copy, acknowledged) in copies {
      var store = copy
      let recover = try OperatorCompanyTests.ferry(["recover", copy])
      if recover.status != 0 {
        #expect(recover.status == 6, "\(recover.stderr)")
        #expect(recover.stderr.contains("ferry salvage"), "\(recover.stderr)")
        store = copy + "-salvaged"
        let salvage = try OperatorCompanyTests.ferry(["salvage", copy, store])
        // Status 1 names sequences it could not recover: not silent, but not whole either.
        #expect(salvage.status == 0, "\(salvage.stdout) \(salvage.stderr)")
      }
      let verify = try OperatorCompanyTests.ferry(["verify", store])
      #expect(verify.status == 0, "\(verify.stdout) \(verify.stderr)")
      var configuration = FerryStore.Configuration()
      configuration.createIfMissing = false
      configuration.writeAheadSegment = segment
      let opened = try await FerryStore.open(at: store, configuration: configuration)
      defer { opened.close() }
      let present = Set(try opened.queue.pendingTasks().compactMap(\.dataId))
      let missing = (0..<acknowledged).filter { !present.contains("app-\($0)") }
      #expect(missing.isEmpty, "\(copy): acknowledged before the copy but missing: \(missing.prefix(10))")
    }
  }
}
