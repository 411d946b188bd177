import Ferry
import FerryLog
import FerryTools
import Foundation
import TestSupport
import Testing

/// Operator and maintenance commands against stores with odd surroundings: a directory this
/// process may not write to, and the like. Each gets its documented exit status and a message
/// that says what is wrong — never "the disk is failing" for a directory that is only read-only.
@Suite(.timeLimit(.minutes(20)), .serialized) struct ReadOnlyDirectoryTests {
  /// Makes `path` a directory no file can be created in: mode 0500, and for root (whom modes do
  /// not stop) the immutable attribute when the file system has it. False when neither worked.
  static func makeUnwritable(_ path: String) -> Bool {
    chmod(path, 0o500)
    immutable("+i", path)
    let probe = path + "/.probe"
    let fd = open(probe, O_RDWR | O_CREAT | O_EXCL, 0o600)
    guard fd >= 0 else { return true }
    close(fd)
    unlink(probe)
    return false
  }

  /// Sets (`+i`) or clears (`-i`) the immutable attribute of `path` — as root only: modes do not
  /// stop root, and only root may change the attribute.
  static func immutable(_ flag: String, _ path: String) {
    guard geteuid() == 0 else { return }
    let chattr = Process()
    chattr.executableURL = URL(fileURLWithPath: "/usr/bin/chattr")
    chattr.arguments = [flag, path]
    chattr.standardError = FileHandle.nullDevice
    try? chattr.run()
    chattr.waitUntilExit()
  }

  static func makeWritable(_ path: String) {
    immutable("-i", path)
    chmod(path, 0o700)
  }

  /// A store whose directory cannot be written (a read-only mount, an immutable or 0500
  /// directory) and that has no `ferry-open.lock` yet (copied from a backup, say): every command
  /// that writes is refused as unavailable (7, "permission denied"), not as a damaged store or a
  /// failing disk (6), and the read-only commands still read it.
  @Test func aStoreInADirectoryThatCannotBeWrittenIsRefusedAsUnavailableNotAsDamage() async throws {
    let demo = DemoStore()
    do {
      let store = try await FerryStore.open(at: demo.path)
      _ = try await store.queue.add(tag: "job", payload: ["n": 1])
      store.close()
    }
    unlink(demo.path + "/ferry-open.lock")
    defer {
      Self.makeWritable(demo.path)
      demo.remove()
    }
    guard Self.makeUnwritable(demo.path) else {
      print("skipped: this process can write to any directory here")
      return
    }
    for command in [
      ["cancel", demo.path, "1"], ["pause", demo.path], ["compact", demo.path],
      ["compact", demo.path, "--copy"],
    ] {
      let run = try ferry(command)
      #expect(run.status == 7, "\(command[0]): \(run.status) \(run.stderr)")
      #expect(run.stderr.contains("permission denied"), "\(command[0]): \(run.stderr)")
      #expect(!run.stderr.contains("failing"), "\(command[0]): \(run.stderr)")
    }
    let stats = try ferry(["stats", demo.path])
    #expect(stats.status == 0, "\(stats.stderr)")
    #expect(stats.stdout.contains("events: 1"))
  }
}
