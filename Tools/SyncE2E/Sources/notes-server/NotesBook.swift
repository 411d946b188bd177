import Foundation

/// A note as the server keeps it.
struct Note: Codable, Sendable, Equatable {
  var id: String
  var title: String
  var body: String
  /// The client's per-note edit counter of the last change applied (0 for the create).
  var revision: Int
}

/// One line of the server's record: every request it answered, in the order it decided them.
///
/// The record is the ground truth of the end-to-end check: the checker compares what the client
/// was asked to do with these lines, never with what the client says it did.
struct RecordLine: Codable, Sendable {
  enum Outcome: String, Codable, Sendable {
    /// The change was applied (whatever status was then sent: an injected 500 after the apply
    /// is still an applied change, which is the point of injecting it).
    case applied
    /// The key was applied before: the first response was sent again, nothing changed.
    case deduplicated
    /// Refused (400, 404, a missing key): nothing changed, and the key is not remembered, so
    /// that the same request can succeed once what was wrong is fixed.
    case rejected
    /// An injected 500 before anything was applied.
    case failed
    /// A key sent again with a different request: refused, nothing changed.
    case conflict
    /// A read (`GET /notes`).
    case read
    /// A change of the failure injection settings.
    case control
  }

  /// A response the server sends again for a key it has applied.
  struct StoredResponse: Codable, Sendable {
    var status: Int
    var body: String
  }

  var seq: Int
  /// Wall-clock milliseconds since 1970, when the request was decided.
  var time: Double
  var method: String
  var path: String
  var key: String?
  var outcome: Outcome
  /// The status sent.
  var status: Int
  /// The note's state after the request (nil for reads and refusals of unknown notes).
  var note: Note?
  /// For applied changes: the response a repeat of the key gets.
  var response: StoredResponse?
  /// For applied changes: what identifies the request (method, path, body), so that a key sent
  /// again with a different request is told apart from a retry.
  var fingerprint: String?
  var message: String?
}

/// Failure injection, changed by flags at start and by `POST /control`.
struct Faults: Codable, Sendable {
  /// The fraction of mutating requests answered 500.
  var failRate: Double = 0
  /// Of those, the fraction that fail after the change was applied and recorded (the client sees
  /// a 500 for a change the server has: only the idempotency key keeps a retry from applying it
  /// twice).
  var failAfterApplyShare: Double = 0.5
  /// How long to wait, after a change is applied and recorded, before answering: the moment a
  /// client killed mid-request leaves the server with a change the client never heard about.
  var delayMs: Int = 0
  /// Titles containing this are refused with 400 until the user changes them.
  var badMarker: String = "BAD"
}

enum RecordError: Error, CustomStringConvertible {
  case io(String)
  var description: String {
    switch self {
    case .io(let message): message
    }
  }
}

