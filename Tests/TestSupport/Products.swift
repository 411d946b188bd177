import Foundation

/// The build directory holding the running test bundle and this package's executables.
public func productsDirectory() -> URL {
  for bundle in Bundle.allBundles where bundle.bundlePath.hasSuffix(".xctest") {
    return bundle.bundleURL.deletingLastPathComponent()
  }
  return URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
}

/// One of this package's executables.
public func productURL(_ name: String) -> URL { productsDirectory().appendingPathComponent(name) }
