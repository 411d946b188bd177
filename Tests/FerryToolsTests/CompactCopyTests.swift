import FerryTools
import Foundation
import LMDB
import TestSupport
import Testing

@Suite(.timeLimit(.minutes(20)), .serialized) struct CompactCopyTests {
  /// Regression (`CompactCopyRaceTests.compactCopyRacingATightOpenCloseLoop(copy: true)` failed about one
  /// run in 26: the app's next open refused the store, "acknowledged up to 325, log ends at 324"):
  /// `compact --copy` told the state it had copied by `mdb_env_info`'s transaction id, which LMDB
  /// reads from the data file's meta pages. A commit in another process writes its meta page — and
  /// flushes it, for milliseconds — before it publishes its id in `lock.mdb`, where the copy's read
  /// transaction starts: a copy made in between lacked that commit while every id compared already
  /// named it, and once the app had acknowledged the add and closed, the copy was swapped in.
  ///
  /// Here that in-between state is held still: one process keeps the store open (`lock.mdb` stays
  /// live, at the published id), another commits through `MDB_NOLOCK` (the data file's meta page
  /// moves on, `lock.mdb` does not). The copy must be reported as the published state, which
  /// `compact --copy` then refuses to swap in: it is not the data file's newest.
  @Test func aCopyMadeWhileACommitIsUnpublishedIsNeverTakenForTheNewestState() async throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let dir = scratch.path + "/store"
    try await makeStore(at: dir, tasks: 20)
    let input = Pipe()
    let (holder, holderOut, holderErr, said) = try startHoldingOpen(dir, input: input)
    defer { if holder.isRunning { holder.terminate() } }
    #expect(said.hasPrefix("open "), "\(said)")
    let published = try #require(try DataFileCheck.read(dir + "/data.mdb").newest?.transaction)

    let (writer, writerOut, writerErr) = try start(
      productURL("ferry-test-worker"), ["unpublished-commit", dir])
    let wrote = finish(writer, writerOut, writerErr)
    #expect(wrote.status == 0, "\(wrote.stderr)")
    let newest = try #require(try DataFileCheck.read(dir + "/data.mdb").newest?.transaction)
    #expect(newest == published + 1, "the data file's meta page names the unpublished commit")

    let staging = scratch.path + "/copy"
    try FileManager.default.createDirectory(atPath: staging, withIntermediateDirectories: false)
    let copied = try writeCompactedCopy(of: dir, into: staging)
    #expect(copied == published, "the copy holds the published state")
    #expect(copied != newest, "a copy that lacks the newest commit is never taken for the newest state")
    var readOnly = Environment.Options()
    readOnly.readOnly = true
    let copy = try Environment.open(path: staging, options: readOnly)
    #expect(!(try copy.namedDatabases()).contains("unpublished"), "the copy lacks the unpublished commit")
    copy.close()

    try input.fileHandleForWriting.close()
    let closed = finish(holder, holderOut, holderErr)
    #expect(closed.status == 0, "\(closed.stderr)")
  }
}
