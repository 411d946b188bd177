import Foundation
import TestSupport

@testable import LMDB

/// A fresh directory under the system's temporary directory, removed by `remove()`.
struct ScratchDirectory {
  let path: String

  init(_ label: String = #function) {
    let safe = label.filter { $0.isLetter || $0.isNumber }
    path = FileManager.default.temporaryDirectory.path + "/ferry-lmdb-\(safe)-\(UUID().uuidString.prefix(8))"
  }

  /// A path inside it.
  func child(_ name: String) -> String { path + "/" + name }

  func remove() { try? FileManager.default.removeItem(atPath: path) }
}

func permissions(of path: String) throws -> Int {
  let attributes = try FileManager.default.attributesOfItem(atPath: path)
  return (attributes[.posixPermissions] as? NSNumber)?.intValue ?? -1
}

/// Runs a built executable of this package and returns its exit status and standard output.
func runProduct(_ name: String, _ arguments: [String]) throws -> (status: Int32, output: String) {
  let process = Process()
  process.executableURL = productURL(name)
  process.arguments = arguments
  let pipe = Pipe()
  process.standardOutput = pipe
  try process.run()
  // A hung child is killed after 20 minutes (a hang guard far above a loaded run) rather than
  // hanging the suite. The watchdog holds the process weakly: a strong hold kept it and its
  // pipes' descriptors open until then.
  let deadline = DispatchTime.now() + .seconds(20 * 60)
  DispatchQueue.global().asyncAfter(deadline: deadline) { [weak process] in
    if let process, process.isRunning { process.terminate() }
  }
  let data = pipe.fileHandleForReading.readAll()
  process.waitUntilExit()
  return (process.terminationStatus, String(decoding: data, as: UTF8.self))
}

extension UInt32 {
  /// The integer's four bytes, most significant first (so keys sort numerically).
  var bigEndianBytes: [UInt8] { withUnsafeBytes(of: bigEndian) { Array($0) } }
}
