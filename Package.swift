// swift-tools-version: 6.1
import PackageDescription

let package = Package(
  name: "Ferry",
  platforms: [.macOS(.v15), .iOS(.v18)],
  products: [
    .library(name: "LMDB", targets: ["LMDB"]),
    .library(name: "FerryLog", targets: ["FerryLog"]),
    .library(name: "Ferry", targets: ["Ferry"]),
    .library(name: "FerryTesting", targets: ["FerryTesting"]),
    .executable(name: "ferry", targets: ["ferry"]),
  ],
  dependencies: [
    .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
    .package(url: "https://github.com/x-sheep/swift-property-based", from: "2.0.0"),
    .package(url: "https://github.com/apple/swift-log", from: "1.6.0"),
    .package(url: "https://github.com/apple/swift-metrics", from: "2.5.0"),
    // `swift package generate-documentation` (Tools/docs.sh); a plugin only, never linked.
    .package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.4.0"),
    // Tests only: proves that a Clock<Duration> from another package drives a store.
    .package(url: "https://github.com/pointfreeco/swift-clocks", from: "1.0.0"),
  ],
  targets: [
    .systemLibrary(
      name: "CFerryLMDB",
      pkgConfig: "lmdb",
      providers: [.apt(["liblmdb-dev"]), .brew(["lmdb"])]
    ),
    .target(name: "LMDB", dependencies: ["CFerryLMDB"]),
    // CRC-32C with the CPU's instruction (SSE4.2, ARMv8 CRC); FerryLog falls back to software.
    .target(name: "CFerryCRC", path: "Sources/CFerryCRC"),
    .target(
      name: "FerryLog",
      dependencies: [
        "LMDB", "CFerryCRC", .product(name: "Logging", package: "swift-log"),
        .product(name: "CoreMetrics", package: "swift-metrics"),
      ]),
    .target(
      name: "Ferry",
      dependencies: [
        "FerryLog", .product(name: "Logging", package: "swift-log"),
        .product(name: "CoreMetrics", package: "swift-metrics"),
      ]),
    .target(name: "FerryTesting", dependencies: ["Ferry", "FerryLog"]),
    .target(name: "FerryTools", dependencies: ["Ferry", "FerryLog", "LMDB"]),
    // The crash tests' workload and invariant check: built into the crash worker and the tests, never the CLI.
    .target(name: "FerryCrashWorkload", dependencies: ["Ferry", "FerryLog", "FerryTesting"]),
    .executableTarget(
      name: "ferry",
      dependencies: [
        "FerryTools", "FerryLog",
        .product(name: "ArgumentParser", package: "swift-argument-parser"),
      ],
      path: "Tools/ferry"
    ),
    .executableTarget(
      name: "ferry-test-worker",
      dependencies: ["Ferry", "FerryLog", "FerryTools", "LMDB", "CFerryLMDB", "CFerryFlushCount"],
      path: "Tools/ferry-test-worker"
    ),
    // Counts the flushes a process makes (fsync, fdatasync, msync): the test worker's and the
    // benchmark's, never the library's. Not a product.
    .target(name: "CFerryFlushCount", path: "Sources/CFerryFlushCount"),
    // The README's push and pull examples, compiled and run by ReadmeExampleTests.
    .executableTarget(
      name: "ferry-readme-examples", dependencies: ["Ferry"], path: "Tools/readme-examples"),
    // Counts instructions of one workload under callgrind (Tools/cost.sh); not a product.
    .target(name: "CFerryCost", path: "Sources/CFerryCost"),
    .executableTarget(
      name: "ferry-cost",
      dependencies: ["Ferry", "FerryLog", "CFerryCost"],
      path: "Tools/ferry-cost"
    ),
    .executableTarget(
      name: "ferry-crash-worker",
      dependencies: ["FerryCrashWorkload", "FerryLog"],
      path: "Tools/ferry-crash-worker"
    ),
    // Helpers the test targets share (where the built executables are); not a product.
    .target(name: "TestSupport", path: "Tests/TestSupport"),
    .testTarget(name: "LMDBTests", dependencies: ["LMDB", "TestSupport"]),
    .testTarget(
      name: "FerryTests",
      dependencies: [
        "Ferry", "FerryLog", "FerryTesting", "TestSupport",
        .product(name: "PropertyBased", package: "swift-property-based"),
        .product(name: "Logging", package: "swift-log"),
        .product(name: "CoreMetrics", package: "swift-metrics"),
        .product(name: "MetricsTestKit", package: "swift-metrics"),
        .product(name: "Clocks", package: "swift-clocks"),
      ]
    ),
    .testTarget(
      name: "FerryToolsTests",
      dependencies: [
        "FerryTools", "FerryCrashWorkload", "Ferry", "FerryLog", "FerryTesting", "LMDB", "TestSupport",
      ]),
    .testTarget(name: "FerryCrashTests", dependencies: ["TestSupport"], path: "Tests/Crash"),
    .testTarget(
      name: "FerryLogTests",
      dependencies: [
        "FerryLog", "LMDB", "TestSupport",
        .product(name: "PropertyBased", package: "swift-property-based"),
        .product(name: "Logging", package: "swift-log"),
        .product(name: "MetricsTestKit", package: "swift-metrics"),
      ]
    ),
  ],
  swiftLanguageModes: [.v6]
)
