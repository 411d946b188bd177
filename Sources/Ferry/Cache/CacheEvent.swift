import FerryLog

/// The events of the cache ledger, as `Specs/cache-events.md` specifies them (schema version 1).
enum CacheEvent: Equatable, Sendable {
  /// A fetch of `key` finished at `at`: a success (and whether the result was empty) or a failure.
  case fetched(key: String, at: Int64, outcome: FetchResult)
  /// The ledger forgets `key`.
  case forgotten(key: String)
  /// Paging state of `key`: what the next page needs, and whether more pages are available.
  case paging(key: String, next: [UInt8]?, morePagesAvailable: Bool)
  /// A repository's refresh was held back: `pendingTasks` tasks it waits for could still run.
  case refreshSkipped(key: String, pendingTasks: UInt32)

  static let types = ["cache.fetched", "cache.forgotten", "cache.paging", "cache.refreshSkipped"]
  static let typeSet = Set(types)

  var type: String {
    switch self {
    case .fetched: return "cache.fetched"
    case .forgotten: return "cache.forgotten"
    case .paging: return "cache.paging"
    case .refreshSkipped: return "cache.refreshSkipped"
    }
  }

  var newEvent: NewEvent {
    var writer = PayloadWriter()
    switch self {
    case .fetched(let key, let at, let outcome):
      writer.write(key)
      writer.write(at)
      switch outcome {
      case .success(let isEmpty):
        writer.write(UInt8(0))
        writer.write(isEmpty)
      case .failure(let message):
        writer.write(UInt8(1))
        writer.write(message)
      }
    case .forgotten(let key):
      writer.write(key)
    case .paging(let key, let next, let more):
      writer.write(key)
      writer.write(next != nil)
      if let next { writer.write(bytes: next) }
      writer.write(more)
    case .refreshSkipped(let key, let pending):
      writer.write(key)
      writer.write(pending)
    }
    return NewEvent(type: type, payload: writer.bytes)
  }

  init(_ event: LoggedEvent) throws(FerryError) {
    var reader = PayloadReader(event.payload)
    do {
      switch event.type {
      case "cache.fetched":
        let key = try reader.readString("key")
        let at = try reader.read(Int64.self, "at")
        let kind = try reader.read(UInt8.self, "outcome")
        switch kind {
        case 0: self = .fetched(key: key, at: at, outcome: .success(isEmpty: try reader.readBool("isEmpty")))
        case 1: self = .fetched(key: key, at: at, outcome: .failure(try reader.readString("message")))
        default: throw PayloadError("fetch outcome \(kind) is not known")
        }
      case "cache.forgotten":
        self = .forgotten(key: try reader.readString("key"))
      case "cache.paging":
        let key = try reader.readString("key")
        let next = try reader.readBool("hasNext") ? try reader.readBytes("next") : nil
        self = .paging(key: key, next: next, morePagesAvailable: try reader.readBool("morePagesAvailable"))
      case "cache.refreshSkipped":
        self = .refreshSkipped(
          key: try reader.readString("key"), pendingTasks: try reader.read(UInt32.self, "pendingTasks"))
      default:
        throw PayloadError("not an event of the cache ledger")
      }
      try reader.finish(event.type)
    } catch let error as PayloadError {
      throw .malformedEvent(sequence: event.sequence, type: event.type, reason: error.reason)
    } catch {
      throw .malformedEvent(sequence: event.sequence, type: event.type, reason: "\(error)")
    }
  }
}

/// How a fetch from the server ended.
public enum FetchResult: Sendable, Equatable {
  /// The response arrived and was saved; `isEmpty` says whether it held nothing.
  case success(isEmpty: Bool)
  /// The fetch (or saving its result) failed.
  case failure(String)
}
