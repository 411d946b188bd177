import Foundation
import Testing

@testable import FerryLog

/// The in-place replay refuses what the event path refuses, with the same error.
@Suite(.timeLimit(.minutes(20))) struct InPlaceErrorTests {
  func openError(_ store: TemporaryStore, _ projections: [any Projection], _ catalog: EventCatalog) -> String
  {
    do {
      let log = try store.open(projections, catalog: catalog)
      log.close()
      return "opened"
    } catch {
      return "\(error)"
    }
  }

  @Test(arguments: [0, 1, 2]) func unknownAndNewerRecordsFailAlikeInPlaceAndAsEvents(_ kind: Int) async throws
  {
    let store = TemporaryStore()
    let copy = TemporaryStore()
    defer {
      store.remove()
      copy.remove()
    }
    do {
      let log = try store.open([])
      var events = (0..<5).map { NewEvent(type: "a", payload: $0 == 2 ? [] : [UInt8($0)]) }
      switch kind {
      case 0: events.append(NewEvent(type: "zzz", payload: [1]))
      case 1: events.append(NewEvent(type: "a", schemaVersion: 9, payload: [1]))
      default: events.append(NewEvent(type: "a", payload: []))
      }
      events.append(NewEvent(type: "a", payload: [7]))
      _ = try await log.append(events)
      log.close()
    }
    try FileManager.default.copyItem(atPath: store.path, toPath: copy.path)
    let catalog = EventCatalog([.init("a")])
    let paths = EchoFields.Paths()
    let inPlace = openError(store, [EchoFields(paths: paths)], catalog)
    let asEvents = openError(copy, [EchoFields(paths: paths), PlainCount()], catalog)
    print("in place: \(inPlace)\nas events: \(asEvents)")
    #expect(inPlace == asEvents)
    if kind == 2 { #expect(inPlace == "opened") } else { #expect(inPlace != "opened") }
    #expect(paths.inPlace.load(ordering: .relaxed) > 0)
  }
}
