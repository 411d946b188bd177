import Ferry
import FerryLog
import FerryTools
import Foundation
import Synchronization
import TestSupport
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// How a process ended, with what it printed.
struct Ended {
  let status: Int32
  let signaled: Bool
  let stdout: Data
  let stderr: String
  var out: String { String(decoding: stdout, as: UTF8.self) }
  var stderrLines: [Substring] { stderr.split(separator: "\n", omittingEmptySubsequences: true) }
}

/// A directory of the test's own, removed by `remove()`.
struct Scratch {
  let path = FileManager.default.temporaryDirectory.path + "/ferry-damage-\(UUID().uuidString.prefix(8))"
  init() throws { try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false) }
  func remove() { try? FileManager.default.removeItem(atPath: path) }
  /// What the directory holds.
  func entries() -> [String] { (try? FileManager.default.contentsOfDirectory(atPath: path))?.sorted() ?? [] }
}

/// Starts `executable` with `arguments` and the environment plus `extra`.
func start(
  _ executable: URL, _ arguments: [String], extra: [String: String] = [:], input: Pipe? = nil
) throws -> (Process, Pipe, Pipe) {
  signal(SIGPIPE, SIG_IGN)  // a write to a child that died must fail, not kill the test process
  let process = Process()
  process.executableURL = executable
  process.arguments = arguments
  process.environment = ProcessInfo.processInfo.environment.merging(extra) { $1 }
  let out = Pipe()
  let err = Pipe()
  process.standardOutput = out
  process.standardError = err
  process.standardInput = input ?? FileHandle.nullDevice
  try process.run()
  return (process, out, err)
}

/// Waits for a started process, reading both its outputs, killing it after a minute.
func finish(_ process: Process, _ out: Pipe, _ err: Pipe) -> Ended {
  // Held weakly: a strong hold kept the process and its pipes open for the whole minute.
  DispatchQueue.global().asyncAfter(deadline: .now() + 60) { [weak process] in
    if let process, process.isRunning { process.terminate() }
  }
  let errData = Mutex(Data())
  let group = DispatchGroup()
  group.enter()
  Thread.detachNewThread {  // its own thread: a blocking read must not wait for a pool thread
    errData.withLock { $0 = err.fileHandleForReading.readAll() }
    group.leave()
  }
  let outData = out.fileHandleForReading.readAll()
  group.wait()
  process.waitUntilExit()
  return Ended(
    status: process.terminationStatus, signaled: process.terminationReason == .uncaughtSignal,
    stdout: outData, stderr: String(decoding: errData.withLock { $0 }, as: UTF8.self))
}

/// Runs the built `ferry` with its temporary directory at `tmp`.
func runFerry(_ arguments: [String], tmp: String, extra: [String: String] = [:]) throws -> Ended {
  let (process, out, err) = try start(
    productURL("ferry"), arguments, extra: extra.merging(["TMPDIR": tmp]) { $1 })
  return finish(process, out, err)
}

/// A store of `tasks` tasks (some cancelled, some failed, some blocked) and a few cache fetches,
/// written through the library (`writeAheadSegment: false`: with LMDB's flushed commits, for a test
/// of what edits to `data.mdb` itself do; a segment store's open puts its checkpoint's meta pages
/// back, `Specs/one-sync-commit.md` §5).
func makeStore(at path: String, tasks: Int, writeAheadSegment: Bool = true) async throws {
  var configuration = FerryStore.Configuration()
  configuration.writeAheadSegment = writeAheadSegment
  let store = try await FerryStore.open(at: path, configuration: configuration)
  defer { store.close() }
  let padding = String(repeating: "x", count: 300)
  try await withThrowingTaskGroup(of: Void.self) { group in
    for i in 0..<tasks {
      group.addTask {
        try await store.queue.add(
          tag: "item", payload: ["n": "\(i)", "padding": padding], groupId: i % 10 == 0 ? "list" : nil)
      }
    }
    try await group.waitForAll()
  }
  for id in try store.queue.pendingTasks().prefix(tasks / 4).map(\.id) { try await store.queue.cancel(id) }
  for key in ["a", "b", "c"] {
    try await store.ledger.recordFetch(key: key, outcome: .success(isEmpty: false))
    try await store.ledger.recordFetch(key: key, outcome: .failure("offline"))
  }
}

/// The commands that read a store, as run on `dir`.
func readingCommands(_ dir: String) -> [[String]] {
  [["verify", dir], ["export", dir], ["log", dir], ["stats", dir], ["replay", dir], ["inspect", dir]]
}

