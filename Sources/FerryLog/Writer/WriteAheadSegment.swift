import LMDB
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// Ferry's write-ahead segment: one flush per group commit instead of LMDB's two
/// (`Specs/one-sync-commit.md`, which this follows section by section).
///
/// The file `ferry-segment` beside `data.mdb`: two header slots (bytes 0 and 512), then frames
/// from byte 4096. A header names a checkpoint — an LMDB state made durable by a flush of the
/// data file, with a copy of both its meta pages — and the salt of the frames written after it.
/// A frame holds the sealed records of one group commit; its CRC covers the previous frame's CRC,
/// so frames chain and a frame from an earlier cycle, or left over from a commit that never
/// happened, ends the chain.
///
/// All functions run with LMDB's writer lock held (inside a write transaction) or with the store
/// open by no other process (recovery, under ``StoreOpenLock``).
enum WriteAheadSegment {
  static let fileName = "ferry-segment"
  static let headerMagic: [UInt8] = Array("FERRYWS1".utf8)
  static let slotSize = 512
  static let framesStart = 4096
  /// The size a new segment file is written to (zeros, so that a frame's flush never has to
  /// change the file's size or allocate blocks).
  static let initialSize = 8 << 20
  /// "FWSF"
  static let frameMagic: UInt32 = 0x4657_5346
  static let frameHeaderSize = 32
  /// Bytes of each meta page kept in a header: LMDB's 16-byte page header and its meta fields
  /// up to and including the transaction id (see ``DataFileCheck``).
  static let metaSpan = 152

  static func path(in directory: String) -> String { directory + "/" + fileName }

  static func exists(in directory: String) -> Bool {
    var info = stat()
    return lstat(path(in: directory), &info) == 0
  }

  /// A checkpoint, as a header slot records it.
  struct Header: Equatable {
    /// Raised by one at every checkpoint; the valid slot with the highest counter is current.
    var counter: UInt64
    /// Random per checkpoint: frames written after it carry it.
    var salt: UInt64
    /// The log's head in the checkpointed state.
    var checkpointHead: UInt64
    /// LMDB's transaction id of the checkpointed state.
    var checkpointTransaction: UInt64
    var storeId: [UInt8]
    var pageSize: UInt32
    /// The first ``WriteAheadSegment/metaSpan`` bytes of meta page 0, then of meta page 1.
    var metas: [UInt8]

    static let encodedLength = 8 + 8 + 8 + 8 + 8 + 16 + 4 + 4 + 2 * WriteAheadSegment.metaSpan + 4

    var bytes: [UInt8] {
      var out = WriteAheadSegment.headerMagic
      out += counter.bigEndianBytes + salt.bigEndianBytes + checkpointHead.bigEndianBytes
      out += checkpointTransaction.bigEndianBytes + storeId + pageSize.bigEndianBytes
      out += UInt32(metas.count).bigEndianBytes + metas
      out += CRC32C.checksum(out).bigEndianBytes
      return out
    }

    init(
      counter: UInt64, salt: UInt64, checkpointHead: UInt64, checkpointTransaction: UInt64, storeId: [UInt8],
      pageSize: UInt32, metas: [UInt8]
    ) {
      self.counter = counter
      self.salt = salt
      self.checkpointHead = checkpointHead
      self.checkpointTransaction = checkpointTransaction
      self.storeId = storeId
      self.pageSize = pageSize
      self.metas = metas
    }

