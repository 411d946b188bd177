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

extension FileHandle {
  /// Everything up to the end of the file or pipe. A read that fails ends the data there: Foundation's
  /// `readDataToEndOfFile()` traps on a read error, which would take the whole test run down with it.
  public func readAll() -> Data {
    var data = Data()
    while true {
      guard let chunk = try? read(upToCount: 1 << 16), !chunk.isEmpty else { return data }
      data.append(chunk)
    }
  }
}
