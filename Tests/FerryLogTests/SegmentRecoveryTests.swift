import FerryLog
import Foundation
import LMDB
import Synchronization
import TestSupport
import Testing

/// Recovery of the write-ahead segment (`Specs/one-sync-commit.md`) under what a hostile user
/// would do: other processes closing, rebuilding and being killed at awkward moments,
/// files that are not what the protocol expects. Real stores, real processes, real files.
@Suite(.timeLimit(.minutes(20))) struct SegmentRecoveryTests {
  /// A `ferry-test-worker` child whose standard output is collected line by line and whose
  /// standard input the test writes to.
  final class Worker: Sendable {
    let process = Process()
    private let lines = Mutex<[String]>([])
    private let ended = DispatchSemaphore(value: 0)
    private let input = Pipe()

    init(_ arguments: [String], environment: [String: String] = [:]) throws {
      process.executableURL = productURL("ferry-test-worker")
      process.arguments = arguments
      var merged = ProcessInfo.processInfo.environment
      for (key, value) in environment { merged[key] = value }
      process.environment = merged
      let output = Pipe()
      process.standardOutput = output
      process.standardInput = input
      process.standardError = output
      try process.run()
      let handle = output.fileHandleForReading
      Thread.detachNewThread { [self] in
        var buffer = Data()
        while true {
          let chunk = handle.availableData
          if chunk.isEmpty { break }
          buffer += chunk
          while let newline = buffer.firstIndex(of: 10) {
            let line = String(decoding: buffer[buffer.startIndex..<newline], as: UTF8.self)
            buffer = Data(buffer[buffer.index(after: newline)...])
            lines.withLock { $0.append(line) }
          }
        }
        // Reaped here, and only here: only `waitUntilExit()` releases a process's descriptors,
        // and it must not run on two threads at once (it sets and clears the process's run loop
        // state without a lock).
        process.waitUntilExit()
        ended.signal()
      }
    }

    /// Waits until a line starting with `prefix` appears; false if the worker ends without it (no
    /// time limit: a loaded machine may take long; the suite's limit ends a hang).
    @discardableResult
    func wait(for prefix: String) async throws -> Bool {
      while !lines.withLock({ $0.contains { $0.hasPrefix(prefix) } }) {
        if !process.isRunning {
          Issue.record("the worker never said \(prefix): \(lines.withLock { $0.suffix(3) })")
          return false
        }
        try await Task.sleep(for: .milliseconds(5))
      }
      return true
    }

    func send(_ line: String) {
      input.fileHandleForWriting.write(Data((line + "\n").utf8))
    }

    /// Waits for it to end by itself (killing it after 20 minutes: a hang guard for this
    /// blocking wait, which no time limit can cancel); returns how it ended.
    func waitForExit() -> (reason: Process.TerminationReason, status: Int32) {
      let deadline = DispatchTime.now() + .seconds(20 * 60)
      // weakly: no descriptors held a minute
      DispatchQueue.global().asyncAfter(deadline: deadline) { [weak process] in
        if let process, process.isRunning { Foundation.kill(process.processIdentifier, SIGKILL) }
      }
      ended.wait()  // the output's reader reaps it (the only caller of waitUntilExit: see init)
      return (process.terminationReason, process.terminationStatus)
    }

    /// SIGKILLs it and returns its lines.
    func kill() -> [String] {
      Foundation.kill(process.processIdentifier, SIGKILL)
      ended.wait()  // the output's reader reaps it
      return lines.withLock { $0 }
    }

    var said: [String] { lines.withLock { $0 } }
  }

  final class Flag: Sendable { let value = Atomic<Bool>(false) }
  final class Counter: Sendable { let value = Atomic<Int>(0) }

  func segmentOn(_ configuration: inout EventLog.Configuration) { configuration.writeAheadSegment = true }

  /// A payload of about a kilobyte that starts with `text`: a rebuild of a projection that keeps
  /// payloads then rewrites many pages.
  func bulky(_ text: String) -> [UInt8] { payload(text + " " + String(repeating: "x", count: 1000)) }

  func fileBytes(_ path: String) throws -> Data { try Data(contentsOf: URL(fileURLWithPath: path)) }

  // MARK: - A process that follows the segment writes without a pin

  /// The app (here, this process) has the store open with the segment; `ferry`-like tooling in
  /// another process opens it too and follows the segment. The app closes — its last checkpoint
  /// becomes the store's, and its pin goes. The other process then rebuilds a projection in
  /// chunks (commits not flushed) and is killed before the rebuild's own checkpoint. The next
  /// open restores the app's last checkpoint: its pages must still be there.
  @Test func aFollowerKilledMidRebuildAfterTheAppClosedLeavesTheCheckpointIntact() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let projections: [any Projection] = [PayloadsBySequence()]
    let log = try store.open(projections, configure: segmentOn)
    for batch in 0..<30 {
      _ = try await log.append((0..<100).map { NewEvent(type: "app", payload: bulky("app \(batch)-\($0)")) })
    }
    let worker = try Worker(
      ["segment-share-rebuild", store.path, "100"],
      environment: ["FERRY_CRASH_POINT": "rebuild.chunk", "FERRY_CRASH_AFTER": "25"])
    try await worker.wait(for: "open 3000")
    log.close()
    worker.send("go")
    let ended = worker.waitForExit()
    #expect(ended.reason == .uncaughtSignal, "the worker should have been killed mid-rebuild: \(worker.said)")
    let again = try store.open(projections, configure: segmentOn)
    defer { again.close() }
    #expect(try again.head() == 3000)
    #expect(try again.event(at: 3000)?.payload == bulky("app 29-99"))
    #expect(try again.verify().problems.isEmpty)
  }

  // MARK: - Files that are not what they should be

  /// A `ferry-segment` copied in from another store (a careless restore, two stores' files mixed
  /// up) must be refused before its checkpoint's meta pages are written into this store's data
  /// file: the store stays as it was, and opens again once the foreign file is gone.
  @Test func aSegmentFromAnotherStoreIsRefusedBeforeItTouchesTheDataFile() async throws {
    let mine = TemporaryStore("mine")
    let theirs = TemporaryStore("theirs")
    defer {
      mine.remove()
      theirs.remove()
    }
    for (store, count) in [(mine, 40), (theirs, 300)] {
      let log = try store.open(configure: segmentOn)
      for i in 0..<count { _ = try await log.append(NewEvent(type: "t", payload: payload("\(i)"))) }
      log.close()
    }
    try FileManager.default.removeItem(atPath: mine.path + "/ferry-segment")
    try FileManager.default.copyItem(
      atPath: theirs.path + "/ferry-segment", toPath: mine.path + "/ferry-segment")
    let before = try fileBytes(mine.path + "/data.mdb")
    do {
      let log = try mine.open(configure: segmentOn)
      Issue.record("a store opened with another store's segment (head \(try log.head()))")
      log.close()
    } catch FerryLogError.damagedStore(_, let reason) {
      #expect(reason.contains("another store"), "\(reason)")
    }
    #expect(try fileBytes(mine.path + "/data.mdb") == before, "the data file was changed")
    try FileManager.default.removeItem(atPath: mine.path + "/ferry-segment")
    let log = try mine.open(configure: segmentOn)
    defer { log.close() }
    #expect(try log.head() == 40)
    #expect(try log.verify().problems.isEmpty)
  }

  /// An older copy of `data.mdb` put back under the segment (a restore from a backup of the data
  /// file alone): the segment's checkpoint is newer than anything the file holds, and writing its
  /// meta pages into the old file would leave neither state readable. Refused, nothing written.
  @Test func anOlderDataFileUnderTheSegmentIsRefusedBeforeItIsWritten() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open(configure: segmentOn)
    for i in 0..<30 { _ = try await log.append(NewEvent(type: "t", payload: payload("\(i)"))) }
    log.close()
    let backup = try fileBytes(store.path + "/data.mdb")
    let again = try store.open(configure: segmentOn)
    for i in 30..<400 { _ = try await again.append(NewEvent(type: "t", payload: payload("\(i)"))) }
    again.close()
    try backup.write(to: URL(fileURLWithPath: store.path + "/data.mdb"))
    do {
      let log = try store.open(configure: segmentOn)
      Issue.record("a data file older than the segment's checkpoint was opened (head \(try log.head()))")
      log.close()
    } catch FerryLogError.damagedStore(_, let reason) {
      #expect(reason.contains("older than its write-ahead segment's checkpoint"), "\(reason)")
    } catch FerryLogError.lostCommits {}
    #expect(try fileBytes(store.path + "/data.mdb") == backup, "the data file was changed")
  }

  /// A writer killed with frames past its checkpoint leaves a store only a read-write open can
  /// replay; a read-only open that finds no `ferry-open.lock` (deleted, or the store copied
  /// without it) has no other process to share the store with — it is alone, and must refuse the
  /// same way rather than read the data file as it is.
  @Test func aReadOnlyOpenWithoutTheOpenLockFileIsAloneAndRefusedAfterAKilledWriter() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let writer = try Worker(["segment-append", store.path, "120", "ON"])
    try await writer.wait(for: "holding")
    _ = writer.kill()
    try FileManager.default.removeItem(atPath: store.path + "/ferry-open.lock")
    do {
      let log = try store.open([]) { $0.readOnly = true }
      Issue.record(
        "a read-only open read a store whose segment holds unreplayed commits (head \(try log.head()))")
      log.close()
    } catch FerryLogError.needsRecovery {}
    let log = try store.open(configure: segmentOn)
    defer { log.close() }
    #expect(try log.head() == 120)
    #expect(try log.verify().problems.isEmpty)
  }

  /// `ferry-segment` or `ferry-open.lock` replaced by a directory, a FIFO, or a symlink to a device
  /// or to nothing: every open is refused with a typed error, none hangs, and the data file is
  /// left as it was.
  @Test(arguments: ["ferry-segment", "ferry-open.lock"], ["directory", "fifo", "device", "dangling"])
  func aSegmentOrLockFileThatIsNoRegularFileIsRefused(file: String, kind: String) async throws {
    let store = TemporaryStore("\(file)\(kind)")
    defer { store.remove() }
    let log = try store.open(configure: segmentOn)
    for i in 0..<20 { _ = try await log.append(NewEvent(type: "t", payload: payload("\(i)"))) }
    log.close()
    let target = store.path + "/" + file
    try FileManager.default.removeItem(atPath: target)
    switch kind {
    case "directory":
      try FileManager.default.createDirectory(atPath: target, withIntermediateDirectories: false)
    case "fifo": #expect(mkfifo(target, 0o600) == 0)
    case "device":
      try FileManager.default.createSymbolicLink(atPath: target, withDestinationPath: "/dev/zero")
    default:
      try FileManager.default.createSymbolicLink(atPath: target, withDestinationPath: store.path + "/nothing")
    }
    let before = try fileBytes(store.path + "/data.mdb")
    for readOnly in [false, true] {
      do {
        let log = try store.open {
          $0.writeAheadSegment = true; $0.readOnly = readOnly
        }
        // A dangling lock symlink is a lock file a read-write open may create; then the store opens.
        let tolerated = file == "ferry-open.lock" && kind == "dangling"
        if !tolerated { Issue.record("opened (read-only: \(readOnly)) with \(file) a \(kind)") }
        log.close()
      } catch let error as FerryLogError {
        switch error {
        case .damagedStore, .ioError, .permissionDenied, .notAStore: break
        default: Issue.record("refused with \(error)")
        }
      }
    }
    if !(file == "ferry-open.lock" && kind == "dangling") {
      #expect(try fileBytes(store.path + "/data.mdb") == before, "the data file was changed")
    }
  }

  // MARK: - Sizes and rates

  /// One batch larger than the whole 8 MiB segment, then more: the frame runs past the file's
  /// preallocated end, and a killed writer's frames are still replayed in full.
  @Test func batchesLargerThanTheSegmentAreReplayedAfterAKill() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let size = 9 << 20
    let writer = try Worker(["segment-append", store.path, "3", "ON", "\(size)"])
    try await writer.wait(for: "holding")
    let acknowledged = writer.kill().filter { $0.hasPrefix("ack ") }
    #expect(acknowledged.count == 3)
    let log = try store.open(configure: segmentOn)
    defer { log.close() }
    #expect(try log.head() == 3)
    for sequence in UInt64(1)...3 {
      let event = try #require(try log.event(at: sequence))
      #expect(event.payload.count == size)
      #expect(String(decoding: event.payload.prefix(12), as: UTF8.self) == "worker \(sequence - 1)xxxx")
    }
    #expect(try log.verify().problems.isEmpty)
  }

  /// A checkpoint after every commit, thousands of commits, then a kill: nothing acknowledged is
  /// missing and the segment is reused from its start each time.
  @Test func aCheckpointAfterEveryCommitLosesNothingAcrossAKill() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let writer = try Worker(["segment-append", store.path, "1500", "ON", "0", "1"])
    try await writer.wait(for: "holding")
    let acknowledged = writer.kill().compactMap { $0.hasPrefix("ack ") ? UInt64($0.dropFirst(4)) : nil }
    #expect(acknowledged.count == 1500)
    let size = try FileManager.default.attributesOfItem(atPath: store.path + "/ferry-segment")[.size] as? Int
    #expect(size == 8 << 20)
    let log = try store.open(configure: segmentOn)
    defer { log.close() }
    #expect(try log.head() == 1500)
    for sequence in acknowledged {
      #expect(try log.event(at: sequence)?.payload == payload("worker \(sequence - 1)"))
    }
    #expect(try log.verify().problems.isEmpty)
  }

  /// A map that starts at 64 KiB and has to grow again and again while the checkpoint's pin is
  /// held and readers read, with 16 callers appending: all of it is there after reopening.
  @Test func theMapGrowsWhileThePinIsHeldUnderConcurrentCallersAndReaders() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open {
      $0.writeAheadSegment = true
      $0.initialMapSize = 1 << 16
      $0.segmentCheckpointCommits = 50
    }
    let stop = Flag()
    // The reader spins on a thread of its own: spinning in a task would hold one of the few
    // threads of the concurrency pool (two on a two-core machine) until the callers it waits for
    // — which need that pool — are done.
    let readerFailure = Mutex<(any Error)?>(nil)
    let readerDone = DispatchSemaphore(value: 0)
    Thread.detachNewThread {
      do {
        while !stop.value.load(ordering: .relaxed) {
          let head = try log.head()
          if head > 0 { _ = try log.event(at: head) }
        }
      } catch {
        readerFailure.withLock { $0 = error }
      }
      readerDone.signal()
    }
    let sequences = try await withThrowingTaskGroup(of: [UInt64].self) { group in
      for caller in 0..<16 {
        group.addTask {
          var mine: [UInt64] = []
          for i in 0..<40 {
            mine.append(try await log.append(NewEvent(type: "c", payload: bulky("\(caller)-\(i)"))))
          }
          return mine
        }
      }
      return try await group.reduce(into: []) { $0 += $1 }
    }
    stop.value.store(true, ordering: .relaxed)
    readerDone.wait()
    #expect(readerFailure.withLock { $0 } == nil)
    #expect(log.storageCounters.mapGrowths > 0)
    log.close()
    #expect(Set(sequences).count == 640)
    let again = try store.open(configure: segmentOn)
    defer { again.close() }
    #expect(try again.head() == 640)
    #expect(try again.verify().problems.isEmpty)
  }

  /// Close while 32 callers are appending: every append that returned is there after reopening,
  /// every other one failed with `closed`, and nothing else was written.
  @Test func closeWhileAppendsAreInFlightKeepsExactlyWhatWasAcknowledged() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open(configure: segmentOn)
    let started = Counter()
    let outcomes = try await withThrowingTaskGroup(of: [(UInt64, [UInt8])].self) { group in
      for caller in 0..<32 {
        group.addTask {
          var mine: [(UInt64, [UInt8])] = []
          for i in 0..<200 {
            let bytes = payload("\(caller)-\(i)")
            do {
              mine.append((try await log.append(NewEvent(type: "c", payload: bytes)), bytes))
              started.value.add(1, ordering: .relaxed)
            } catch FerryLogError.closed {
              break
            }
          }
          return mine
        }
      }
      while started.value.load(ordering: .relaxed) < 300 { try await Task.sleep(for: .milliseconds(1)) }
      log.close()
      return try await group.reduce(into: []) { $0 += $1 }
    }
    #expect(outcomes.count < 32 * 200)
    let again = try store.open(configure: segmentOn)
    defer { again.close() }
    #expect(try again.head() == UInt64(outcomes.count))
    for (sequence, bytes) in outcomes { #expect(try again.event(at: sequence)?.payload == bytes) }
    #expect(try again.verify().problems.isEmpty)
  }

  // MARK: - A damaged segment must not take the data file down with it

  /// After a kill, the data file (the page cache survives a kill) holds every commit; only the
  /// segment is damaged — one flipped byte in an early frame. The open cannot replay what the
  /// head mark says was acknowledged, and refuses; it must do so before writing the checkpoint's
  /// meta pages over the data file's newer ones, so that salvage (an `allowDamage` read) still
  /// finds every event there.
  @Test func aFlippedFrameIsRefusedBeforeTheDataFileIsRolledBack() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let writer = try Worker(["segment-append", store.path, "50", "ON"])
    try await writer.wait(for: "holding")
    _ = writer.kill()
    let segment = store.path + "/ferry-segment"
    var bytes = [UInt8](try fileBytes(segment))
    bytes[4096 + 9 * 63 + 40] ^= 0x40
    try Data(bytes).write(to: URL(fileURLWithPath: segment))
    let before = try fileBytes(store.path + "/data.mdb")
    do {
      let log = try store.open(configure: segmentOn)
      Issue.record("opened with head \(try log.head()) although acknowledged events are missing")
      log.close()
    } catch FerryLogError.lostCommits(_, let acknowledged, _) {
      #expect(acknowledged == 50)
    }
    #expect(try fileBytes(store.path + "/data.mdb") == before, "the data file was rolled back")
    let salvage = try store.open([]) {
      $0.readOnly = true
      $0.allowDamage = true
    }
    defer { salvage.close() }
    #expect(try salvage.head() == 50)
  }

  /// The same with the current header slot torn (its checksum broken) after many checkpoints:
  /// the older slot's checkpoint is long gone — its frames overwritten by the newer cycle — so
  /// the segment cannot bring back what was acknowledged. Refused, the data file untouched.
  @Test func aTornCurrentHeaderSlotIsRefusedBeforeTheDataFileIsRolledBack() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let writer = try Worker(["segment-append", store.path, "300", "ON", "0", "7"])
    try await writer.wait(for: "holding")
    _ = writer.kill()
    let segment = store.path + "/ferry-segment"
    var bytes = [UInt8](try fileBytes(segment))
    func counter(_ slot: Int) -> UInt64 {
      UInt64(bigEndianBytes: bytes[slot * 512 + 8..<slot * 512 + 16]) ?? 0
    }
    let current = counter(0) > counter(1) ? 0 : 1
    bytes[current * 512 + 100] ^= 0x01
    try Data(bytes).write(to: URL(fileURLWithPath: segment))
    let before = try fileBytes(store.path + "/data.mdb")
    do {
      let log = try store.open(configure: segmentOn)
      Issue.record("opened with head \(try log.head()) from the older checkpoint")
      log.close()
    } catch let error as FerryLogError {
      switch error {
      case .lostCommits, .damagedStore: break
      default: Issue.record("refused with \(error)")
      }
    }
    #expect(try fileBytes(store.path + "/data.mdb") == before, "the data file was rolled back")
    let salvage = try store.open([]) {
      $0.readOnly = true
      $0.allowDamage = true
    }
    defer { salvage.close() }
    #expect(try salvage.head() == 300)
  }

  // MARK: - Company and kills at random moments

  /// Rounds of two writer processes on one store — each asking for the segment or not, at
  /// random — killed at random moments one after the other, with a read-only process opening in
  /// between (its open clears the first one's dead pin from LMDB's reader table). The store is
  /// recovered by whichever opens alone next. Every event any of them acknowledged is there at
  /// the end, with its payload, and the store verifies.
  @Test func twoWritersKilledAtRandomMomentsRoundAfterRoundLoseNothingAcknowledged() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    var generator = SystemRandomNumberGenerator()
    var expected: [UInt64: [UInt8]] = [:]
    func record(_ lines: [String]) {
      let acks = lines.compactMap { $0.hasPrefix("ack ") ? UInt64($0.dropFirst(4)) : nil }
      for (i, sequence) in acks.enumerated() {
        if let known = expected[sequence] {
          Issue.record("sequence \(sequence) acknowledged twice (\(String(decoding: known, as: UTF8.self)))")
        }
        expected[sequence] = payload("worker \(i)")
      }
    }
    for round in 0..<10 {
      let first = try Worker([
        "segment-append", store.path, "1000000", Bool.random(using: &generator) ? "ON" : "OFF", "0",
        "\(Int.random(in: 1...40, using: &generator))",
      ])
      try await first.wait(for: "ack ")
      let second = try Worker([
        "segment-append", store.path, "1000000", Bool.random(using: &generator) ? "ON" : "OFF", "0",
        "\(Int.random(in: 1...40, using: &generator))",
      ])
      try await second.wait(for: "ack ")
      try await Task.sleep(for: .milliseconds(Int.random(in: 0...150, using: &generator)))
      record(first.kill())
      let (status, output) = try await runProduct("ferry-test-worker", ["log-head", store.path])
      #expect(status == 0, "round \(round): \(output)")
      try await Task.sleep(for: .milliseconds(Int.random(in: 0...150, using: &generator)))
      record(second.kill())
    }
    let log = try store.open(configure: segmentOn)
    defer { log.close() }
    let head = try log.head()
    #expect(head >= UInt64(expected.count))
    var wrong = 0
    for (sequence, bytes) in expected where try log.event(at: sequence)?.payload != bytes { wrong += 1 }
    #expect(wrong == 0, "\(wrong) of \(expected.count) acknowledged events missing or changed")
    #expect(try log.verify().problems.isEmpty)
  }

  // MARK: - An open that waited while the alone open died

  /// Whether process `pid` is waiting for a POSIX record lock (Linux's `/proc/locks` lists the
  /// waiters with `->`).
  static func isWaitingForALock(_ pid: Int32) -> Bool {
    guard let text = procText("/proc/locks") else { return false }
    return text.split(separator: "\n").contains { line in
      let fields = line.split(whereSeparator: { $0 == " " })
      return fields.count > 5 && fields[1] == "->" && fields[5] == "\(pid)"
    }
  }

  /// A `segment-append` worker that appends 200 events with the segment on and is killed while it
  /// holds the store (frames outstanding); returns the sequences it acknowledged.
  func killedSegmentWriter(_ path: String) async throws -> [UInt64] {
    let writer = try Worker(["segment-append", path, "200", "ON"])
    try await writer.wait(for: "holding")
    return writer.kill().compactMap { $0.hasPrefix("ack ") ? UInt64($0.dropFirst(4)) : nil }
  }

  /// Takes the write lock LMDB's openers ask for on the first byte of `lock.mdb` (as `ferry compact
  /// --copy` does while it swaps the file), so that an open waits; returns the descriptor to close.
  func holdLMDBLock(_ path: String) throws -> Int32 {
    let lockFile = open(path + "/lock.mdb", O_RDWR | O_CLOEXEC)
    try #require(lockFile >= 0)
    var hold = flock()
    hold.l_type = Int16(F_WRLCK)
    hold.l_whence = Int16(SEEK_SET)
    hold.l_start = 0
    hold.l_len = 1
    try #require(fcntl(lockFile, F_SETLK, &hold) == 0)
    return lockFile
  }

  func waitUntilWaitingForALock(_ worker: Worker) async throws -> Bool {
    // No time limit: a loaded machine may take long to get there; a worker that ended never will.
    while !Self.isWaitingForALock(worker.process.processIdentifier) {
      if !worker.process.isRunning { return false }
      try await Task.sleep(for: .milliseconds(2))
    }
    return true
  }

  /// A writer killed with frames outstanding; the next read-write open (alone) restores the
  /// checkpoint's meta pages and then waits inside LMDB's open — `lock.mdb` is held the way
  /// `ferry compact --copy` holds it while it swaps the file. Another read-write open comes and
  /// waits for the open lock. The first is killed there, before it replayed anything. The second
  /// then gets the lock shared — but nobody settled the store, and nobody else has it open: it
  /// must settle it itself, not take the restored checkpoint for a live store (refusing it as
  /// damaged when LMDB's lock file still names the dead writer's transaction, or checkpointing
  /// over the frames that still hold acknowledged events). Every acknowledged event survives.
  @Test(.enabled(if: FileManager.default.fileExists(atPath: "/proc/locks")))
  func anOpenThatWaitedWhileTheAloneOpenDiedMidRecoveryLosesNothing() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let acknowledged = try await killedSegmentWriter(store.path)
    #expect(acknowledged.count == 200)
    let lockFile = try holdLMDBLock(store.path)
    var released = false
    defer { if !released { close(lockFile) } }

    let first = try Worker(["segment-append", store.path, "5", "ON"])
    try #require(try await waitUntilWaitingForALock(first), "the first open never waited for lock.mdb")
    let second = try Worker(["segment-append", store.path, "5", "ON"])
    try #require(try await waitUntilWaitingForALock(second), "the second open never waited for the open lock")
    // Stopped where it waits, the first cannot take lock.mdb when it is let go; then killed.
    // So the second, once past the open lock, finds lock.mdb free, as it would be.
    kill(first.process.processIdentifier, SIGSTOP)
    close(lockFile)
    released = true
    _ = first.kill()
    while second.process.isRunning && !second.said.contains("holding") {
      try await Task.sleep(for: .milliseconds(5))
    }
    // Being alone now (the first is dead), it is the one to settle the store.
    #expect(
      second.said.contains("holding"), "the second open did not settle the store: \(second.said.suffix(1))")
    let secondAcks = second.kill().compactMap { $0.hasPrefix("ack ") ? UInt64($0.dropFirst(4)) : nil }

    let log = try store.open(configure: segmentOn)
    defer { log.close() }
    #expect(try log.head() == UInt64(200 + secondAcks.count))
    for sequence in acknowledged {
      #expect(try log.event(at: sequence)?.payload == payload("worker \(sequence - 1)"))
    }
    #expect(try log.verify().problems.isEmpty)
  }

  /// A process that opens LMDB without Ferry's open lock (LMDB's own tools, a Ferry too old to
  /// know the segment, which opens LMDB before it refuses format 3) holds `lock.mdb` while the
  /// alone open recovers: LMDB then keeps the dead writer's transaction counter from its lock
  /// file, which no longer matches the meta pages just restored. The open must notice before it
  /// writes; a recovery on top of that mismatch left a checkpoint whose meta pages the next open
  /// refused as damaged.
  @Test(.enabled(if: FileManager.default.fileExists(atPath: "/proc/locks")))
  func aRecoveryWhileAnotherProcessHoldsLMDBsLockFileWritesNothingItCannotStandBy() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let acknowledged = try await killedSegmentWriter(store.path)
    #expect(acknowledged.count == 200)
    let lockFile = try holdLMDBLock(store.path)
    let opener = try Worker(["segment-append", store.path, "5", "ON"])
    let waited = try await waitUntilWaitingForALock(opener)
    close(lockFile)
    try #require(waited, "the open never waited for lock.mdb")
    while opener.process.isRunning && !opener.said.contains("holding") {
      try await Task.sleep(for: .milliseconds(5))
    }
    let openerAcks = opener.kill().compactMap { $0.hasPrefix("ack ") ? UInt64($0.dropFirst(4)) : nil }

    let log = try store.open(configure: segmentOn)
    defer { log.close() }
    #expect(try log.head() == UInt64(200 + openerAcks.count))
    for sequence in acknowledged {
      #expect(try log.event(at: sequence)?.payload == payload("worker \(sequence - 1)"))
    }
    #expect(try log.verify().problems.isEmpty)
  }
}
