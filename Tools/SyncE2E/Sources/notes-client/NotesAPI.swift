import Foundation

#if canImport(FoundationNetworking)
  import FoundationNetworking
#endif

/// A note as the server sends it.
struct ServerNote: Codable, Sendable, Equatable {
  var id: String
  var title: String
  var body: String
  var revision: Int
}

/// The notes server over real HTTP, through URLSession as an app would use it.
struct NotesAPI: Sendable {
  enum Answer: Sendable {
    /// 2xx, with the body.
    case ok(Data)
    /// A status the server chose (4xx, 5xx), with its message.
    case status(Int, String)
    /// No answer: refused, reset, timed out.
    case unreachable(String)
  }

  let base: URL
  let session: URLSession

  init(base: URL) {
    let configuration = URLSessionConfiguration.ephemeral
    // A cached `GET /notes` would be a stale read that no server ever sent: never cache.
    configuration.urlCache = nil
    configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
    configuration.timeoutIntervalForRequest = 5
    configuration.timeoutIntervalForResource = 10
    self.base = base
    self.session = URLSession(configuration: configuration)
  }

  func send(
    _ method: String, _ path: String, body: some Encodable, idempotencyKey: String?
  ) async throws -> Answer {
    var request = URLRequest(url: base.appendingPathComponent(path))
    request.httpMethod = method
    request.setValue("application/json", forHTTPHeaderField: "Content-Type")
    // A batch carries a key per change in its body instead.
    if let idempotencyKey { request.setValue(idempotencyKey, forHTTPHeaderField: "Idempotency-Key") }
    request.httpBody = try JSONEncoder().encode(body)
    return try await perform(request)
  }

  func get(_ path: String) async throws -> Answer {
    try await perform(URLRequest(url: base.appendingPathComponent(path)))
  }

  private func perform(_ request: URLRequest) async throws -> Answer {
    let data: Data
    let response: URLResponse
    do {
      (data, response) = try await session.data(for: request)
    } catch {
      // Cancelled by the runner (a time limit, a stop): not the server's answer, so not a failure.
      try Task.checkCancellation()
      return .unreachable("\(error.localizedDescription)")
    }
    guard let http = response as? HTTPURLResponse else { return .unreachable("not an HTTP response") }
    if (200..<300).contains(http.statusCode) { return .ok(data) }
    let message = (try? JSONDecoder().decode([String: String].self, from: data))?["error"]
    return .status(http.statusCode, message ?? String(decoding: data.prefix(200), as: UTF8.self))
  }
}
