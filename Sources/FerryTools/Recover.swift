import Ferry
import FerryLog
import Foundation

/// The stable JSON form of `ferry recover --json`.
package struct RecoverJSON: Codable, Sendable, Equatable {
  /// Whether the store needed recovery (its write-ahead segment held commits to replay).
  package var recovered: Bool
  /// The log's head after.
  package var head: UInt64
  /// Whether the store keeps a write-ahead segment.
  package var writeAheadSegment: Bool
}

/// The configuration with which a `ferry` command opens a store read-write: never creates one, and
/// keeps the store's mode — a store with a write-ahead segment keeps it (an open alone that does
/// not ask for the segment turns it off, which is the app's choice to make, not a tool's).
package func toolConfiguration(for path: String) -> FerryStore.Configuration {
  var configuration = FerryStore.Configuration()
  configuration.createIfMissing = false
  configuration.writeAheadSegment = FileManager.default.fileExists(atPath: path + "/ferry-segment")
  return configuration
}

/// `ferry recover`: settles a store whose writer died with commits in its write-ahead segment (a
/// read-only open — every read command — refuses it with "needs recovery" until a read-write open
/// has replayed them). Reads first and writes only when that open is refused for this reason; the
/// store keeps its mode. Nothing else is changed.
package func recover(path: String, json: Bool, output: Output) async throws(ToolError) {
  var isDirectory: ObjCBool = false
  guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue else {
    throw ToolError(.noSuchStore, "no store at \(path)")
  }
  let segment = FileManager.default.fileExists(atPath: path + "/ferry-segment")
  let needed: Bool
  do {
    let store = try FerryStore.openReadOnly(at: path)
    store.close()
    needed = false
  } catch FerryLogError.needsRecovery {
    needed = true
  } catch {
    throw ToolError.from(error)
  }
  let head: UInt64
  var segmentAfter = segment
  do {
    if needed {
      let store = try await FerryStore.open(at: path, configuration: toolConfiguration(for: path))
      defer { store.close() }
      head = try store.log.head()
      segmentAfter = FileManager.default.fileExists(atPath: path + "/ferry-segment")
    } else {
      let store = try FerryStore.openReadOnly(at: path)
      defer { store.close() }
      head = try store.log.head()
    }
  } catch {
    throw ToolError.from(error)
  }
  if json {
    output.line(jsonLine(RecoverJSON(recovered: needed, head: head, writeAheadSegment: segmentAfter)))
  } else if needed {
    // A dead open may have replayed and removed the segment already, leaving only its mark.
    output.line(
      segment
        ? "recovered \(path): the commits in its write-ahead segment were replayed; log head \(head), "
          + (segmentAfter ? "segment kept" : "segment gone")
        : "recovered \(path): an open that died part-way had replayed its segment; its mark is cleared; log head \(head)")
  } else {
    output.line("nothing to recover: \(path) is settled (log head \(head))")
  }
}
