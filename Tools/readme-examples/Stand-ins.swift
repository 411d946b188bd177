// snippet.hide
// swift-format-ignore-file
// Not formatted: the README shows these lines as they are written here (ReadmeExampleTests).
// snippet.show
import Foundation
import Synchronization

// What the README's examples call that belongs to an app, not to Ferry: a server API and a local
// database, small enough to run here (the examples run in a test, against a real store).

/// How the example server answers an upload.
enum SendResult: Sendable {
  case ok, offline, unauthorized
  case rejected(String)
}

/// An example server: accepts every upload, but is offline for the first upload of "dog.jpg".
/// It keeps what it was sent, with each request's idempotency key.
final class ExampleAPI: Sendable {
  private let log = Mutex<[(photo: String, key: String)]>([])

  func send(_ photo: String, idempotencyKey: String) async -> SendResult {
    let first = log.withLock { log in
      defer { log.append((photo, idempotencyKey)) }
      return !log.contains { $0.photo == photo }
    }
    return photo.contains("dog") && first ? .offline : .ok
  }

  var received: [(photo: String, key: String)] { log.withLock { $0 } }

  func notes() async throws -> [String] { ["buy milk", "call Sam"] }
}

/// An example local database of notes.
final class ExampleDatabase: Sendable {
  private let stored = Mutex<[String]?>(nil)
  func replaceNotes(_ notes: [String]) async throws { stored.withLock { $0 = notes } }
  func notes() async throws -> [String]? { stored.withLock { $0 } }
}

func render(_ notes: [String]?, _ age: Duration, _ isTooOld: Bool) {
  print("notes: \(notes ?? []), \(age) old\(isTooOld ? ", too old" : "")")
}

func show(_ message: String) { print("error: \(message)") }
