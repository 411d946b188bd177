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
    // Tests only: proves that a Clock<Duration> from another package drives a store.
    .package(url: "https://github.com/pointfreeco/swift-clocks", from: "1.0.0"),
  ],
  targets: [
    .systemLibrary(
      name: "CLMDB",
      pkgConfig: "lmdb",
      providers: [.apt(["liblmdb-dev"]), .brew(["lmdb"])]
    ),
    .target(name: "LMDB", dependencies: ["CLMDB"]),
    .target(name: "FerryLog", dependencies: ["LMDB"]),
    .target(name: "Ferry", dependencies: ["FerryLog"]),
    .target(name: "FerryTesting", dependencies: ["Ferry", "FerryLog"]),
    .target(name: "FerryTools", dependencies: ["Ferry", "FerryLog", "FerryTesting", "LMDB"]),
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
      dependencies: ["Ferry", "FerryLog", "LMDB"],
      path: "Tools/ferry-test-worker"
    ),
    .executableTarget(
      name: "ferry-crash-worker",
      dependencies: ["FerryTools"],
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
        .product(name: "Clocks", package: "swift-clocks"),
      ]
    ),
    .testTarget(
      name: "FerryToolsTests",
      dependencies: ["FerryTools", "Ferry", "FerryLog", "FerryTesting", "TestSupport"]),
    .testTarget(name: "FerryCrashTests", dependencies: ["TestSupport"], path: "Tests/Crash"),
    .testTarget(
      name: "FerryLogTests",
      dependencies: [
        "FerryLog", "LMDB", "TestSupport",
        .product(name: "PropertyBased", package: "swift-property-based"),
      ]
    ),
  ],
  swiftLanguageModes: [.v6]
)
