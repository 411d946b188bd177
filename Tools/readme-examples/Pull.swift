import Ferry

// snippet.hide
func pullExample(storePath: String, api: ExampleAPI, database: ExampleDatabase) async throws {
// snippet.show
let store = try await FerryStore.open(at: storePath)        // both sides share one log

var configuration = TaskRunner.Configuration()
configuration.collections["note-changes"] = ["save-note", "delete-note"]
let runner = TaskRunner(queue: store.queue, configuration: configuration)

let notes = try CacheRepository(
  key: "notes", ledger: store.ledger, maxAge: .seconds(3600),
  source: CacheSource(
    fetch: { try await api.notes() },                       // from the server
    save: { try await database.replaceNotes($0) },          // a save that throws is a failed fetch
    load: { try await database.notes() },
    isEmpty: { $0.isEmpty }),
  requires: try PendingTasksGate(runner: runner, collection: "note-changes"))  // push first, then pull

switch await notes.refresh() {                              // one fetch per key, however many callers
case .successful: break
case .failed(let error): show(error.message)                // the last success time is kept
  // error.underlying is what the source threw: `error.underlying as? HTTPError` tells a 401 from a timeout
case .skipped(.notTooOld), .skipped(.pendingTasks), .skipped(.cancelled): break
}

for await state in notes.states() {                         // refreshes by itself when missing or too old
  if case .cache(let value, _, let age, let isTooOld) = state.content { render(value, age, isTooOld) }
  // snippet.hide
  break
  // snippet.show
}

print(try store.ledger.state(key: "notes", maxAge: .seconds(3600)))  // "fetched …, 0s old"
print(try store.ledger.keys(olderThan: .seconds(86_400 * 30)))        // for eviction
// snippet.hide
store.close()
}