/// Bytes a terminal acts on: C0 controls other than the line feed, DEL, C1 controls (UTF-8
/// C2 80-9F) and the bidirectional override U+202E (E2 80 AE).
func rawControls(_ data: Data) -> [Int] {
  let bytes = [UInt8](data)
  var found: [Int] = []
  for (i, byte) in bytes.enumerated() {
    if (byte < 0x20 && byte != 0x0A) || byte == 0x7F { found.append(i) }
    if byte == 0xC2, i + 1 < bytes.count, (0x80...0x9F).contains(bytes[i + 1]) { found.append(i) }
    if byte == 0xE2, i + 2 < bytes.count, bytes[i + 1] == 0x80, bytes[i + 2] == 0xAE { found.append(i) }
  }
  return found
}

@Suite(.timeLimit(.minutes(20)), .serialized) struct DamageContainmentTests {
  // MARK: 1. Contain what can crash

  @Test(arguments: ["8KiB", "16KiB", "half"])
  func everyReadingCommandOnATruncatedStoreExitsSixNeverBySignal(cut: String) async throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let dir = scratch.path + "/store"
    try await makeStore(at: dir, tasks: 300)
    let size = try #require(
      try FileManager.default.attributesOfItem(atPath: dir + "/data.mdb")[.size] as? Int)
    #expect(size > 64 << 10, "a store this size holds pages past every cut")
    let length = cut == "8KiB" ? 8192 : cut == "16KiB" ? 16384 : size / 2
    #expect(truncate(dir + "/data.mdb", off_t(length)) == 0)
    let tmp = scratch.path + "/tmp"
    try FileManager.default.createDirectory(atPath: tmp, withIntermediateDirectories: false)
    for command in readingCommands(dir) {
      let ended = try runFerry(command, tmp: tmp)
      #expect(!ended.signaled, "\(command[0]) ended by signal \(ended.status)")
      #expect(
        ended.status == ExitStatus.corruptRecord.rawValue, "\(command[0]): \(ended.status) \(ended.stderr)")
      #expect(ended.stderrLines.count == 1, "\(command[0]): \(ended.stderr)")
      #expect(ended.stderr.contains("is damaged"), "\(command[0]): \(ended.stderr)")
      #expect(ended.stderr.contains("ferry salvage"), "\(command[0]): \(ended.stderr)")
      // Nothing left behind: no private directory, no scratch environment of verify or replay.
      #expect(try FileManager.default.contentsOfDirectory(atPath: tmp) == [], "\(command[0])")
    }
    let size2 = try FileManager.default.attributesOfItem(atPath: dir + "/data.mdb")[.size] as? Int
    #expect(size2 == length, "nothing was written to the damaged store")
  }

  @Test(arguments: 1...7)
  func aPageOfFFBytesNeverEndsAReadingCommandBySignalOrAStorageError(eighth: Int) async throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let dir = scratch.path + "/store"
    try await makeStore(at: dir, tasks: 300)
    let url = URL(fileURLWithPath: dir + "/data.mdb")
    var bytes = [UInt8](try Data(contentsOf: url))
    let pageSize = 4096
    let pages = bytes.count / pageSize
    // Not page 0 or 1: those are LMDB's meta pages (the other checks' concern). The file's length
    // does not change, so only what a page says can go wrong.
    let page = max(2, min(pages - 1, pages * eighth / 8))
    for i in (page * pageSize)..<((page + 1) * pageSize) { bytes[i] = 0xFF }
    try Data(bytes).write(to: url)
    let tmp = scratch.path + "/tmp"
    try FileManager.default.createDirectory(atPath: tmp, withIntermediateDirectories: false)
    for command in readingCommands(dir) {
      let ended = try runFerry(command, tmp: tmp)
      #expect(!ended.signaled, "\(command[0]) ended by signal \(ended.status)")
      // Readable, a problem found, or damage — never "storage error" (9) for what LMDB calls damage.
      #expect(
        [0, 1, 6].contains(ended.status), "\(command[0]) page \(page): \(ended.status) \(ended.stderr)")
      #expect(try FileManager.default.contentsOfDirectory(atPath: tmp) == [], "\(command[0])")
    }
  }

  @Test func aReaderThatCrashesIsReportedAsDamageAndItsTemporaryDirectoryRemoved() async throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let dir = scratch.path + "/store"
    try await makeStore(at: dir, tasks: 20)
    let tmp = scratch.path + "/tmp"
    try FileManager.default.createDirectory(atPath: tmp, withIntermediateDirectories: false)
    // `log --follow` reads until it is stopped: the reader is there to be crashed.
    let (process, out, err) = try start(
      productURL("ferry"), ["log", dir, "--follow"], extra: ["TMPDIR": tmp])
    defer { if process.isRunning { process.terminate() } }
    var reader: [Int32] = []
    for _ in 0..<1000 where reader.isEmpty {
      usleep(10_000)
      reader = children(of: process.processIdentifier)
    }
    let child = try #require(reader.first)
    #expect(try FileManager.default.contentsOfDirectory(atPath: tmp).count == 1, "the reader's own TMPDIR")
    kill(child, SIGSEGV)
    let ended = finish(process, out, err)
    #expect(!ended.signaled)
    #expect(ended.status == ExitStatus.corruptRecord.rawValue)
    #expect(
      ended.stderr
        == "ferry: the store at \(dir) is damaged: reading it crashed (SIGSEGV); nothing was changed — "
        + "`ferry salvage \(dir) NEW_DIR` recovers what is left\n")
    #expect(try FileManager.default.contentsOfDirectory(atPath: tmp) == [])
  }

  @Test func terminatingFerryEndsItsReaderTooAndRemovesItsTemporaryDirectory() async throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let dir = scratch.path + "/store"
    try await makeStore(at: dir, tasks: 20)
    let tmp = scratch.path + "/tmp"
    try FileManager.default.createDirectory(atPath: tmp, withIntermediateDirectories: false)
    let (process, out, err) = try start(
      productURL("ferry"), ["log", dir, "--follow"], extra: ["TMPDIR": tmp])
    defer { if process.isRunning { process.terminate() } }
    var reader: [Int32] = []
    for _ in 0..<1000 where reader.isEmpty {
      usleep(10_000)
      reader = children(of: process.processIdentifier)
    }
    let child = try #require(reader.first)
    process.terminate()
    let ended = finish(process, out, err)
    // Ended as a plain `ferry log --follow` would be: by the same signal, and quietly.
    #expect(ended.signaled && ended.status == SIGTERM)
    #expect(ended.stderr.isEmpty)
    #expect(isGone(child), "the reader is gone")
    #expect(try FileManager.default.contentsOfDirectory(atPath: tmp) == [])
  }

  @Test func aReaderWhoseFerryIsKilledStopsAndRemovesItsTemporaryDirectory() async throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let dir = scratch.path + "/store"
    try await makeStore(at: dir, tasks: 20)
    let tmp = scratch.path + "/tmp"
    try FileManager.default.createDirectory(atPath: tmp, withIntermediateDirectories: false)
    let (process, out, err) = try start(
      productURL("ferry"), ["log", dir, "--follow"], extra: ["TMPDIR": tmp])
    defer { if process.isRunning { process.terminate() } }
    var reader: [Int32] = []
    for _ in 0..<1000 where reader.isEmpty {
      usleep(10_000)
      reader = children(of: process.processIdentifier)
    }
    let child = try #require(reader.first)
    // Should the reader outlive its parent (the bug this test is for), it holds the output pipe
    // open and `finish` would wait for ever: it is killed after half a minute.
    DispatchQueue.global().asyncAfter(deadline: .now() + 30) {
      if !isGone(child) && processCommand(child)?.contains("ferry") == true { kill(child, SIGKILL) }
    }
    // SIGKILL cannot be forwarded: the reader notices its parent is gone.
    kill(process.processIdentifier, SIGKILL)
    let ended = finish(process, out, err)
    #expect(ended.signaled && ended.status == SIGKILL)
    var gone = false
    for _ in 0..<500 where !gone {
      usleep(10_000)
      gone = isGone(child)
    }
    #expect(gone, "the reader is gone")
    #expect(try FileManager.default.contentsOfDirectory(atPath: tmp) == [])
  }

  @Test func aHealthyStoreReadsTheSameThroughTheReader() async throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let dir = scratch.path + "/store"
    try await makeStore(at: dir, tasks: 50)
    let tmp = scratch.path + "/tmp"
    try FileManager.default.createDirectory(atPath: tmp, withIntermediateDirectories: false)
    for command in readingCommands(dir) {
      let ended = try runFerry(command, tmp: tmp)
      #expect(ended.status == 0, "\(command[0]): \(ended.stderr)")
      #expect(!ended.stdout.isEmpty)
    }
    let replay = try runFerry(["replay", dir, "--until", "9999"], tmp: tmp)
    #expect(replay.status == ExitStatus.badInput.rawValue)
    #expect(replay.stderrLines.count == 1)
    #expect(try FileManager.default.contentsOfDirectory(atPath: tmp) == [])
  }

  // MARK: 2. Never create by accident

  @Test func compactOnAMissingDirectoryRefusesAndCreatesNothing() throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let dir = scratch.path + "/missing"
    let ended = try runFerry(["compact", dir], tmp: scratch.path)
    #expect(ended.status == ExitStatus.noSuchStore.rawValue)
    #expect(ended.stderrLines.count == 1 && ended.stderr.contains(dir), "\(ended.stderr)")
    #expect(!FileManager.default.fileExists(atPath: dir))
    #expect(scratch.entries() == [])
  }

  @Test func compactOnAnEmptyDirectoryRefusesAndCreatesNothing() throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let dir = scratch.path + "/empty"
    try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
    for arguments in [["compact", dir], ["compact", dir, "--copy"]] {
      let ended = try runFerry(arguments, tmp: scratch.path)
      #expect(ended.status == ExitStatus.notAStore.rawValue)
      #expect(ended.stderr.contains("no data.mdb"), "\(ended.stderr)")
      #expect(try FileManager.default.contentsOfDirectory(atPath: dir) == [])
    }
  }

  @Test func compactOnAZeroLengthDataFileRefusesAsDamagedAndCreatesNothing() throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let dir = scratch.path + "/zero"
    try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
    #expect(FileManager.default.createFile(atPath: dir + "/data.mdb", contents: Data()))
    for arguments in [["compact", dir], ["compact", dir, "--copy", "--retention", "0"]] {
      let ended = try runFerry(arguments, tmp: scratch.path)
      #expect(ended.status == ExitStatus.corruptRecord.rawValue)
      #expect(ended.stderrLines.count == 1)
      #expect(ended.stderr.contains("data.mdb is empty (0 bytes)"), "\(ended.stderr)")
      #expect(try FileManager.default.contentsOfDirectory(atPath: dir) == ["data.mdb"])
      #expect(try FileManager.default.attributesOfItem(atPath: dir + "/data.mdb")[.size] as? Int == 0)
    }
  }

  @Test func importRefusesADirectoryWithAZeroLengthDataFile() async throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let source = scratch.path + "/source"
    try await makeStore(at: source, tasks: 5)
    let exported = try runFerry(["export", source], tmp: scratch.path)
    #expect(exported.status == 0)
    let dir = scratch.path + "/zero"
    try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
    #expect(FileManager.default.createFile(atPath: dir + "/data.mdb", contents: Data()))
    let (process, out, err) = try {
      let input = Pipe()
      let started = try start(
        productURL("ferry"), ["import", dir], extra: ["TMPDIR": scratch.path], input: input)
      input.fileHandleForWriting.write(exported.stdout)
      try input.fileHandleForWriting.close()
      return started
    }()
    let ended = finish(process, out, err)
    #expect(ended.status == ExitStatus.badInput.rawValue)
    #expect(ended.stderr.contains("data.mdb is empty (0 bytes)"), "\(ended.stderr)")
    #expect(try FileManager.default.contentsOfDirectory(atPath: dir) == ["data.mdb"])
    #expect(try FileManager.default.attributesOfItem(atPath: dir + "/data.mdb")[.size] as? Int == 0)
    #expect(scratch.entries() == ["source", "zero"], "no temporary directory beside it")
  }

  @Test func compactCopyLeavesTheDataFilePrivateUnderUmask022() async throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let dir = scratch.path + "/store"
    try await makeStore(at: dir, tasks: 40)
    let (process, out, err) = try start(
      URL(fileURLWithPath: "/bin/sh"),
      ["-c", "umask 022; exec \"$0\" compact \"$1\" --retention 0 --copy", productURL("ferry").path, dir])
    let ended = finish(process, out, err)
    #expect(ended.status == 0, "\(ended.stderr)")
    #expect(ended.out.contains("compacted copy swapped in"))
    var info = stat()
    #expect(stat(dir + "/data.mdb", &info) == 0)
    #expect(info.st_mode & 0o777 == 0o600, "mode \(String(info.st_mode & 0o777, radix: 8))")
    #expect(try runFerry(["verify", dir], tmp: scratch.path).status == 0)
  }

  @Test func aCompactCopyRefusedBecauseAnotherProcessHasTheStoreOpenChangesNothing() async throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let dir = scratch.path + "/store"
    try await makeStore(at: dir, tasks: 60)
    let input = Pipe()
    let (holder, holderOut, holderErr, said) = try startHoldingOpen(dir, input: input)
    defer { if holder.isRunning { holder.terminate() } }
    #expect(said.hasPrefix("open "), "\(said)")
    let before = try Data(contentsOf: URL(fileURLWithPath: dir + "/data.mdb"))
    let statsBefore = try runFerry(["stats", dir], tmp: scratch.path).out
    let headerBefore = try runFerry(["export", dir], tmp: scratch.path).out.split(separator: "\n").first
    let refused = try runFerry(["compact", dir, "--retention", "0", "--copy"], tmp: scratch.path)
    #expect(refused.status == ExitStatus.unavailable.rawValue)
    #expect(refused.stderr.contains("another process has the store"), "\(refused.stderr)")
    #expect(refused.stderr.contains("nothing was changed"))
    #expect(try Data(contentsOf: URL(fileURLWithPath: dir + "/data.mdb")) == before, "the data file's bytes")
    let statsAfter = try runFerry(["stats", dir], tmp: scratch.path).out
    // The same log head and the same event count (stats prints both).
    #expect(statsAfter.split(separator: "\n").first == statsBefore.split(separator: "\n").first)
    #expect(statsAfter.contains("events: ") && !statsAfter.contains("compacted through"))
    let headerAfter = try runFerry(["export", dir], tmp: scratch.path).out.split(separator: "\n").first
    #expect(headerAfter != nil && headerAfter == headerBefore, "the export header names the log head")
    try input.fileHandleForWriting.close()
    let holderEnded = finish(holder, holderOut, holderErr)
    #expect(holderEnded.status == 0, "\(holderEnded.stderr)")
    // With the store closed, the same command goes through.
    let done = try runFerry(["compact", dir, "--retention", "0", "--copy"], tmp: scratch.path)
    #expect(done.status == 0, "\(done.stderr)")
  }

  // MARK: 3. Hostile strings

  static let hostile = [
    "line\nforged 999 task.added", "\u{1B}[31mred\u{1B}[0m", "nul\0byte", "cr\rover", "del\u{7F}",
    "csi\u{9B}2J", "bidi\u{202E}txt",
  ]

  @Test func hostileStringsAreEscapedInHumanOutputAndExactInJSON() async throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let dir = scratch.path + "/store"
    do {
      let store = try await FerryStore.open(at: dir)
      defer { store.close() }
      for text in Self.hostile {
        let id = try await store.queue.add(tag: text, payload: ["note": text], dataId: text, groupId: text)
        _ = try await store.queue.recordError(id, message: "error: " + text)
        try await store.ledger.recordFetch(key: text, outcome: .failure("failure: " + text))
      }
      let runner = TaskRunner(queue: store.queue)
      let failing = try await store.queue.add(tag: "fails", payload: ["n": 1])
      runner.register(tag: "fails") { _ in .failed("bad\n\u{1B}[2Jnews\0", retryable: true) }
      _ = try await runner.run(.task(failing))
    }
    let head = UInt64(Self.hostile.count * 3 + 3)
    let tmp = scratch.path
    for arguments in [["log", dir], ["inspect", dir], ["stats", dir], ["replay", dir, "--until", "5"]] {
      let ended = try runFerry(arguments, tmp: tmp)
      #expect(ended.status == 0, "\(arguments[0]): \(ended.stderr)")
      #expect(rawControls(ended.stdout) == [], "\(arguments[0]) printed raw control bytes")
    }
    let log = try runFerry(["log", dir], tmp: tmp)
    let lines = log.out.split(separator: "\n", omittingEmptySubsequences: false).dropLast()
    #expect(UInt64(lines.count) == head, "one line per event")
    for (index, line) in lines.enumerated() {
      #expect(line.hasPrefix("\(index + 1) "), "\(line)")
    }
    #expect(log.out.contains(#"tag line\nforged 999 task.added"#))
    #expect(log.out.contains(#"\u001B[31mred\u001B[0m"#))
    #expect(log.out.contains(#"nul\u0000byte"#))
    #expect(log.out.contains(#"cr\rover"#))
    #expect(log.out.contains(#"bad\n\u001B[2Jnews\u0000"#))
    let inspect = try runFerry(["inspect", dir], tmp: tmp)
    #expect(inspect.out.contains(#"error: del\u007F"#))
    #expect(inspect.out.contains(#"csi\u009B2J"#))
    #expect(inspect.out.contains(#"bidi\u202Etxt"#))

    // JSON stays JSON, and says exactly what the store holds.
    let json = try runFerry(["log", dir, "--json"], tmp: tmp)
    let jsonLines = json.out.split(separator: "\n")
    #expect(UInt64(jsonLines.count) == head)
    #expect(rawControls(json.stdout) == [])
    for line in jsonLines {
      #expect(throws: Never.self) { try JSONSerialization.jsonObject(with: Data(line.utf8)) }
    }
    let report = try JSONDecoder().decode(
      InspectReport.self, from: try runFerry(["inspect", dir, "--json"], tmp: tmp).stdout)
    #expect(report.tasks.map(\.tag).filter { $0 != "fails" } == Self.hostile)
    #expect(report.caches.map(\.key).sorted() == Self.hostile.sorted())
    #expect(Set(report.errors.map(\.message)) == Set(Self.hostile.map { "error: " + $0 }))
    let exported = try runFerry(["export", dir], tmp: tmp)
    #expect(rawControls(exported.stdout) == [])
  }

  @Test func errorMessagesOnStandardErrorAreEscapedToo() throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let dir = scratch.path + "/no\nsuch \u{1B}[31mstore"
    let ended = try runFerry(["inspect", dir], tmp: scratch.path)
    #expect(ended.status == ExitStatus.noSuchStore.rawValue)
    #expect(ended.stderrLines.count == 1, "\(ended.stderr)")
    #expect(ended.stderr.contains(#"no\nsuch \u001B[31mstore"#))
    #expect(rawControls(Data(ended.stderr.utf8)) == [])
  }

  @Test func terminalSafeEscapesEveryControlAndLeavesTheRestAlone() throws {
    #expect(terminalSafe("plain text, ümlaut, 日本, emoji 🚢") == "plain text, ümlaut, 日本, emoji 🚢")
    #expect(terminalSafe("a\nb\rc\td") == #"a\nb\rc\td"#)
    #expect(terminalSafe("\0\u{1}\u{1B}\u{1F}\u{7F}") == #"\u0000\u0001\u001B\u001F\u007F"#)
    #expect(terminalSafe("\u{80}\u{9B}\u{9F}\u{A0}") == "\\u0080\\u009B\\u009F\u{A0}")
    #expect(
      terminalSafe("\u{2028}\u{2029}\u{202E}\u{2066}\u{200F}\u{61C}")
        == #"\u2028\u2029\u202E\u2066\u200F\u061C"#)
    // A JSON line means the same after it: DEL and C1 inside a string become JSON's own escapes.
    let encoded = String(decoding: try JSONEncoder().encode(["k": "x\u{7F}\u{9B}\n\u{1B}y"]), as: UTF8.self)
    let safe = terminalSafe(encoded)
    #expect(rawControls(Data(safe.utf8)) == [])
    #expect(
      try JSONDecoder().decode([String: String].self, from: Data(safe.utf8)) == [
        "k": "x\u{7F}\u{9B}\n\u{1B}y"
      ])
  }

  // MARK: Flags at the ends of Int64

  @Test func secondsFlagsOfInt64MaxSaturateInsteadOfTrapping() async throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let dir = scratch.path + "/store"
    try await makeStore(at: dir, tasks: 10)
    let max = String(Int64.max)
    for arguments in [
      ["inspect", dir, "--max-age", max], ["replay", dir, "--until", "3", "--max-age", max],
      ["compact", dir, "--retention", max],
    ] {
      let ended = try runFerry(arguments, tmp: scratch.path)
      #expect(!ended.signaled && ended.status == 0, "\(arguments[0]): \(ended.status) \(ended.stderr)")
    }
    let negative = try runFerry(["replay", dir, "--max-age", "-1"], tmp: scratch.path)
    #expect(negative.status == ExitStatus.badFlags.rawValue)
  }
}

/// Starts `ferry-test-worker hold-open DIR` (it keeps the store open until `input` ends) and reads
/// its first line, "open HEAD" (what it said, whole, when it failed instead).
func startHoldingOpen(_ dir: String, input: Pipe) throws -> (Process, Pipe, Pipe, said: String) {
  let (holder, holderOut, holderErr) = try start(
    productURL("ferry-test-worker"), ["hold-open", dir], input: input)
  var said = ""
  while !said.contains("\n") {
    let data = holderOut.fileHandleForReading.availableData
    if data.isEmpty { break }
    said += String(decoding: data, as: UTF8.self)
  }
  return (holder, holderOut, holderErr, said)
}
