import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// How Ferry flushes a file or directory of its own to the medium, and a way for its tests to make
/// a labelled flush fail.
///
/// On Apple platforms `fsync` leaves the data in the drive's cache: only `F_FULLFSYNC` reaches the
/// medium (`fsync` is the fallback where a file system refuses it). Elsewhere `fdatasync` (data and
/// the size that finds it) or `fsync` (everything, for a directory or a file just made).
///
/// `package` access: only Ferry's modules and tests name it. A failure is armed only by a process
/// that asks for it (the test worker calls ``armFromEnvironment()``): `FERRY_FAIL_FLUSH=<label>`
/// makes every flush with that label fail with `EIO` without touching the file.
package enum DiskFlush {
  /// `ferry compact --copy`: the compacted copy, before it is renamed over `data.mdb`.
  package static let compactCopy = "compact.copy"
  /// `ferry compact --copy`: the store's directory, after the rename.
  package static let compactDirectory = "compact.directory"

  private static let isArmed = Atomic<Bool>(false)
  private static let failing = Mutex<String?>(nil)

  /// Reads `FERRY_FAIL_FLUSH` and arms the label it names (nothing when unset or empty). Only the
  /// test worker calls this.
  package static func armFromEnvironment() {
    guard let raw = getenv("FERRY_FAIL_FLUSH") else { return }
    let label = String(cString: raw)
    guard !label.isEmpty else { return }
    failing.withLock { $0 = label }
    isArmed.store(true, ordering: .releasing)
  }

  /// Flushes the open file `fd` to the medium; nil when it got there, else the `errno`.
  /// `dataOnly`: the file's data and size, not its times (`fdatasync` off Apple platforms).
  package static func flush(_ fd: Int32, dataOnly: Bool = false, label: String? = nil) -> Int32? {
    if let label, isArmed.load(ordering: .acquiring), failing.withLock({ $0 }) == label { return EIO }
    #if canImport(Darwin)
      if fcntl(fd, F_FULLFSYNC) == 0 || fsync(fd) == 0 { return nil }
    #else
      if (dataOnly ? fdatasync(fd) : fsync(fd)) == 0 { return nil }
    #endif
    return errno
  }

  /// Flushes the entries of the directory at `path` (a file created, renamed or removed in it);
  /// nil when they got to the medium, else the `errno` (of the open or of the flush).
  package static func flushDirectory(_ path: String, label: String? = nil) -> Int32? {
    #if canImport(Glibc)
      let fd = Glibc.open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    #else
      let fd = Darwin.open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    #endif
    if fd < 0 { return errno }
    defer { close(fd) }
    return flush(fd, label: label)
  }
}
