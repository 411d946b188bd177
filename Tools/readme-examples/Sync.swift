// snippet.hide
// swift-format-ignore-file
// Not formatted: the README shows these lines as they are written here (ReadmeExampleTests).
// snippet.show
import Ferry
import Foundation
import Synchronization

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

// The examples of the "Syncing with a server" article (Sources/Ferry/Ferry.docc/SyncingWithAServer.md),
// compiled here and run on a real store; ReadmeExampleTests checks that every line of the article's
// client-side Swift is in this file.

struct Note: Codable, Sendable { var text: String }
struct Created: Codable { var serverId: String }
struct Edit: Codable { var createTask: TaskID; var text: String }

/// A server that gives each created note an id and remembers the edits it was sent, once per key.
final class SyncAPI: Sendable {
  private let state = Mutex<(notes: [String: String], keys: Set<String>)>(([:], []))

  func create(_ note: Note, key: String) async throws -> String {
    state.withLock { s in
      let id = "srv-\(s.notes.count + 1)"
      if s.keys.insert(key).inserted { s.notes[id] = note.text }
      return id
    }
  }

  func edit(_ serverId: String, _ text: String, key: String) async throws {
    state.withLock { s in if s.keys.insert(key).inserted { s.notes[serverId] = text } }
  }

  var notes: [String: String] { state.withLock { $0.notes } }
}

func syncExample(storePath: String, api: SyncAPI, notesURL: URL) async throws {
  let store = try await FerryStore.open(at: storePath)
  defer { store.close() }
  var configuration = TaskRunner.Configuration()
  #if canImport(Network)
    configuration.connectivity = PathConnectivity()
  #else
    configuration.connectivity = ManualConnectivity()
  #endif
  let runner = TaskRunner(queue: store.queue, configuration: configuration)

  // Registered, never run here (no server listens at `notesURL`).
  runner.register(tag: "save-note") { task in
    var request = URLRequest(url: notesURL)
    request.httpMethod = "PUT"
    request.setValue(task.idempotencyKey, forHTTPHeaderField: "Idempotency-Key")
    request.httpBody = Data(task.payloadBytes)
    let (_, response) = try await URLSession.shared.data(for: request)
    return (response as? HTTPURLResponse)?.statusCode == 200 ? .succeeded : .failed("server said no")
  }

  runner.register(tag: "create-note") { task in
    let serverId = try await api.create(task.payload(as: Note.self), key: task.idempotencyKey)
    return .succeeded(output: try TaskOutput(Created(serverId: serverId)))
  }
  runner.register(tag: "edit-note") { task in
    let edit = try task.payload(as: Edit.self)
    guard let created = try store.queue.output(of: edit.createTask) else {
      return .recordError("no server id")
    }
    try await api.edit(created.decode(as: Created.self).serverId, edit.text, key: task.idempotencyKey)
    return .succeeded
  }
  runner.register(tag: "rename-list") { _ in
    return .succeeded(invalidating: ["notes"])
  }

  // A note created and edited offline, in one group: the edit runs after the create, under its id.
  let create = try await store.queue.add(tag: "create-note", payload: Note(text: "milk"), groupId: "note-1")
  try await store.queue.add(
    tag: "edit-note", payload: Edit(createTask: create, text: "oat milk"), groupId: "note-1")
  try await store.queue.add(tag: "rename-list", payload: Note(text: "groceries"))
  let report = try await runner.run()
  guard report.succeeded == 3, api.notes == ["srv-1": "oat milk"],
    try store.ledger.record("notes")?.isInvalidated == true
  else {
    throw ExampleFailure("the sync example did not end as the article says: \(report), \(api.notes)")
  }
}

struct ExampleFailure: Error, CustomStringConvertible {
  let description: String
  init(_ description: String) { self.description = description }
}