    init?(bytes: ArraySlice<UInt8>) {
      let b = Array(bytes)
      guard b.count >= Self.encodedLength, Array(b[0..<8]) == WriteAheadSegment.headerMagic,
        let metaCount = UInt32(bigEndianBytes: b[60..<64]), Int(metaCount) == 2 * WriteAheadSegment.metaSpan,
        let crc = UInt32(bigEndianBytes: b[Self.encodedLength - 4..<Self.encodedLength]),
        crc == CRC32C.checksum(b[0..<Self.encodedLength - 4]),
        let counter = UInt64(bigEndianBytes: b[8..<16]), let salt = UInt64(bigEndianBytes: b[16..<24]),
        let head = UInt64(bigEndianBytes: b[24..<32]), let transaction = UInt64(bigEndianBytes: b[32..<40]),
        let pageSize = UInt32(bigEndianBytes: b[56..<60]), (512...65536).contains(pageSize)
      else { return nil }
      self.init(
        counter: counter, salt: salt, checkpointHead: head, checkpointTransaction: transaction,
        storeId: Array(b[40..<56]), pageSize: pageSize, metas: Array(b[64..<64 + Int(metaCount)]))
    }

    /// The chain value the first frame after this checkpoint continues from.
    var seed: UInt32 { UInt32(truncatingIfNeeded: salt ^ (salt >> 32)) }
  }

  /// Where the next frame goes: kept in the `meta` database (key `segment`) by each frame's own
  /// transaction, so it is exactly as current as the log it describes.
  struct Cursor: Equatable {
    var counter: UInt64
    var offset: UInt64
    var chain: UInt32

    var bytes: [UInt8] { counter.bigEndianBytes + offset.bigEndianBytes + chain.bigEndianBytes }

    init(counter: UInt64, offset: UInt64, chain: UInt32) {
      self.counter = counter
      self.offset = offset
      self.chain = chain
    }

    init?(bytes: [UInt8]) {
      guard bytes.count == 20, let counter = UInt64(bigEndianBytes: bytes[0..<8]),
        let offset = UInt64(bigEndianBytes: bytes[8..<16]), let chain = UInt32(bigEndianBytes: bytes[16..<20])
      else { return nil }
      self.init(counter: counter, offset: offset, chain: chain)
    }
  }

  static let cursorKey: [UInt8] = Array("segment".utf8)

  // MARK: - File access

