import Foundation
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Runs a command that reads a possibly damaged store in a child process, so that a crash inside
/// LMDB (a `SIGBUS` or `SIGSEGV` on a truncated or scribbled-over file, which no check before
/// reading can rule out entirely) reaches the user as a damaged store with exit status 6, never as
/// a signal.
///
/// The `ferry` binary re-executes itself with the same arguments; ``variable`` in the child's
/// environment marks it as the child, which does the work, and names its lifeline to the parent. The
/// child inherits standard input, output and error. Its temporary directory (`TMPDIR`, where
/// `verify` and `replay` make their scratch environments) is a private one the parent creates and
/// removes on every way out, the child's crash included. The parent forwards `SIGINT`, `SIGTERM`
/// and `SIGHUP` to the child; a child that finds its parent gone removes that directory and exits.
package enum Containment {
  /// The environment variable that marks the contained child (`lifeline:FD`).
  package static let variable = "FERRY_CONTAINED"
  /// How the private temporary directories' names begin.
  package static let directoryPrefix = "ferry-contained-"

  /// Whether this process is the contained child of a `ferry` parent: ``variable`` names the
  /// read end of its lifeline, a pipe it inherited open.
  package static var isContainedChild: Bool { lifeline != nil }

  /// The read end of the pipe whose write end only the parent holds: it reads end-of-file once
  /// the parent is gone, however it went (a parent killed by `SIGKILL` stays a zombie, and the
  /// child's parent pid unchanged, until someone reaps it; its descriptors close at once).
  private static var lifeline: Int32? {
    guard let value = getenv(variable).map({ String(cString: $0) }), value.hasPrefix(lifelinePrefix),
      let fd = Int32(value.dropFirst(lifelinePrefix.count)), fd >= 0
    else { return nil }
    var info = stat()
    guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFIFO,
      fcntl(fd, F_GETFL) & O_ACCMODE == O_RDONLY
    else { return nil }
    return fd
  }

  private static let lifelinePrefix = "lifeline:"

  /// Signals that end the child by a crash: the store it read is reported as damaged.
  static let crashSignals: Set<Int32> = [SIGSEGV, SIGBUS, SIGILL, SIGTRAP, SIGFPE, SIGABRT, SIGSYS]

  /// In the child: watches the parent, and when it is gone (killed by `SIGKILL`, which cannot be
  /// forwarded) removes the private temporary directory and exits, so that no reader outlives it.
  package static func watchParent() {
    guard let fd = lifeline else { return }
    let thread = Thread {
      var byte: UInt8 = 0
      while true {
        let count = read(fd, &byte, 1)
        if count == 0 { break }  // the parent is gone
        if count < 0 && errno != EINTR { return }  // cannot watch: go on unwatched
      }
      if let directory = getenv("TMPDIR").map({ String(cString: $0) }),
        URL(fileURLWithPath: directory).lastPathComponent.hasPrefix(directoryPrefix)
      {
        try? FileManager.default.removeItem(atPath: directory)
      }
      _exit(128 + SIGHUP)
    }
    thread.start()
  }

  /// In the parent: runs this same command (`CommandLine.arguments`) in a child process and waits
  /// for it. Returns the status to exit with: the child's own, or 6 (with one line on standard
  /// error) when it died by a crash. When the child died by a signal this process forwarded (the
  /// user's Ctrl-C), or by `SIGPIPE` (a reader that went away), this process ends by the same
  /// signal and does not return.
  package static func runInChild(store: String) -> Int32 {
    let scratch = makePrivateDirectory()
    defer { if let scratch { try? FileManager.default.removeItem(atPath: scratch) } }
    // The lifeline: the child inherits the read end; the write end, closed on exec, is this
    // process's alone, and closes when it ends, however it ends.
    var ends: [Int32] = [-1, -1]
    guard pipe(&ends) == 0 else {
      FileHandleOutput.standardError(
        "ferry: cannot start a process to read the store in: \(String(cString: strerror(errno)))")
      return ExitStatus.storageError.rawValue
    }
    _ = fcntl(ends[1], F_SETFD, FD_CLOEXEC)
    defer { close(ends[1]) }
    var environment = ProcessInfo.processInfo.environment
    environment[variable] = lifelinePrefix + String(ends[0])
    if let scratch { environment["TMPDIR"] = scratch }
    // The runtime's crash report would bury the one line that says what happened.
    if environment["SWIFT_BACKTRACE"] == nil { environment["SWIFT_BACKTRACE"] = "enable=no" }

    Forwarding.install()
    defer { Forwarding.uninstall() }
    let child: pid_t
    switch spawn(arguments: CommandLine.arguments, environment: environment) {
    case .success(let pid): child = pid
    case .failure(let message):
      close(ends[0])
      FileHandleOutput.standardError("ferry: \(terminalSafe(message))")
      return ExitStatus.storageError.rawValue
    }
    close(ends[0])
    Forwarding.child.store(child, ordering: .sequentiallyConsistent)
    // A signal that came before the child's pid was known is passed on now.
    let early = Forwarding.received.load(ordering: .sequentiallyConsistent)
    if early != 0 { kill(child, early) }

    var status: Int32 = 0
    while waitpid(child, &status, 0) < 0 {
      guard errno == EINTR else {
        FileHandleOutput.standardError(
          "ferry: lost track of the process reading the store: \(String(cString: strerror(errno)))")
        return ExitStatus.storageError.rawValue
      }
    }
    Forwarding.child.store(0, ordering: .sequentiallyConsistent)

    let termination = status & 0x7f
    if termination == 0 { return (status >> 8) & 0xff }  // exited
    let signal = termination
    let forwarded = Forwarding.received.load(ordering: .sequentiallyConsistent)
    if crashSignals.contains(signal) && signal != forwarded {
      FileHandleOutput.standardError(
        "ferry: the store at \(terminalSafe(store)) is damaged: reading it crashed (\(name(of: signal))); "
          + "nothing was changed — `ferry salvage \(terminalSafe(store)) NEW_DIR` recovers what is left")
      return ExitStatus.corruptRecord.rawValue
    }
    if signal == forwarded || signal == SIGPIPE {
      // Ended as the child was: the same signal, after cleaning up.
      if let scratch { try? FileManager.default.removeItem(atPath: scratch) }
      Forwarding.uninstall()
      setSignalHandler(signal, nil)
      // To the process, unblocked here: this may be a worker thread that blocks signals, which
      // would keep a `raise` pending for ever.
      var set = sigset_t()
      sigemptyset(&set)
      sigaddset(&set, signal)
      pthread_sigmask(SIG_UNBLOCK, &set, nil)
      kill(getpid(), signal)
      usleep(100_000)  // delivered to whichever thread takes it; this one waits
      return 128 + signal
    }
    FileHandleOutput.standardError(
      "ferry: reading the store at \(terminalSafe(store)) was ended by \(name(of: signal)) from outside; "
        + "nothing was changed")
    return 128 + signal
  }

  /// A fresh directory of mode 0700 in the temporary directory, or nil when none can be made (the
  /// child then uses the temporary directory itself).
  private static func makePrivateDirectory() -> String? {
    var base = NSTemporaryDirectory()
    while base.count > 1 && base.hasSuffix("/") { base.removeLast() }
    var template = Array((base + "/" + directoryPrefix + "XXXXXX").utf8CString)
    let made = template.withUnsafeMutableBufferPointer { buffer -> Bool in
      guard let pointer = buffer.baseAddress else { return false }
      return mkdtemp(pointer) != nil
    }
    guard made else { return nil }
    return String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
  }

  private enum Spawned {
    case success(pid_t)
    case failure(String)
  }

  /// Starts this executable again with `arguments` (the first is the child's `argv[0]`).
  private static func spawn(arguments: [String], environment: [String: String]) -> Spawned {
    // This very executable, even if its file was replaced since; where there is no /proc, the
    // path it was started from.
    var executable = "/proc/self/exe"
    if access(executable, X_OK) != 0 {
      executable = Bundle.main.executablePath ?? CommandLine.arguments[0]
    }
    let argv = arguments.map { strdup($0) } + [nil]
    let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
    defer {
      for pointer in argv { free(pointer) }
      for pointer in envp { free(pointer) }
    }
    var pid: pid_t = 0
    let result = posix_spawn(&pid, executable, nil, nil, argv, envp)
    guard result == 0 else {
      return .failure("cannot start a process to read the store in: \(String(cString: strerror(result)))")
    }
    return .success(pid)
  }

  /// A signal's name, as people know it.
  static func name(of signal: Int32) -> String {
    let names: [Int32: String] = [
      SIGSEGV: "SIGSEGV", SIGBUS: "SIGBUS", SIGILL: "SIGILL", SIGTRAP: "SIGTRAP", SIGFPE: "SIGFPE",
      SIGABRT: "SIGABRT", SIGSYS: "SIGSYS", SIGKILL: "SIGKILL", SIGTERM: "SIGTERM", SIGINT: "SIGINT",
      SIGHUP: "SIGHUP", SIGPIPE: "SIGPIPE", SIGQUIT: "SIGQUIT", SIGUSR1: "SIGUSR1", SIGUSR2: "SIGUSR2",
    ]
    return names[signal] ?? "signal \(signal)"
  }
}

/// The child being waited for and the last signal passed on to it, read by the signal handler.
private enum Forwarding {
  static let child = Atomic<Int32>(0)
  static let received = Atomic<Int32>(0)
  static let signals = [SIGINT, SIGTERM, SIGHUP]

  static func install() {
    // Initialized here, not first in a signal handler.
    _ = child.load(ordering: .relaxed)
    _ = received.load(ordering: .relaxed)
    for signal in signals {
      setSignalHandler(signal) { signal in
        Forwarding.received.store(signal, ordering: .sequentiallyConsistent)
        let pid = Forwarding.child.load(ordering: .sequentiallyConsistent)
        if pid > 0 { kill(pid, signal) }
      }
    }
  }

  static func uninstall() {
    for signal in signals { setSignalHandler(signal, nil) }
  }
}

/// `signal(2)` (nil restores the default action), named apart from the variables called `signal`.
@discardableResult
private func setSignalHandler(
  _ number: Int32, _ handler: (@convention(c) (Int32) -> Void)?
) -> (@convention(c) (Int32) -> Void)? {
  signal(number, handler)
}

/// One line on standard error.
enum FileHandleOutput {
  static func standardError(_ line: String) { FileHandle.standardError.write(Data((line + "\n").utf8)) }
}
