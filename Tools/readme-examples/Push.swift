import Ferry

// snippet.hide
func pushExample(storePath: String, api: ExampleAPI) async throws {
// snippet.show
struct Upload: Codable, Sendable, CustomStringConvertible {
  var photo: String
  var description: String { photo }
}
enum Work: String { case upload }                       // tags may be the app's own type

let store = try await FerryStore.open(at: storePath)    // one entry point: store.queue and store.ledger
let runner = TaskRunner(queue: store.queue)
runner.register(tag: Work.upload, retry: RetryPolicy(maxAttempts: 5)) { task in
  let upload = try task.payload(as: Upload.self)
  switch await api.send(upload) {
  case .ok: return .succeeded
  case .offline: return .deferred("offline")                        // no attempt spent, no backoff
  case .unauthorized: return .recordError("Log in again to upload")  // waits for resolveError
  case .rejected(let why): return .failed(why, retryable: false)     // dead: kept, revivable
  }
}

// Durable before it returns; tasks of one group run strictly in order.
let id = try await store.queue.add(tag: Work.upload, payload: Upload(photo: "cat.jpg"), groupId: "album-7")
try await store.queue.add(tag: Work.upload, payload: Upload(photo: "dog.jpg"), dataId: "dog", unique: .replace)

let report = try await runner.run()          // one pass: "2 ran (1 succeeded, 0 failed, 1 deferred)"
print(report, report.outcome(of: id) ?? .skipped(.noLongerQueued))
print(try store.queue.pendingTasks())        // the deferred one waits for the network, its attempt back
runner.startAutomaticRunning()               // or run whenever there is work (pause() is durable)
// snippet.hide
runner.stop()
store.close()
}
