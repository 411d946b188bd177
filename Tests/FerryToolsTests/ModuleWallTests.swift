import Foundation
import Testing

/// Ferry's crash points (the kill switch of its crash tests) are armed only in the crash worker:
/// the environment variable that kills the worker at a labelled point does nothing to `ferry`,
/// an ordinary program linking Ferry. (`Tools/try-install.sh` checks the compile-time side: an app
/// cannot name `CrashPoint`.)
@Suite(.timeLimit(.minutes(20))) struct ModuleWallTests {
  @Test func theCrashPointVariableKillsOnlyTheCrashWorker() throws {
    let armed = ["FERRY_CRASH_POINT": "append.beforeCommit", "FERRY_CRASH_AFTER": "2"]
    let app = DemoStore()
    defer { app.remove() }
    let demo = try ferry(["demo", "--seed", "3", "--dir", app.path], environment: armed)
    #expect(demo.status == 0, "\(demo.stderr)")
    #expect(demo.stdout.contains("verify:"))

    let worker = DemoStore()
    defer { worker.remove() }
    let killed = try ferry(
      ["workload", worker.path, "1", "20"], environment: armed, executable: "ferry-crash-worker")
    #expect(killed.status == SIGKILL, "the crash worker was not killed at its armed point: \(killed.status)")
  }
}
