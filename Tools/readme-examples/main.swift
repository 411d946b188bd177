// snippet.hide
// swift-format-ignore-file
// Not formatted: the README shows these lines as they are written here (ReadmeExampleTests).
// snippet.show
import Foundation

// Runs the README's examples (Push.swift, Pull.swift) on a real store in a temporary directory.
// A test checks that README.md shows exactly their visible lines and that this runs to the end.

let directory = FileManager.default.temporaryDirectory.path + "/ferry-readme-\(UUID().uuidString.prefix(8))"
defer { try? FileManager.default.removeItem(atPath: directory) }
try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
do {
  try await pushExample(storePath: directory + "/push", api: ExampleAPI())
  try await pullExample(storePath: directory + "/pull", api: ExampleAPI(), database: ExampleDatabase())
  try await syncExample(
    storePath: directory + "/sync", api: SyncAPI(), notesURL: URL(fileURLWithPath: "/notes-are-not-fetched-here"))
  print("readme examples: ok")
} catch {
  print("readme examples failed: \(error)")
  exit(1)
}
