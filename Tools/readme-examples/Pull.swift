// snippet.hide
// swift-format-ignore-file
// Not formatted: the README shows these lines as they are written here (ReadmeExampleTests).
// snippet.show
import Ferry

// snippet.hide
func pullExample(storePath: String, api: ExampleAPI, database: ExampleDatabase) async throws {
// snippet.show
let store = try await FerryStore.open(at: storePath)
let notes = try CacheRepository(
  key: "notes", ledger: store.ledger, maxAge: .seconds(3600),
  source: CacheSource(
    fetch: { try await api.notes() },                   // from the server
    save: { try await database.replaceNotes($0) },      // into the app's own database
    load: { try await database.notes() },
    isEmpty: { $0.isEmpty }))

for await state in notes.states() {                     // fetches by itself when missing or too old
  switch state.content {
  case .noCache: print("first fetch under way: \(state.isRefreshing)")
  case .cache(let value, _, let age, let isTooOld): render(value, age, isTooOld)
  }
  if let error = state.refreshError { show(error.message) }   // the last good copy stays shown
  // snippet.hide
  if case .cache = state.content { break }
  // snippet.show
}

print(try store.ledger.state(key: "notes", maxAge: .seconds(3600)))  // "fetched …, 0s old"
// snippet.hide
store.close()
}