/// The server's state and its append-only record (JSON Lines, fsynced per line). Every decision
/// is made and recorded inside this actor, so two requests never decide on the same state.
actor NotesBook {
  private var notes: [String: Note] = [:]
  private var applied: [String: (fingerprint: String, response: RecordLine.StoredResponse)] = [:]
  private var nextSeq = 1
  private var nextNoteNumber = 1
  private(set) var faults: Faults
  private let fd: Int32
  private let encoder: JSONEncoder = {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    return encoder
  }()

  /// Opens (or creates) `directory/record.jsonl` and rebuilds notes and applied keys from it, so a
  /// restarted server deduplicates keys it applied before it stopped.
  init(directory: String, faults: Faults) throws {
    self.faults = faults
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    let path = directory + "/record.jsonl"
    var lines: [RecordLine] = []
    if let data = FileManager.default.contents(atPath: path), !data.isEmpty {
      // A line torn by a kill was never fsynced, so its request was never answered: drop it
      // (and everything after the last newline) before appending behind it.
      var keep = data.count
      if data.last != UInt8(ascii: "\n") {
        keep = (data.lastIndex(of: UInt8(ascii: "\n")).map { $0 + 1 }) ?? 0
        guard truncate(path, off_t(keep)) == 0 else {
          throw RecordError.io("cannot truncate the torn end of \(path): errno \(errno)")
        }
      }
      let decoder = JSONDecoder()
      for raw in data.prefix(keep).split(separator: UInt8(ascii: "\n")) where !raw.isEmpty {
        do {
          lines.append(try decoder.decode(RecordLine.self, from: Data(raw)))
        } catch {
          throw RecordError.io("record line \(lines.count + 1) of \(path) does not decode: \(error)")
        }
      }
    }
    fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
    guard fd >= 0 else { throw RecordError.io("cannot open \(path): errno \(errno)") }
    for line in lines {
      nextSeq = max(nextSeq, line.seq + 1)
      if line.outcome == .applied, let note = line.note {
        notes[note.id] = note
        if let number = Int(note.id.dropFirst()) { nextNoteNumber = max(nextNoteNumber, number + 1) }
        if let key = line.key, let response = line.response, let fingerprint = line.fingerprint {
          applied[key] = (fingerprint, response)
        }
      }
    }
  }

  var noteCount: Int { notes.count }

  struct Answer: Sendable {
    var status: Int
    var body: String
    /// Whether to wait `delayMs` before answering (only after a change was applied).
    var delay: Bool
  }

  func setFaults(_ new: Faults) throws -> Faults {
    faults = new
    try append(method: "POST", path: "/control", key: nil, outcome: .control, status: 200, message: "\(new)")
    return faults
  }

  func list() throws -> Answer {
    let sorted = notes.values.sorted { noteOrder($0.id, $1.id) }
    let body = try String(decoding: encoder.encode(NoteList(notes: sorted)), as: UTF8.self)
    try append(method: "GET", path: "/notes", key: nil, outcome: .read, status: 200)
    return Answer(status: 200, body: body, delay: false)
  }

  /// `POST /notes` (noteId nil) or `PUT /notes/{noteId}`.
  func change(method: String, path: String, noteId: String?, key: String?, body: [UInt8]) throws -> Answer {
    guard let key, !key.isEmpty else {
      return try refuse(method, path, nil, 400, "a change needs an Idempotency-Key header", note: nil)
    }
    // The request as decoded and encoded again with sorted keys: a retry from another process
    // may order the JSON's keys differently, and is still the same request.
    let decodedBody = try? JSONDecoder().decode(ChangeBody.self, from: Data(body))
    let canonical = decodedBody.flatMap { try? encoder.encode($0) }.map {
      String(decoding: $0, as: UTF8.self)
    }
    let fingerprint = method + " " + path + " " + (canonical ?? String(decoding: body, as: UTF8.self))
    if let first = applied[key] {
      if first.fingerprint != fingerprint {
        try append(
          method: method, path: path, key: key, outcome: .conflict, status: 422,
          message: "key first used for: \(first.fingerprint)")
        return Answer(
          status: 422, body: errorBody("this Idempotency-Key was used for another request"), delay: false)
      }
      try append(
        method: method, path: path, key: key, outcome: .deduplicated, status: first.response.status,
        note: noteId.flatMap { notes[$0] })
      return Answer(status: first.response.status, body: first.response.body, delay: false)
    }
    guard let decoded = decodedBody else {
      return try refuse(method, path, key, 400, "the body is not {title, body[, revision]}", note: nil)
    }
    var note: Note
    if let noteId {
      guard let existing = notes[noteId] else {
        return try refuse(method, path, key, 404, "no note \(noteId)", note: nil)
      }
      guard let revision = decoded.revision else {
        return try refuse(method, path, key, 400, "an edit needs a revision", note: existing)
      }
      note = existing
      note.title = decoded.title
      note.body = decoded.body
      note.revision = revision
    } else {
      note = Note(id: "s\(nextNoteNumber)", title: decoded.title, body: decoded.body, revision: 0)
    }
    if !faults.badMarker.isEmpty, decoded.title.contains(faults.badMarker) {
      return try refuse(
        method, path, key, 400, "the title contains \(faults.badMarker): change it",
        note: noteId.flatMap { notes[$0] })
    }
    let injected = Double.random(in: 0..<1) < faults.failRate
    let afterApply = injected && Double.random(in: 0..<1) < faults.failAfterApplyShare
    if injected && !afterApply {
      try append(
        method: method, path: path, key: key, outcome: .failed, status: 500,
        message: "injected, before the apply")
      return Answer(status: 500, body: errorBody("injected failure"), delay: false)
    }
    // Applied: recorded (fsynced) before the state changes in memory, so the record never lacks
    // a change the server acted on.
    let responseBody =
      noteId == nil
      ? try String(decoding: encoder.encode(Created(id: note.id)), as: UTF8.self)
      : try String(decoding: encoder.encode(note), as: UTF8.self)
    let stored = RecordLine.StoredResponse(status: noteId == nil ? 201 : 200, body: responseBody)
    let sent = afterApply ? 500 : stored.status
    try append(
      method: method, path: path, key: key, outcome: .applied, status: sent, note: note, response: stored,
      fingerprint: fingerprint, message: afterApply ? "injected 500 after the apply" : nil)
    notes[note.id] = note
    applied[key] = (fingerprint, stored)
    if noteId == nil { nextNoteNumber += 1 }
    return afterApply
      ? Answer(status: 500, body: errorBody("injected failure after the apply"), delay: true)
      : Answer(status: stored.status, body: stored.body, delay: true)
  }

  /// `POST /batch`: the changes in order, each as its own request would be (deduplicated on its
  /// key, recorded on its own line). A group stops at its first change that is not applied (a
  /// status other than 2xx): its later changes are answered 409 and not looked at, so a note's
  /// changes are never applied out of order. One delay, after the last.
  func batch(_ items: [BatchItem]) throws -> (answers: [Answer], delay: Bool) {
    var stopped = Set<String>()
    var answers: [Answer] = []
    var delay = false
    for item in items {
      // A change with no group is applied on its own: it stops nothing, and nothing stops it.
      if let group = item.group, stopped.contains(group) {
        answers.append(
          Answer(
            status: 409, body: errorBody("not applied: an earlier change of its group was not"), delay: false)
        )
        continue
      }
      let body = try encoder.encode(item.body)
      let noteId: String? = item.method == "PUT" ? String(item.path.dropFirst("/notes/".count)) : nil
      let answer = try change(
        method: item.method, path: item.path, noteId: noteId, key: item.key, body: Array(body))
      if !(200..<300).contains(answer.status), let group = item.group { stopped.insert(group) }
      delay = delay || answer.delay
      answers.append(answer)
    }
    return (answers, delay)
  }

  private func refuse(
    _ method: String, _ path: String, _ key: String?, _ status: Int, _ message: String, note: Note?
  )
    throws -> Answer
  {
    try append(
      method: method, path: path, key: key, outcome: .rejected, status: status, note: note, message: message)
    return Answer(status: status, body: errorBody(message), delay: false)
  }

  private func errorBody(_ message: String) -> String {
    (try? String(decoding: encoder.encode(["error": message]), as: UTF8.self)) ?? "{}"
  }

  private func append(
    method: String, path: String, key: String?, outcome: RecordLine.Outcome, status: Int, note: Note? = nil,
    response: RecordLine.StoredResponse? = nil, fingerprint: String? = nil, message: String? = nil
  ) throws {
    let line = RecordLine(
      seq: nextSeq, time: (Date().timeIntervalSince1970 * 1_000_000).rounded() / 1000, method: method,
      path: path,
      key: key, outcome: outcome, status: status, note: note, response: response, fingerprint: fingerprint,
      message: message)
    var bytes = [UInt8](try encoder.encode(line))
    bytes.append(UInt8(ascii: "\n"))
    var written = 0
    while written < bytes.count {
      let n = bytes[written...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
      if n < 0 {
        if errno == EINTR { continue }
        throw RecordError.io("writing the record: errno \(errno)")
      }
      written += n
    }
    guard fsync(fd) == 0 else { throw RecordError.io("fsync of the record: errno \(errno)") }
    nextSeq += 1
  }
}

/// Server ids are "s1", "s2", …: listed in number order.
private func noteOrder(_ a: String, _ b: String) -> Bool {
  switch (Int(a.dropFirst()), Int(b.dropFirst())) {
  case (let x?, let y?): x < y
  default: a < b
  }
}

struct ChangeBody: Codable {
  var title: String
  var body: String
  var revision: Int?
}

/// One change of a `POST /batch`: what its own request would carry, and its group.
struct BatchItem: Codable {
  var key: String
  var group: String?
  var method: String
  var path: String
  var body: ChangeBody
}

struct BatchBody: Codable {
  var items: [BatchItem]
}

struct BatchResult: Codable {
  var status: Int
  var body: String
}

struct BatchAnswer: Codable {
  var results: [BatchResult]
}

struct Created: Codable {
  var id: String
}

struct NoteList: Codable {
  var notes: [Note]
}
