@_spi(Engine) import Ferry
import FerryLog
import Foundation
import TestSupport
import Testing

/// A store whose writer was killed with write-ahead-segment frames outstanding, read without
/// writing: the read commands (and a library open that asks for it) read a recovered copy made in
/// the temporary directory, show every acknowledged event, and leave the store's files as they were.
@Suite(.timeLimit(.minutes(20))) struct RecoveredCopyViewTests {
  static let readCommands = ["inspect", "log", "verify", "export", "stats"]

  /// Every read command exits 0, says on stderr that it shows a recovered copy, shows the events
  /// the killed writer acknowledged, and the store's directory is byte-identical afterwards with
  /// no file added; the private copies are gone.
  @Test func readCommandsShowAKilledWritersFramesAndWriteNothing() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let acknowledged = try await killedSegmentAdder(fixture.path, adds: 200)
    try #require(acknowledged.count == 200)
    try await expectReadCommandsShow(acknowledged, in: fixture.path)
    // The store still needs its replay (the view changed nothing), and it has every event.
    try await expectEveryAcknowledgedTaskQueued(fixture, acknowledged, count: 200)
  }

  /// The same with the store on read-only media (a tmpfs remounted read-only), where
  /// `ferry recover` cannot help.
  @Test(
    .enabled(if: Self.mayMount, "mounting a tmpfs is not permitted here: the read-only media case is skipped")
  )
  func readCommandsShowAKilledWritersFramesOnReadOnlyMedia() async throws {
    let mount = try TemporaryMount()
    defer { mount.remove() }
    let store = mount.path + "/store"
    let acknowledged = try await killedSegmentAdder(store, adds: 200)
    try #require(acknowledged.count == 200)
    try #require(
      runQuietly(["mount", "-o", "remount,ro", mount.path]) == 0, "the tmpfs could not be remounted read-only"
    )
    try await expectReadCommandsShow(acknowledged, in: store)
    // The read-only store refuses the replay in place, as before.
    let recover = try Self.ferry(["recover", store])
    #expect(recover.status != 0, "ferry recover wrote to read-only media? \(recover.stdout)")
  }

  /// No room in the temporary directory for the copy: a status of its own (14), neither 7 nor
  /// 13, naming `ferry recover`; nothing written to the store, nothing left in the temporary directory.
  @Test(.enabled(if: Self.mayMount, "mounting a tmpfs is not permitted here"))
  func noRoomForTheCopyHasItsOwnStatus() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    _ = try await killedSegmentAdder(fixture.path, adds: 50)
    let tiny = try TemporaryMount(size: "64k")
    defer { tiny.remove() }
    let before = try Self.directoryContents(fixture.path)
    for command in Self.readCommands {
      let refused = try Self.ferry([command, fixture.path], temporaryDirectory: tiny.path)
      #expect(refused.status == 14, "\(command): \(refused.status) \(refused.stderr)")
      #expect(refused.stderr.contains("ferry recover \(fixture.path)"), "\(command): \(refused.stderr)")
      #expect(
        try FileManager.default.contentsOfDirectory(atPath: tiny.path).isEmpty, "\(command) left a copy")
    }
    #expect(try Self.directoryContents(fixture.path) == before, "a refused read wrote to the store")
  }

  /// The library: a read-only open still refuses with `needsRecovery` by default; asked for the
  /// recovered copy, it reads every acknowledged task (nothing appended beyond the replay: no
  /// `task.runInterrupted`), says it reads a copy, writes nothing to the store, and removes the
  /// copy at close.
  @Test func theLibraryReadsARecoveredCopyOnlyWhenAsked() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let acknowledged = try await killedSegmentAdder(fixture.path, adds: 120)
    let before = try Self.directoryContents(fixture.path)
    #expect(throws: FerryError.needsRecovery(path: fixture.path)) {
      try FerryStore.openReadOnly(at: fixture.path).close()
    }
    let temporary = Set(try FileManager.default.contentsOfDirectory(atPath: NSTemporaryDirectory()))
    let store = try FerryStore.openReadOnly(at: fixture.path, recoveredCopyIfNeeded: true)
    #expect(store.isRecoveredCopy)
    let pending = Set(try store.queue.pendingTasks().map(\.id))
    #expect(pending == acknowledged)
    let types = try store.log.events(after: 0, limit: 1_000).map(\.type)
    #expect(types.count == 120 && types.allSatisfy { $0 == "task.added" }, "\(Set(types))")
    await #expect(throws: FerryError.self) { try await store.queue.pause() }
    store.close()
    let after = Set(try FileManager.default.contentsOfDirectory(atPath: NSTemporaryDirectory()))
    #expect(
      after.subtracting(temporary).filter { $0.hasPrefix("ferry-recovered-") }.isEmpty, "the copy stayed")
    #expect(try Self.directoryContents(fixture.path) == before, "the view wrote to the store")

    // Settled, the same open reads the store itself.
    try await expectEveryAcknowledgedTaskQueued(fixture, acknowledged, count: 120)
    let settled = try FerryStore.openReadOnly(at: fixture.path, recoveredCopyIfNeeded: true)
    #expect(!settled.isRecoveredCopy)
    settled.close()
  }
}

