import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// The highest sequence number a store has acknowledged, kept *outside* LMDB's snapshot in the
/// small file `ferry-head` beside `data.mdb`, so that a commit LMDB loses — a damaged meta page
/// that makes LMDB pick an older state, a data file replaced by an older copy — is noticed at the
/// next open instead of silently giving its sequence numbers out again (`storage-layout.md` §9).
///
/// Layout, 36 bytes: ASCII `FERRYHD1`, the store id (16 bytes; all zero while the store is being
/// created), the head (u64 big-endian), CRC-32C of the 32 bytes before it (u32 big-endian).
///
/// It costs no extra flush: it is rewritten (one `pwrite` within one disk sector) after each
/// durable commit that raised the head, before the callers are acknowledged, and never `fsync`ed.
/// After a power cut it may therefore hold an older head than the log, never a newer one than
/// the log durably holds — so a log below the mark has lost commits, and a mark below the log
/// means nothing. Two processes writing the same store each raise it to their own heads; a
/// stale, lower value written late only weakens the check, and is raised by the next commit.
final class HeadMark: Sendable {
  static let fileName = "ferry-head"
  static let magic: [UInt8] = Array("FERRYHD1".utf8)
  static let length = 36
  static let creatingId = [UInt8](repeating: 0, count: 16)

  struct Contents: Equatable {
    var storeId: [UInt8]
    var head: UInt64

    var isCreating: Bool { storeId == HeadMark.creatingId }

    var bytes: [UInt8] {
      var bytes = HeadMark.magic + storeId + head.bigEndianBytes
      bytes += CRC32C.checksum(bytes).bigEndianBytes
      return bytes
    }

    init(storeId: [UInt8], head: UInt64) {
      self.storeId = storeId
      self.head = head
    }

    init?(bytes: [UInt8]) {
      guard bytes.count == HeadMark.length, Array(bytes[0..<8]) == HeadMark.magic,
        let stored = UInt32(bigEndianBytes: bytes[32..<36]), stored == CRC32C.checksum(bytes[0..<32]),
        let head = UInt64(bigEndianBytes: bytes[24..<32])
      else { return nil }
      self.init(storeId: Array(bytes[8..<24]), head: head)
    }
  }

  enum Found: Equatable {
    case missing
    /// Present but torn or damaged: it says nothing.
    case unreadable
    case mark(Contents)
  }

  static func path(in directory: String) -> String { directory + "/" + fileName }

