// notes-client: a notes app's sync on Ferry, over real HTTP to notes-server — the client side of
// Ferry's end-to-end proof (Tools/sync-e2e.sh). Each command is one process, as an app is killed
// and started again.
//
//   notes-client --home DIR --server http://127.0.0.1:PORT --net DIR COMMAND
//   [--batch N]                       send changes N at a time (POST /batch)
//     create LOCALID TITLE [BODY]   queue a new note (LOCALID: the app's own id for it)
//     edit LOCALID TITLE BODY       queue an edit (the note's next revision)
//     sync [--for SECONDS]          run the queue until nothing can run by itself, or time is up
//     fix LOCALID NEWTITLE          the user changes a title the server refused; it goes again
//     read                          refresh the notes cache (pushing first) and print it
//     status                        the queue, counted (JSON)
//
// DIR/store is the Ferry store; the network is offline while `--net DIR`/offline exists.
// Every command prints one JSON line on stdout. Exit status: 0, 3 sync time up with work left,
// 8 unknown note, 11 nothing to fix, 64 bad flags, 1 anything else.
import Ferry
import Foundation

struct Invocation {
  var home = ""
  var server = "http://127.0.0.1:8080"
  var network = ""
  var concurrency = 4
  /// 0: one request a change; N: changes go N at a time to `POST /batch`.
  var batch = 0
  var command: [String] = []
}

func parse(_ arguments: [String]) throws -> Invocation {
  var invocation = Invocation()
  var rest = arguments[...]
  func value(_ flag: String) throws -> String {
    guard let next = rest.popFirst() else { throw ClientError.usage("\(flag) needs a value") }
    return next
  }
  while let first = rest.first, first.hasPrefix("--") {
    rest.removeFirst()
    switch first {
    case "--home": invocation.home = try value(first)
    case "--server": invocation.server = try value(first)
    case "--net": invocation.network = try value(first)
    case "--batch":
      let v = try value(first)
      guard let n = Int(v), n >= 0 else { throw ClientError.usage("--batch \(v)") }
      invocation.batch = n
    case "--concurrency":
      let v = try value(first)
      guard let n = Int(v), n >= 1 else { throw ClientError.usage("--concurrency \(v)") }
      invocation.concurrency = n
    default: throw ClientError.usage("unknown flag \(first)")
    }
  }
  if invocation.home.isEmpty { throw ClientError.usage("--home is required") }
  if invocation.network.isEmpty { invocation.network = invocation.home }
  invocation.command = Array(rest)
  return invocation
}

func printJSON(_ value: some Encodable) throws {
  let encoder = JSONEncoder()
  encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
  print(String(decoding: try encoder.encode(value), as: UTF8.self))
}

struct Queued: Encodable {
  var command: String
  var localId: String
  var taskId: TaskID
  var revision: Int
}

struct Synced: Encodable {
  var command = "sync"
  var end: String
  var seconds: Double
  var status: NotesApp.Status
}

struct Fixed: Encodable {
  var command = "fix"
  var localId: String
  var taskId: TaskID
  var tag: String
  var title: String
}

struct Read: Encodable {
  var command = "read"
  var refresh: String
  var notes: [ServerNote]
}

func describe(_ result: RefreshOutcome) -> String {
  switch result {
  case .successful: "successful"
  case .failed(let error): "failed: \(error.message)"
  case .skipped(let reason): "skipped: \(reason)"
  }
}

func run(_ invocation: Invocation) async throws -> Int32 {
  guard let server = URL(string: invocation.server) else {
    throw ClientError.usage("--server \(invocation.server)")
  }
  let command = invocation.command
  guard let verb = command.first else { throw ClientError.usage("no command") }
  let app = try await NotesApp(
    home: invocation.home, server: server, networkDirectory: invocation.network,
    concurrency: invocation.concurrency, batch: invocation.batch)
  defer { app.store.close() }
  switch (verb, command.count) {
  case ("create", 3), ("create", 4):
    let (taskId, revision) = try await app.create(
      localId: command[1], title: command[2], body: command.count == 4 ? command[3] : "")
    try printJSON(Queued(command: verb, localId: command[1], taskId: taskId, revision: revision))
  case ("edit", 4):
    let (taskId, revision) = try await app.edit(localId: command[1], title: command[2], body: command[3])
    try printJSON(Queued(command: verb, localId: command[1], taskId: taskId, revision: revision))
  case ("sync", 1), ("sync", 3):
    var seconds = 60.0
    if command.count == 3 {
      guard command[1] == "--for", let s = Double(command[2]), s > 0 else {
        throw ClientError.usage("sync [--for SECONDS]")
      }
      seconds = s
    }
    let started = ContinuousClock.now
    let end = try await app.sync(seconds: seconds)
    let elapsed = ContinuousClock.now - started
    try printJSON(
      Synced(
        end: end.rawValue,
        seconds: Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18,
        status: try app.status()))
    return end == .done ? 0 : 3
  case ("fix", 3):
    let task = try await app.fix(localId: command[1], title: command[2])
    try printJSON(Fixed(localId: command[1], taskId: task.id, tag: task.tag, title: command[2]))
  case ("read", 1):
    let (result, notes) = try await app.read()
    try printJSON(Read(refresh: describe(result), notes: notes))
  case ("status", 1):
    try printJSON(try app.status())
  default:
    throw ClientError.usage("unknown command or wrong arguments: \(command.joined(separator: " "))")
  }
  return 0
}

do {
  let status = try await run(try parse(Array(CommandLine.arguments.dropFirst())))
  exit(status)
} catch let error as ClientError {
  FileHandle.standardError.write(Data("notes-client: \(error)\n".utf8))
  exit(error.exitStatus)
} catch {
  FileHandle.standardError.write(Data("notes-client: \(error)\n".utf8))
  exit(1)
}