extension RecoveredCopyViewTests {
  /// An alone read-write open that died while it settled a killed writer's store leaves the open
  /// lock marked unsettled (SegmentStoreCommandTests): a read-only open refuses it by default, and
  /// the read commands read a recovered copy of it instead, with every acknowledged event, the
  /// store's files unchanged.
  @Test func readCommandsReadAStoreMarkedUnsettled() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let acknowledged = try await killedSegmentAdder(fixture.path, adds: 300)
    let (opener, input) = try await SegmentStoreCommandTests.openerStoppedInItsFold(fixture.path)
    defer { opener.kill() }
    withExtendedLifetime(input) { opener.kill() }
    let mark = try Data(contentsOf: URL(fileURLWithPath: fixture.path + "/ferry-open.lock"))
    try #require(mark.first == UInt8(ascii: "1"), "the open lock is not marked unsettled")
    #expect(throws: FerryError.needsRecovery(path: fixture.path)) {
      try FerryStore.openReadOnly(at: fixture.path).close()
    }
    try await expectReadCommandsShow(acknowledged, in: fixture.path)
    try await expectEveryAcknowledgedTaskQueued(fixture, acknowledged, count: 300)
  }

  /// A read-write open that arrives while a read-only open holds the open lock before it opened
  /// LMDB — deciding, or copying the store to read a recovered copy — waits for it and then
  /// recovers the store alone; before, it took the store for shared and followed it as it stood.
  /// The read-only open is played by this process holding the lock shared.
  @Test func aReadWriteOpenWaitsForAReadOnlyOpenThatHoldsTheLockWithoutLMDB() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let acknowledged = try await killedSegmentAdder(fixture.path, adds: 100)
    let fd = open(fixture.path + "/ferry-open.lock", O_RDONLY | O_CLOEXEC)
    try #require(fd >= 0)
    var request = flock()
    request.l_type = Int16(F_RDLCK)
    request.l_whence = Int16(SEEK_SET)
    try #require(fcntl(fd, F_SETLK, &request) == 0)
    let input = Pipe()
    let opener = try Child(
      "ferry-test-worker", ["segment-read-then-add", fixture.path, "0"], stdin: input.fileHandleForReading)
    try await Task.sleep(for: .seconds(2))
    #expect(!opener.output.contains("open"), "the read-write open went ahead beside the lock holder")
    close(fd)
    _ = try await opener.waitForLine(startingWith: "open")
    input.fileHandleForWriting.write(Data("\n".utf8))
    #expect(try await opener.waitForLine(startingWith: "read") == "read \(acknowledged.count)")
    input.fileHandleForWriting.write(Data("\n".utf8))
    _ = try await opener.waitForLine(startingWith: "closed")
    let settled = try FerryStore.openReadOnly(at: fixture.path)
    #expect(!settled.isRecoveredCopy)
    settled.close()
  }

  /// Runs each read command on the killed writer's store at `path` and checks what it shows
  /// against `acknowledged`, and that the store's directory did not change.
  func expectReadCommandsShow(
    _ acknowledged: Set<TaskID>, in path: String, sourceLocation: SourceLocation = #_sourceLocation
  ) async throws {
    let before = try Self.directoryContents(path)
    let temporary =
      FileManager.default.temporaryDirectory.path + "/ferry-view-tmp-\(UUID().uuidString.prefix(8))"
    try FileManager.default.createDirectory(atPath: temporary, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: temporary) }
    let last = try #require(acknowledged.max())
    for command in Self.readCommands {
      var arguments = [command, path]
      if ["inspect", "log", "verify", "stats"].contains(command) { arguments.append("--json") }
      let run = try Self.ferry(arguments, temporaryDirectory: temporary)
      #expect(run.status == 0, "\(command): \(run.status) \(run.stderr)", sourceLocation: sourceLocation)
      #expect(
        run.stderr.contains("recovered copy") && run.stderr.contains("untouched")
          && run.stderr.contains("ferry recover \(path)"),
        "\(command): \(run.stderr)", sourceLocation: sourceLocation)
      switch command {
      case "log":
        let sequences = Set(
          run.stdout.split(separator: "\n").compactMap { line -> UInt64? in
            let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            return (object?["seq"] as? NSNumber)?.uint64Value
          })
        #expect(
          Set(acknowledged.map(\.rawValue)).isSubset(of: sequences), "log missed acknowledged events",
          sourceLocation: sourceLocation)
      case "export":
        let added = run.stdout.split(separator: "\n").filter { $0.contains("task.added") }
        #expect(
          added.count == acknowledged.count, "export: \(added.count) adds", sourceLocation: sourceLocation)
      case "stats", "verify":
        let object = try JSONSerialization.jsonObject(with: Data(run.stdout.utf8)) as? [String: Any]
        #expect(
          (object?["head"] as? NSNumber)?.uint64Value == last.rawValue, "\(command): \(run.stdout)",
          sourceLocation: sourceLocation)
        if command == "verify" {
          #expect(object?["healthy"] as? Bool == true, "\(run.stdout)", sourceLocation: sourceLocation)
        }
      default:
        #expect(
          run.stdout.contains("\(last.rawValue)"), "inspect: \(run.stdout.prefix(400))",
          sourceLocation: sourceLocation)
      }
      #expect(
        try FileManager.default.contentsOfDirectory(atPath: temporary).isEmpty, "\(command) left its copy",
        sourceLocation: sourceLocation)
    }
    #expect(
      try Self.directoryContents(path) == before, "a read wrote to the store", sourceLocation: sourceLocation)
  }

  /// Every file in the directory (the open lock too), by name: a file added or changed shows.
  static func directoryContents(_ path: String) throws -> [String: Data] {
    var files: [String: Data] = [:]
    for name in try FileManager.default.contentsOfDirectory(atPath: path) {
      files[name] = try Data(contentsOf: URL(fileURLWithPath: path + "/" + name))
    }
    return files
  }

  /// Runs `ferry` with `TMPDIR` set (when given); its status, standard output and error.
  static func ferry(
    _ arguments: [String], temporaryDirectory: String? = nil
  ) throws -> (
    status: Int32, stdout: String, stderr: String
  ) {
    let process = Process()
    process.executableURL = productURL("ferry")
    process.arguments = arguments
    if let temporaryDirectory {
      var environment = ProcessInfo.processInfo.environment
      environment["TMPDIR"] = temporaryDirectory
      process.environment = environment
    }
    let out = Pipe()
    let err = Pipe()
    process.standardOutput = out
    process.standardError = err
    try process.run()
    // Standard error holds a line or two: read after standard output, it cannot fill its pipe.
    let stdout = out.fileHandleForReading.readDataToEndOfFile()
    let stderr = err.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return (
      process.terminationStatus, String(decoding: stdout, as: UTF8.self),
      String(decoding: stderr, as: UTF8.self)
    )
  }

  static let mayMount: Bool = {
    guard let probe = try? TemporaryMount() else { return false }
    probe.remove()
    return true
  }()
}

/// A tmpfs mounted on a new temporary directory (root only), unmounted and removed by ``remove()``.
struct TemporaryMount {
  struct Refused: Error {}
  let path = FileManager.default.temporaryDirectory.path + "/ferry-mount-\(UUID().uuidString.prefix(8))"

  init(size: String = "64m") throws {
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    guard runQuietly(["mount", "-t", "tmpfs", "-o", "size=\(size)", "tmpfs", path]) == 0 else {
      try? FileManager.default.removeItem(atPath: path)
      throw Refused()
    }
  }

  func remove() {
    _ = runQuietly(["umount", path])
    try? FileManager.default.removeItem(atPath: path)
  }
}

/// Runs a system command quietly; its exit status (-1 when it could not start).
func runQuietly(_ arguments: [String]) -> Int32 {
  let process = Process()
  process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
  process.arguments = arguments
  process.standardOutput = FileHandle.nullDevice
  process.standardError = FileHandle.nullDevice
  do { try process.run() } catch { return -1 }
  process.waitUntilExit()
  return process.terminationStatus
}
