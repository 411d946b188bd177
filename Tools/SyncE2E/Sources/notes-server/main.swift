// notes-server: the server side of Ferry's end-to-end proof. A small notes API that deduplicates
// changes on their Idempotency-Key and keeps a durable record of every request it answered
// (`<dir>/record.jsonl`), with failures, refusals and slow answers injected on demand.
//
//   notes-server --port 8080 --dir /tmp/notes-server [--fail-rate 0.2] [--fail-after-apply 0.5]
//                [--delay-ms 300] [--bad-marker BAD]
//
//   POST /notes         {title, body}            → 201 {id}
//   PUT  /notes/{id}    {title, body, revision}  → 200 {id, title, body, revision}
//   GET  /notes                                  → 200 {notes: [...]}
//   POST /batch         {items: [{key, group?, method, path, body}]} → 200 {results: [{status, body}]}
//                       (in order; a group stops at its first change not applied: 409 for the rest;
//                       a change without a group stops nothing)
//   POST /control       {failRate, failAfterApplyShare, delayMs, badMarker} → the settings
import Foundation
import HTTPTypes
import Hummingbird
import Logging

struct Options {
  var port = 8080
  var directory = ""
  var faults = Faults()
}

func parseOptions(_ arguments: [String]) -> Result<Options, UsageError> {
  var options = Options()
  var rest = arguments[...]
  func value(_ flag: String) -> Result<String, UsageError> {
    guard let next = rest.popFirst() else { return .failure(UsageError("\(flag) needs a value")) }
    return .success(next)
  }
  while let flag = rest.popFirst() {
    let parsed: Result<Void, UsageError>
    switch flag {
    case "--port":
      parsed = value(flag).flatMap { v in
        guard let port = Int(v), (1...65535).contains(port) else {
          return .failure(UsageError("--port \(v)"))
        }
        options.port = port
        return .success(())
      }
    case "--dir":
      parsed = value(flag).map { options.directory = $0 }
    case "--fail-rate", "--fail-after-apply":
      parsed = value(flag).flatMap { v in
        guard let rate = Double(v), (0...1).contains(rate) else {
          return .failure(UsageError("\(flag) \(v): 0...1"))
        }
        if flag == "--fail-rate" {
          options.faults.failRate = rate
        } else {
          options.faults.failAfterApplyShare = rate
        }
        return .success(())
      }
    case "--delay-ms":
      parsed = value(flag).flatMap { v in
        guard let ms = Int(v), ms >= 0 else { return .failure(UsageError("--delay-ms \(v)")) }
        options.faults.delayMs = ms
        return .success(())
      }
    case "--bad-marker":
      parsed = value(flag).map { options.faults.badMarker = $0 }
    default:
      parsed = .failure(UsageError("unknown flag \(flag)"))
    }
    if case .failure(let error) = parsed { return .failure(error) }
  }
  if options.directory.isEmpty { return .failure(UsageError("--dir is required")) }
  return .success(options)
}

struct FaultsChange: Decodable {
  var failRate: Double?
  var failAfterApplyShare: Double?
  var delayMs: Int?
  var badMarker: String?
}

struct UsageError: Error {
  let message: String
  init(_ message: String) { self.message = message }
}

func respond(_ answer: NotesBook.Answer) -> Response {
  Response(
    status: HTTPResponse.Status(code: answer.status),
    headers: [.contentType: "application/json"],
    body: ResponseBody(byteBuffer: ByteBuffer(string: answer.body)))
}

