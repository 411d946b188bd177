import FerryLog
import Foundation
import Testing

@_spi(Engine) @testable import Ferry

/// A task id's faces: the bare number it prints, parses and encodes as, and the log's order.
@Suite struct TaskIDTests {
  @Test func printsAndParsesAsItsBareNumber() {
    let id = TaskID(rawValue: 42)
    #expect(id.description == "42")
    #expect("\(id)" == "42")
    #expect(TaskID("42") == id)
    #expect(TaskID("task 42") == nil)
    #expect(TaskID("-1") == nil)
    #expect(TaskID("18446744073709551616") == nil)  // past UInt64
  }

  @Test func encodesAsABareNumber() throws {
    let ids = [TaskID(rawValue: 1), TaskID(rawValue: .max)]
    let json = try JSONEncoder().encode(ids)
    #expect(String(decoding: json, as: UTF8.self) == "[1,18446744073709551615]")
    #expect(try JSONDecoder().decode([TaskID].self, from: json) == ids)
    // JSON written when ids were bare integers reads the same.
    #expect(try JSONDecoder().decode([String: TaskID].self, from: Data(#"{"id":7}"#.utf8)) == ["id": 7])
    #expect(throws: DecodingError.self) { try JSONDecoder().decode(TaskID.self, from: Data(#""7""#.utf8)) }
  }

  @Test func ordersAsTheLogDoes() async throws {
    #expect(TaskID(rawValue: 2) < TaskID(rawValue: 10))
    #expect([TaskID(rawValue: 10), 2, 7].sorted() == [2, 7, 10])
    try await withStore { store, _, _ in
      let first = try await store.queue.add(tag: "t", payload: Item(name: "a"))
      let second = try await store.queue.add(tag: "t", payload: Item(name: "b"))
      #expect(first < second)
      // The id is the sequence of the event that added the task.
      #expect(try store.log.event(at: second.rawValue)?.type == "task.added")
    }
  }
}