  /// Reads the mark in `directory`.
  static func read(in directory: String) -> Found {
    let fd = open(path(in: directory), O_RDONLY | O_CLOEXEC | O_NONBLOCK)
    guard fd >= 0 else { return errno == ENOENT ? .missing : .unreadable }
    defer { close(fd) }
    guard isRegularFile(fd) else { return .unreadable }
    var buffer = [UInt8](repeating: 0, count: length + 1)
    let got = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, length + 1, 0) }
    guard got == length, let contents = Contents(bytes: Array(buffer[0..<length])) else { return .unreadable }
    return .mark(contents)
  }

  /// Writes `contents` into the mark in `directory` (created with mode 0600 when missing), without
  /// a flush. Best effort: a failure to write the mark never fails the caller's commit.
  @discardableResult
  static func write(_ contents: Contents, in directory: String) -> Bool {
    let fd = open(path(in: directory), O_RDWR | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0o600)
    guard fd >= 0 else { return false }
    defer { close(fd) }
    guard isRegularFile(fd) else { return false }
    return write(contents, to: fd)
  }

  private static func write(_ contents: Contents, to fd: Int32) -> Bool {
    let bytes = contents.bytes
    let wrote = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, length, 0) }
    return wrote == length
  }

  let storeId: [UInt8]
  /// The mark file, open for the log's lifetime (-1 when it could not be opened).
  private let fd: Int32
  /// The highest head this process has written (so a commit that did not raise it writes nothing).
  private let written = Mutex<UInt64>(0)
  /// The mark's first 24 bytes for this store (magic and store id) and their CRC, made once:
  /// ``advance(to:)`` runs after every commit and allocates nothing.
  private let prefix: [UInt8]
  private let prefixCRC: UInt32

  init(directory: String, storeId: [UInt8]) {
    self.storeId = storeId
    prefix = Self.magic + storeId
    prefixCRC = CRC32C.checksum(prefix)
    let opened = open(Self.path(in: directory), O_RDWR | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0o600)
    if opened >= 0 && !Self.isRegularFile(opened) {
      close(opened)
      fd = -1
    } else {
      fd = opened
    }
  }

  /// Only a regular file is a mark: a FIFO or device put in its place is never read or written
  /// (a FIFO would block the open for ever).
  static func isRegularFile(_ fd: Int32) -> Bool {
    var info = stat()
    return fstat(fd, &info) == 0 && (info.st_mode & S_IFMT) == S_IFREG
  }

  /// Whether ``closeFile()`` closed `fd` (read and set under `written`'s lock).
  private let fileClosed = Atomic<Bool>(false)

  /// Closes the mark file, once: at close or suspension of the log, once its writer stopped (a
  /// suspended process keeps no file of the store open). Later advances write nothing.
  func closeFile() {
    written.withLock { _ in
      if fd >= 0 && !fileClosed.exchange(true, ordering: .relaxed) { close(fd) }
    }
  }

  deinit {
    if fd >= 0 && !fileClosed.load(ordering: .relaxed) { close(fd) }
  }

  /// Raises the mark to `head` unless it already says as much (another process may have raised
  /// it further).
  func advance(to head: UInt64) {
    guard fd >= 0 else { return }
    written.withLock { written in
      guard head > written, !fileClosed.load(ordering: .relaxed) else { return }
      withUnsafeTemporaryAllocation(byteCount: Self.length, alignment: 8) { buffer in
        let got = pread(fd, buffer.baseAddress, Self.length, 0)
        if got == Self.length, let current = markedHead(UnsafeRawBufferPointer(buffer)), current >= head {
          written = current
          return
        }
        prefix.withUnsafeBytes { buffer.copyMemory(from: $0) }
        let big = head.bigEndian
        let crc = withUnsafeBytes(of: big) { raw in
          UnsafeMutableRawBufferPointer(rebasing: buffer[24..<32]).copyMemory(from: raw)
          return CRC32C.update(prefixCRC, raw)
        }
        withUnsafeBytes(of: crc.bigEndian) {
          UnsafeMutableRawBufferPointer(rebasing: buffer[32..<36]).copyMemory(from: $0)
        }
        if pwrite(fd, buffer.baseAddress, Self.length, 0) == Self.length { written = head }
      }
    }
  }

  /// The head a mark read from the file holds when it is intact and this store's (its first 24
  /// bytes are ``prefix`` and its CRC matches), else nil: the rule of ``Contents/init(bytes:)``.
  private func markedHead(_ mark: UnsafeRawBufferPointer) -> UInt64? {
    // memcmp: the generic comparison of an array with a buffer's slice cost each commit some 600
    // instructions.
    guard mark.count == Self.length, let base = mark.baseAddress,
      prefix.withUnsafeBytes({ own in
        own.count == 24 && own.baseAddress.map { memcmp($0, base, 24) == 0 } == true
      })
    else { return nil }
    let headBytes = UnsafeRawBufferPointer(rebasing: mark[24..<32])
    guard let head = UInt64(bigEndianBytes: headBytes), let stored = UInt32(bigEndianBytes: mark[32..<36]),
      stored == CRC32C.update(prefixCRC, headBytes)
    else { return nil }
    return head
  }
}

extension EventLog {
  /// The highest sequence number the store in `directory` acknowledged, from its head mark
  /// (`storage-layout.md` §9); nil when it has no readable mark. For tools that read a damaged
  /// store's files without opening it (salvage).
  public static func acknowledgedHead(in directory: String) -> UInt64? {
    if case .mark(let contents) = HeadMark.read(in: directory), !contents.isCreating { return contents.head }
    return nil
  }
}
