@_spi(Engine) @_spi(Experimental) import Ferry
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
  configuration.writeAheadSegment = EventLog.hasWriteAheadSegment(in: path)
  return configuration
}

/// `ferry recover`: settles a store whose writer died with commits in its write-ahead segment (a
/// read-only open — every read command — refuses it with "needs recovery" until a read-write open
/// has replayed them). Reads first and writes only when that open is refused for this reason; the
/// store keeps its mode. Nothing else is changed.
package func recover(path: String, json: Bool, output: Output) async throws(ToolError) {
  try requireDirectory(path)
  let segment = EventLog.hasWriteAheadSegment(in: path)
  // Read first: a settled store is only read, and its head comes from that open.
  var head: UInt64?
  do {
    let store = try FerryStore.openReadOnly(at: path)
    defer { store.close() }
    head = try store.log.head()
  } catch FerryError.needsRecovery {
    head = nil
  } catch {
    throw ToolError.from(error)
  }
  let needed = head == nil
  var segmentAfter = segment
  if needed {
    do {
      let store = try await FerryStore.open(at: path, configuration: toolConfiguration(for: path))
      defer { store.close() }
      head = try store.log.head()
    } catch {
      throw ToolError.from(error)
    }
    segmentAfter = EventLog.hasWriteAheadSegment(in: path)
  }
  let settled = head ?? 0
  if json {
    output.line(jsonLine(RecoverJSON(recovered: needed, head: settled, writeAheadSegment: segmentAfter)))
  } else if needed {
    // A dead open may have replayed and removed the segment already, leaving only its mark.
    output.line(
      segment
        ? "recovered \(path): the commits in its write-ahead segment were replayed; log head \(settled), "
          + (segmentAfter ? "segment kept" : "segment gone")
        : "recovered \(path): an open that died part-way had replayed its segment; its mark is cleared; log head \(settled)"
    )
  } else {
    output.line("nothing to recover: \(path) is settled (log head \(settled))")
  }
}

/// Refuses a path that is not a directory (`noSuchStore`) before any open: commands that open a
/// store read-write never create one.
package func requireDirectory(_ path: String) throws(ToolError) {
  var isDirectory: ObjCBool = false
  guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue else {
    throw ToolError(.noSuchStore, "no store at \(path)")
  }
}