func failure(_ error: any Error) -> Response {
  // The record could not be written: say so, and change nothing the client could rely on.
  Response(
    status: .internalServerError, headers: [.contentType: "application/json"],
    body: ResponseBody(byteBuffer: ByteBuffer(string: #"{"error":"record: \#(error)"}"#)))
}

let idempotencyKey = HTTPField.Name("Idempotency-Key")

/// Applies a change, then waits the injected delay (after the apply and its record, before the
/// answer: a client killed now never hears of a change the server has).
func change(_ book: NotesBook, _ request: Request, noteId: String?) async -> Response {
  var request = request
  do {
    let body = try await request.collectBody(upTo: 1 << 20)
    let key = idempotencyKey.flatMap { request.headers[$0] }
    let answer = try await book.change(
      method: request.method.rawValue, path: request.uri.path, noteId: noteId, key: key,
      body: Array(body.readableBytesView))
    let delay = await book.faults.delayMs
    if answer.delay && delay > 0 {
      try? await Task.sleep(for: .milliseconds(delay))
    }
    return respond(answer)
  } catch {
    return failure(error)
  }
}

let options: Options
switch parseOptions(Array(CommandLine.arguments.dropFirst())) {
case .success(let parsed): options = parsed
case .failure(let error):
  FileHandle.standardError.write(Data("notes-server: \(error.message)\n".utf8))
  exit(64)
}

let book: NotesBook
do {
  book = try NotesBook(directory: options.directory, faults: options.faults)
} catch {
  FileHandle.standardError.write(Data("notes-server: \(error)\n".utf8))
  exit(1)
}

let router = Router()
router.get("notes") { _, _ -> Response in
  do { return respond(try await book.list()) } catch { return failure(error) }
}
router.post("notes") { request, _ -> Response in
  await change(book, request, noteId: nil)
}
router.put("notes/:id") { request, context -> Response in
  guard let id = context.parameters.get("id") else {
    return Response(status: .badRequest)
  }
  return await change(book, request, noteId: id)
}
router.post("batch") { request, _ -> Response in
  var request = request
  do {
    let body = try await request.collectBody(upTo: 1 << 22)
    guard let decoded = try? JSONDecoder().decode(BatchBody.self, from: Data(body.readableBytesView)) else {
      return respond(.init(status: 400, body: #"{"error":"the body is not {items: [...]}"}"#, delay: false))
    }
    let (answers, delay) = try await book.batch(decoded.items)
    let delayMs = await book.faults.delayMs
    if delay && delayMs > 0 { try? await Task.sleep(for: .milliseconds(delayMs)) }
    let results = BatchAnswer(results: answers.map { BatchResult(status: $0.status, body: $0.body) })
    let encoded = try JSONEncoder().encode(results)
    return respond(.init(status: 200, body: String(decoding: encoded, as: UTF8.self), delay: false))
  } catch {
    return failure(error)
  }
}
router.post("control") { request, _ -> Response in
  var request = request
  do {
    let body = try await request.collectBody(upTo: 1 << 16)
    // Only the settings named change.
    let change = try JSONDecoder().decode(FaultsChange.self, from: Data(body.readableBytesView))
    var faults = await book.faults
    if let v = change.failRate { faults.failRate = v }
    if let v = change.failAfterApplyShare { faults.failAfterApplyShare = v }
    if let v = change.delayMs { faults.delayMs = v }
    if let v = change.badMarker { faults.badMarker = v }
    let now = try await book.setFaults(faults)
    let encoded = try JSONEncoder().encode(now)
    return respond(.init(status: 200, body: String(decoding: encoded, as: UTF8.self), delay: false))
  } catch {
    return respond(.init(status: 400, body: #"{"error":"\#(error)"}"#, delay: false))
  }
}

var logger = Logger(label: "notes-server")
logger.logLevel = .warning
let app = Application(
  router: router,
  configuration: .init(address: .hostname("127.0.0.1", port: options.port), serverName: "notes-server"),
  onServerRunning: { _ in
    // Unbuffered: the script waits for this line.
    FileHandle.standardOutput.write(
      Data("notes-server: listening on 127.0.0.1:\(options.port), \(await book.noteCount) notes\n".utf8))
  },
  logger: logger)
do {
  try await app.runService()
} catch {
  FileHandle.standardError.write(Data("notes-server: \(error)\n".utf8))
  exit(1)
}