  /// Opens the segment file read-write (or read-only); only a regular file is accepted.
  static func open(in directory: String, readOnly: Bool) throws -> Int32 {
    let fd = systemOpen(path(in: directory), (readOnly ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_NONBLOCK)
    guard fd >= 0 else {
      let code = errno
      throw FerryLogError.damagedStore(
        path: directory,
        reason: "its write-ahead segment cannot be opened (\(String(cString: strerror(code))))")
    }
    var info = stat()
    guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else {
      close(fd)
      throw FerryLogError.damagedStore(
        path: directory, reason: "its write-ahead segment is not a regular file")
    }
    return fd
  }

  static func closeFile(_ fd: Int32) { close(fd) }

  static func size(_ fd: Int32) -> Int {
    var info = stat()
    return fstat(fd, &info) == 0 ? Int(info.st_size) : 0
  }

  /// Reads exactly `count` bytes at `offset`, or fewer at the end of the file.
  static func read(_ fd: Int32, at offset: Int, count: Int) throws -> [UInt8] {
    var buffer = [UInt8](repeating: 0, count: count)
    var done = 0
    while done < count {
      // Inside the loop the buffer holds at least one byte, so it has an address.
      let got = buffer.withUnsafeMutableBytes { raw -> Int in
        guard let base = raw.baseAddress else { return 0 }
        return pread(fd, base + done, count - done, off_t(offset + done))
      }
      if got < 0 {
        if errno == EINTR { continue }
        let code = errno
        throw FerryLogError.ioError(path: "ferry-segment", detail: String(cString: strerror(code)))
      }
      if got == 0 { break }
      done += got
    }
    return Array(buffer[0..<done])
  }

  static func write(_ fd: Int32, _ bytes: [UInt8], at offset: Int, directory: String) throws {
    var done = 0
    while done < bytes.count {
      let wrote = bytes.withUnsafeBytes { raw -> Int in
        guard let base = raw.baseAddress else { return 0 }
        return pwrite(fd, base + done, bytes.count - done, off_t(offset + done))
      }
      if wrote < 0 {
        if errno == EINTR { continue }
        throw ioFailure(errno, directory: directory, doing: "writing the write-ahead segment")
      }
      done += wrote
    }
  }

  /// Flushes the file's data to the medium (`fdatasync`; `F_FULLFSYNC` on Apple platforms).
  static func flush(_ fd: Int32, directory: String, what: String = "the write-ahead segment") throws {
    if let code = DiskFlush.flush(fd, dataOnly: true) {
      throw ioFailure(code, directory: directory, doing: "flushing \(what)")
    }
  }

  static func ioFailure(_ code: Int32, directory: String, doing: String) -> FerryLogError {
    switch code {
    case ENOSPC: return .diskFull(path: directory)
    case EDQUOT: return .quotaExceeded(path: directory)
    // A directory or file this process may not write (a read-only mount, modes, an immutable
    // attribute) is a refusal, not a failing device: the store is intact and unavailable here.
    case EACCES, EPERM, EROFS:
      return .permissionDenied(path: directory, detail: "\(doing): \(String(cString: strerror(code)))")
    default: return .ioError(path: directory, detail: "\(doing): \(String(cString: strerror(code)))")
    }
  }

  /// The current header: the valid slot with the highest counter (nil when neither is valid).
  static func readHeader(_ fd: Int32) throws -> Header? {
    let bytes = try read(fd, at: 0, count: 2 * slotSize)
    let slots = [0, slotSize].compactMap { start -> Header? in
      guard bytes.count >= start + Header.encodedLength else { return nil }
      return Header(bytes: bytes[start..<start + Header.encodedLength])
    }
    return slots.max { $0.counter < $1.counter }
  }

  /// The current header, or `damagedStore` when neither slot is intact.
  static func currentHeader(_ fd: Int32, directory: String) throws -> Header {
    guard let header = try readHeader(fd) else {
      throw FerryLogError.damagedStore(
        path: directory, reason: "neither header slot of its write-ahead segment is intact")
    }
    return header
  }

  /// Writes `header` into its slot (`counter` & 1, so the other slot keeps the previous
  /// checkpoint until this one is durable) and flushes it.
  static func writeHeader(_ header: Header, to fd: Int32, directory: String) throws {
    try write(fd, header.bytes, at: Int(header.counter & 1) * slotSize, directory: directory)
    try flush(fd, directory: directory)
  }

  // MARK: - Meta pages of data.mdb

  static func dataFile(in directory: String) -> String { directory + "/data.mdb" }

  /// The first ``metaSpan`` bytes of both meta pages of the data file, as the file holds them now.
  static func readMetas(in directory: String, pageSize: Int) throws -> [UInt8] {
    let fd = systemOpen(dataFile(in: directory), O_RDONLY | O_CLOEXEC | O_NONBLOCK)
    guard fd >= 0 else {
      let code = errno
      throw ioFailure(code, directory: directory, doing: "reading the data file's meta pages")
    }
    defer { close(fd) }
    let first = try read(fd, at: 0, count: metaSpan)
    let second = try read(fd, at: pageSize, count: metaSpan)
    guard first.count == metaSpan, second.count == metaSpan else {
      throw FerryLogError.damagedStore(
        path: directory, reason: "its data file is too short to hold two meta pages")
    }
    return first + second
  }

  /// The transaction id of the newer of the two metas in `metas` (``readMetas(in:pageSize:)``).
  static func newestTransaction(_ metas: [UInt8]) -> UInt64 {
    func txnid(_ start: Int) -> UInt64 {
      metas[start + 144..<start + 152].withUnsafeBytes { $0.loadUnaligned(as: UInt64.self) }
    }
    return max(txnid(0), txnid(metaSpan))
  }

  /// Puts the checkpoint's meta pages back into the data file and flushes it, when they differ
  /// from what it holds — after a power cut the newest meta may name pages that never reached
  /// the disk, or pages reused since. The checkpoint's own pages were flushed before its header
  /// was written and none was reused after (a pin held them), so LMDB then opens that state.
  /// Returns whether it wrote anything.
  /// `current`: the data file's meta pages as ``readMetas(in:pageSize:)`` read them.
  static func restoreMetas(_ header: Header, current: [UInt8], in directory: String) throws -> Bool {
    let pageSize = Int(header.pageSize)
    if current == header.metas { return false }
    let fd = systemOpen(dataFile(in: directory), O_RDWR | O_CLOEXEC | O_NONBLOCK)
    guard fd >= 0 else {
      let code = errno
      throw ioFailure(code, directory: directory, doing: "opening the data file to restore its checkpoint")
    }
    defer { close(fd) }
    try write(fd, Array(header.metas[0..<metaSpan]), at: 0, directory: directory)
    try write(fd, Array(header.metas[metaSpan...]), at: pageSize, directory: directory)
    try flush(fd, directory: directory, what: "the data file's restored meta pages")
    return true
  }

  // MARK: - Frames

  /// Encodes one frame: its header (magic, record count, salt, first sequence, body length, CRC)
  /// and the records, each after its length. The CRC covers `chain`, the header's first 28 bytes
  /// and the body.
  static func frame(
    records: [[UInt8]], first: UInt64, salt: UInt64, chain: UInt32
  ) -> (bytes: [UInt8], crc: UInt32) {
    var body: [UInt8] = []
    body.reserveCapacity(records.reduce(0) { $0 + $1.count + 4 })
    for record in records {
      body += UInt32(record.count).bigEndianBytes
      body += record
    }
    var out = frameMagic.bigEndianBytes + UInt32(records.count).bigEndianBytes + salt.bigEndianBytes
    out += first.bigEndianBytes + UInt32(body.count).bigEndianBytes
    var crc = CRC32C.checksum(chain.bigEndianBytes)
    crc = out.withUnsafeBytes { CRC32C.update(crc, $0) }
    crc = body.withUnsafeBytes { CRC32C.update(crc, $0) }
    out += crc.bigEndianBytes
    out += body
    return (out, crc)
  }

  /// What a scan found after a checkpoint: the records of the chained frames, in order, and where
  /// the chain ends.
  struct Scan {
    var records: [(sequence: UInt64, bytes: [UInt8])] = []
    var end: UInt64
    var chain: UInt32
    var frames = 0
  }

  /// Reads the frames written after `header`'s checkpoint, stopping at the first that does not
  /// continue the chain (wrong magic, salt, sequence or CRC: the end of what was written).
  static func scan(_ fd: Int32, header: Header) throws -> Scan {
    let fileSize = size(fd)
    var scan = Scan(end: UInt64(framesStart), chain: header.seed)
    var expected = header.checkpointHead &+ 1
    var offset = framesStart
    while offset + frameHeaderSize <= fileSize {
      let head = try read(fd, at: offset, count: frameHeaderSize)
      guard head.count == frameHeaderSize, UInt32(bigEndianBytes: head[0..<4]) == frameMagic,
        let count = UInt32(bigEndianBytes: head[4..<8]), count > 0,
        UInt64(bigEndianBytes: head[8..<16]) == header.salt,
        UInt64(bigEndianBytes: head[16..<24]) == expected,
        let length = UInt32(bigEndianBytes: head[24..<28]),
        let stored = UInt32(bigEndianBytes: head[28..<32]),
        offset + frameHeaderSize + Int(length) <= fileSize
      else { break }
      let body = try read(fd, at: offset + frameHeaderSize, count: Int(length))
      guard body.count == Int(length) else { break }
      var crc = CRC32C.checksum(scan.chain.bigEndianBytes)
      crc = head[0..<28].withUnsafeBytes { CRC32C.update(crc, $0) }
      crc = body.withUnsafeBytes { CRC32C.update(crc, $0) }
      guard crc == stored else { break }
      // The chain vouches for the body: a record list that does not add up is damage, not an end.
      var records: [(UInt64, [UInt8])] = []
      var at = 0
      var sequence = expected
      while at + 4 <= body.count, records.count < Int(count) {
        guard let recordLength = UInt32(bigEndianBytes: body[at..<at + 4]),
          at + 4 + Int(recordLength) <= body.count
        else { break }
        records.append((sequence, Array(body[at + 4..<at + 4 + Int(recordLength)])))
        at += 4 + Int(recordLength)
        sequence += 1
      }
      guard records.count == Int(count), at == body.count else {
        throw FerryLogError.damagedStore(
          path: "ferry-segment",
          reason:
            "a frame of its write-ahead segment at byte \(offset) passes its checksum but its records do not add up"
        )
      }
      scan.records += records
      scan.frames += 1
      scan.chain = crc
      expected += UInt64(count)
      offset += frameHeaderSize + Int(length)
      scan.end = UInt64(offset)
    }
    return scan
  }
}

/// `open(2)` under a name that does not clash with the static functions called `open`.
@inline(__always)
func systemOpen(_ path: String, _ flags: Int32) -> Int32 {
  #if canImport(Glibc)
    return Glibc.open(path, flags)
  #else
    return Darwin.open(path, flags)
  #endif
}

@inline(__always)
func systemOpen(_ path: String, _ flags: Int32, _ mode: mode_t) -> Int32 {
  #if canImport(Glibc)
    return Glibc.open(path, flags, mode)
  #else
    return Darwin.open(path, flags, mode)
  #endif
}

extension EventLog {
  /// Whether the store in `directory` has a write-ahead segment file (for tools that must keep a
  /// store's mode, or must not swap its data file under one).
  package static func hasWriteAheadSegment(in directory: String) -> Bool {
    WriteAheadSegment.exists(in: directory)
  }
}

/// The commits a store's write-ahead segment holds past its checkpoint, as read without writing
/// (``EventLog/outstandingSegmentCommits(in:)``).
package struct OutstandingSegmentCommits: Sendable {
  /// The log's head at the segment's current checkpoint.
  package var checkpointHead: UInt64
  /// The store id the segment's header names.
  package var storeId: [UInt8]
  /// The chained frames past the checkpoint.
  package var frames: Int
  /// Their records, decoded, in sequence order from `checkpointHead + 1`.
  package var events: [LoggedEvent]
  /// Why the chain's records stopped early: a record the chain vouches for that does not decode
  /// (nil when every chained record decoded).
  package var damage: String?
}

extension EventLog {
  /// Reads the store's write-ahead segment — its current header and the frames chained after it —
  /// opening the file read-only and taking no lock, so a damaged or crashed store is left exactly
  /// as it was (for `ferry salvage`). Nil when the store has no segment; throws `damagedStore`
  /// when neither header slot is intact or the file cannot be read.
  package static func outstandingSegmentCommits(in directory: String) throws -> OutstandingSegmentCommits? {
    guard WriteAheadSegment.exists(in: directory) else { return nil }
    let fd = try WriteAheadSegment.open(in: directory, readOnly: true)
    defer { WriteAheadSegment.closeFile(fd) }
    let header = try WriteAheadSegment.currentHeader(fd, directory: directory)
    let scan = try WriteAheadSegment.scan(fd, header: header)
    var result = OutstandingSegmentCommits(
      checkpointHead: header.checkpointHead, storeId: header.storeId, frames: scan.frames, events: [],
      damage: nil)
    for (sequence, bytes) in scan.records {
      do {
        result.events.append(try EventRecord.decode(bytes, sequence: sequence))
      } catch {
        result.damage = "the record at sequence \(sequence) does not decode (\(error))"
        break
      }
    }
    return result
  }
}
