// swift-tools-version: 6.1
// Ferry's end-to-end proof against a real HTTP server: a notes server (Hummingbird) that keeps its
// own record of every request, and a notes client on Ferry. A package of its own, so that `swift
// test` in the repository never builds Hummingbird. Run it with `bash Tools/sync-e2e.sh`.
import Foundation
import PackageDescription

// SwiftPM names a path dependency by its directory's name, which is whatever the repository was
// cloned as ("ferry", "wt-e2e"): read it here instead of linking the repository under a fixed name.
let ferry = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
  .deletingLastPathComponent().lastPathComponent.lowercased()

let package = Package(
  name: "FerrySyncE2E",
  platforms: [.macOS(.v15)],
  dependencies: [
    .package(path: "../.."),
    .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.0.0"),
    .package(url: "https://github.com/apple/swift-log", from: "1.6.0"),
    .package(url: "https://github.com/apple/swift-http-types", from: "1.0.0"),
  ],
  targets: [
    .executableTarget(
      name: "notes-server",
      dependencies: [
        .product(name: "Hummingbird", package: "hummingbird"),
        .product(name: "Logging", package: "swift-log"),
        .product(name: "HTTPTypes", package: "swift-http-types"),
      ],
      path: "Sources/notes-server"
    ),
    .executableTarget(
      name: "notes-client",
      dependencies: [.product(name: "Ferry", package: ferry)],
      path: "Sources/notes-client"
    ),
  ],
  swiftLanguageModes: [.v6]
)
