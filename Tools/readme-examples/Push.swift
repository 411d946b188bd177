// snippet.hide
// swift-format-ignore-file
// Not formatted: the README shows these lines as they are written here (ReadmeExampleTests).
// snippet.show
import Ferry

// snippet.hide
func pushExample(storePath: String, api: ExampleAPI) async throws {
// snippet.show
struct Upload: Codable, Sendable { var photo: String }

let store = try await FerryStore.open(at: storePath)    // both sides on one log: store.queue, store.ledger
let runner = TaskRunner(queue: store.queue)
runner.register(tag: "upload") { task in
  let upload = try task.payload(as: Upload.self)
  // The same key on every attempt and after any crash: the server applies each key once.
  switch await api.send(upload.photo, idempotencyKey: task.idempotencyKey) {
  case .ok: return .succeeded
  case .offline: return .deferred("offline")                        // no attempt spent, no backoff
  case .unauthorized: return .recordError("Log in again to upload")  // waits for the user
  case .rejected(let why): return .failed(why, retryable: false)     // dead: kept, revivable
  }
}

// Durable before it returns; the tasks of one group run strictly in order.
try await store.queue.add(tag: "upload", payload: Upload(photo: "cat.jpg"), groupId: "album-7")
try await store.queue.add(tag: "upload", payload: Upload(photo: "dog.jpg"), groupId: "album-7")

let report = try await runner.run()   // one pass: "2 ran (1 succeeded, 0 failed, 1 deferred)"
print(report)
runner.startAutomaticRunning()        // from now on, runs whenever there is work
// snippet.hide
runner.stop()
store.close()
// The server saw each photo under one key: cat once, dog once (offline) and again with the same key.
let received = api.received
guard received.map(\.photo) == ["cat.jpg", "dog.jpg"] || received.map(\.photo) == ["cat.jpg", "dog.jpg", "dog.jpg"],
  Set(received.filter { $0.photo == "dog.jpg" }.map(\.key)).count == 1,
  Set(received.map(\.key)).count == 2
else { throw ExampleFailure("the push example's server saw \(received)") }
}
