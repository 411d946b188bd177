@_spi(Engine) @_spi(Experimental) import Ferry
import FerryLog
import FerryTools
import Foundation
import TestSupport
import Testing

/// `ferry salvage` of a store written through the write-ahead segment (`Specs/salvage.md`,
/// `Specs/one-sync-commit.md`) whose writer process was killed with frames outstanding: every
/// event the writer acknowledged is in the salvaged store, or the salvage exits non-zero and counts
/// what it could not bring back — never "lost: none" over events only the segment held.
@Suite(.timeLimit(.minutes(20)), .serialized) struct SegmentSalvageTests {
  /// The store's files, by name, except the lock files every opener writes to.
  func dataFiles(_ path: String) throws -> [String: Data] {
    var files: [String: Data] = [:]
    for name in try FileManager.default.contentsOfDirectory(atPath: path)
    where name != "lock.mdb" && name != "ferry-open.lock" {
      files[name] = try Data(contentsOf: URL(fileURLWithPath: path + "/" + name))
    }
    return files
  }

  /// What a killed writer left: the head of the settled store before it, and the ids of the tasks
  /// it acknowledged.
  struct Killed {
    var settledHead: UInt64
    var earlyIds: [TaskID]
    var acknowledgedIds: [TaskID]
  }

  /// 100 tasks added and the store closed (its checkpoint: everything, flushed), then a writer
  /// process adds 200 through the segment — each acknowledged after its frame's flush — and is
  /// SIGKILLed. With `cut`, the data file is put back as it was at the checkpoint: what a power
  /// cut leaves when none of the writer's unflushed pages reached the disk, so its 200 tasks are
  /// in the segment alone.
  func killedWriter(at path: String, cut: Bool) async throws -> Killed {
    var configuration = FerryStore.Configuration()
    configuration.writeAheadSegment = true
    let store = try await FerryStore.open(at: path, configuration: configuration)
    var earlyIds: [TaskID] = []
    for i in 0..<100 { earlyIds.append(try await store.queue.add(tag: "early", payload: ["n": i])) }
    let settledHead = try store.log.head()
    store.close()
    let settled = try Data(contentsOf: URL(fileURLWithPath: path + "/data.mdb"))
    let writer = try Child("ferry-test-worker", ["store-segment-add", path, "200"])
    #expect(writer.waitForOutput("holding"), "the writer never finished its adds")
    writer.killAbruptly()
    let said = writer.finish().stdout
    if cut { try settled.write(to: URL(fileURLWithPath: path + "/data.mdb")) }
    let acknowledged = said.split(separator: "\n").compactMap { line -> TaskID? in
      line.hasPrefix("ack ")
        ? line.split(separator: " ").dropFirst().first.flatMap { TaskID(String($0)) } : nil
    }
    return Killed(settledHead: settledHead, earlyIds: earlyIds, acknowledgedIds: acknowledged)
  }

  /// Every record of the log at `path`, by sequence.
  func records(_ path: String) throws -> [UInt64: [UInt8]] {
    var configuration = EventLog.Configuration()
    configuration.readOnly = true
    let log = try EventLog.open(at: path, configuration: configuration)
    defer { log.close() }
    var records: [UInt64: [UInt8]] = [:]
    for sequence in 1...max(1, try log.head()) {
      if let bytes = try log.record(at: sequence) { records[sequence] = bytes }
    }
    return records
  }

  /// Killed (the data file holds every commit: the page cache survives a kill) or cut (only the
  /// segment holds the writer's 200): either way every acknowledged task comes back, every record
  /// byte for byte as `ferry recover` brings it back, and the damaged store's files are untouched.
  @Test(arguments: [false, true])
  func aKilledSegmentWriterLosesNothingToSalvage(cut: Bool) async throws {
    let place = try SalvagePlace()
    defer { place.remove() }
    let killed = try await killedWriter(at: place.source, cut: cut)
    #expect(killed.acknowledgedIds.count == 200)
    // The cut store is one a recovery settles: a copy recovered holds every acknowledged task.
    let copy = place.parent + "/recovered"
    try FileManager.default.copyItem(atPath: place.source, toPath: copy)
    let recover = try ferry(["recover", copy])
    #expect(recover.status == 0, "\(recover.stderr)")
    let expected = try records(copy)
    let before = try dataFiles(place.source)

    let (status, report, stderr) = try salvageJSON(place)
    #expect(status == 0, "\(stderr)")
    let salvaged = try #require(report)
    #expect(salvaged.complete && salvaged.lost == 0 && !salvaged.segmentUnread)
    #expect(salvaged.recovered == expected.count && Int(salvaged.highestSequence) == expected.count)
    let outstanding = Int(salvaged.highestSequence - killed.settledHead)
    #expect(salvaged.segment.hasPrefix("\(outstanding) events in"), "\(salvaged.segment)")
    if cut { #expect(salvaged.recoveredFromSegment == outstanding, "the data file never held them") }
    #expect(try dataFiles(place.source) == before, "salvage wrote to the store it salvaged")

    #expect(try records(place.target) == expected, "every record as recovery brings it back")
    let queued = Set(try queuedTasks(place.target).keys)
    #expect(queued == Set(killed.earlyIds + killed.acknowledgedIds), "every acknowledged task, no other")
    #expect(try ferry(["verify", place.target]).status == 0)
    print(
      "salvage of a segment store \(cut ? "cut" : "killed") with \(outstanding) events outstanding: recovered "
        + "\(salvaged.recovered) (\(salvaged.recoveredFromTree) tree, \(salvaged.recoveredFromSegment) segment, "
        + "\(salvaged.recoveredFromScan) scan); segment: \(salvaged.segment)")
  }

  /// Cut, and both header slots of the segment torn: its frames cannot be read, so the 200 tasks
  /// only it held are gone — and the salvage says so. It exits 1, counts them lost up to the head
  /// mark (a `ferry.lost` marker at each), names `ferry-segment`, and is incomplete.
  @Test func anUnreadableSegmentIsCountedNeverPassedOver() async throws {
    let place = try SalvagePlace()
    defer { place.remove() }
    let killed = try await killedWriter(at: place.source, cut: true)
    #expect(killed.acknowledgedIds.count == 200)
    let segment = place.source + "/ferry-segment"
    var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: segment)))
    bytes[100] ^= 0x01
    bytes[512 + 100] ^= 0x01
    try Data(bytes).write(to: URL(fileURLWithPath: segment))

    let (status, report, stderr) = try salvageJSON(place)
    #expect(status == ExitStatus.problemsFound.rawValue, "\(stderr)")
    let salvaged = try #require(report)
    #expect(!salvaged.complete && salvaged.segmentUnread)
    #expect(salvaged.segment == "could not be read: neither header slot of its write-ahead segment is intact")
    // Everything up to the checkpoint from the data file; the rest, up to the head mark, lost.
    let head = try #require(EventLog.acknowledgedHead(in: place.source))
    #expect(Int(head - killed.settledHead) >= 200)
    #expect(salvaged.recovered == Int(killed.settledHead) && salvaged.highestSequence == head)
    #expect(salvaged.lost == Int(head - killed.settledHead))
    #expect(salvaged.lostRanges == ["\(killed.settledHead + 1)-\(head)"])
    let lines = salvaged.lines()
    #expect(lines.contains { $0.contains("ferry-segment") })
    #expect(!lines.contains("lost: none"))
    #expect(lines.last?.hasPrefix("incomplete") == true, "\(lines)")
  }
}
