// swift-tools-version: 6.1
// Ferry's benchmarks: a package of their own, so that `swift test` in the repository never builds
// GRDB. Run them with `bash Tools/bench.sh` (it links FerryPackage to the repository first).
import PackageDescription

let package = Package(
  name: "FerryBenchmarks",
  platforms: [.macOS(.v15)],
  dependencies: [
    .package(path: "FerryPackage"),
    .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
    .package(url: "https://github.com/apple/swift-metrics", from: "2.5.0"),
  ],
  targets: [
    .executableTarget(
      name: "ferry-bench",
      dependencies: [
        .product(name: "Ferry", package: "FerryPackage"),
        .product(name: "FerryLog", package: "FerryPackage"),
        .product(name: "LMDB", package: "FerryPackage"),
        .product(name: "FerryTesting", package: "FerryPackage"),
        .product(name: "GRDB", package: "GRDB.swift"),
        .product(name: "CoreMetrics", package: "swift-metrics"),
        "CFerryFlushCount",
      ],
      path: "Sources/ferry-bench"
    ),
    .target(name: "CFerryFlushCount", path: "Sources/CFerryFlushCount"),
  ],
  swiftLanguageModes: [.v6]
)
