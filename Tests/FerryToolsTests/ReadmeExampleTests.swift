import Foundation
import TestSupport
import Testing

/// Every Swift block of the README is compiled: the push and pull examples are the visible lines of
/// Tools/readme-examples/*.swift, which the build compiles and this suite runs on a real store, and
/// the install section's manifest is compiled by SwiftPM here. They cannot drift from the API.
/// (The limit is a hang guard, far above a loaded machine's time.)
@Suite(.timeLimit(.minutes(20))) struct ReadmeExampleTests {
  /// The README's Swift blocks, each after a `<!-- snippet: NAME -->` line: the examples, and the
  /// install section's manifest.
  static let examples = ["Push", "Pull"]
  static let manifest = "Package"

  static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent()

  /// The lines of an example a reader sees: everything outside `// snippet.hide` … `// snippet.show`.
  static func visibleLines(of name: String) throws -> [String] {
    let text = try String(
      contentsOf: root.appendingPathComponent("Tools/readme-examples/\(name).swift"), encoding: .utf8)
    var visible: [String] = []
    var hidden = false
    for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
      switch line.trimmingCharacters(in: .whitespaces) {
      case "// snippet.hide": hidden = true
      case "// snippet.show": hidden = false
      default: if !hidden { visible.append(String(line)) }
      }
    }
    while visible.last?.isEmpty == true { visible.removeLast() }
    return visible
  }

  static func readmeLines() throws -> [String] {
    let readme = try String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8)
    return readme.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
  }

  /// The Swift block that follows `<!-- snippet: NAME -->` in README.md.
  static func readmeBlock(_ name: String) throws -> [String]? {
    let lines = try readmeLines()
    guard let marker = lines.firstIndex(of: "<!-- snippet: \(name) -->"),
      marker + 1 < lines.count, lines[marker + 1] == "```swift",
      let end = lines[(marker + 2)...].firstIndex(of: "```")
    else { return nil }
    return Array(lines[(marker + 2)..<end])
  }

  /// No Swift block in the README escapes the checks below: each is a named snippet this suite knows.
  @Test func everySwiftBlockOfTheReadmeIsChecked() throws {
    let lines = try Self.readmeLines()
    let known = Set((Self.examples + [Self.manifest]).map { "<!-- snippet: \($0) -->" })
    var blocks = 0
    for (index, line) in lines.enumerated() where line.hasPrefix("```swift") {
      blocks += 1
      let marker = index > 0 ? lines[index - 1] : ""
      #expect(known.contains(marker), "README line \(index + 1): a Swift block no test compiles (\(marker))")
    }
    #expect(blocks == known.count, "README has \(blocks) Swift blocks, the suite checks \(known.count)")
  }

  @Test(arguments: examples)
  func theReadmeShowsExactlyTheCompiledExample(_ name: String) throws {
    let block = try #require(try Self.readmeBlock(name), "README.md has no `<!-- snippet: \(name) -->` block")
    let example = try Self.visibleLines(of: name)
    #expect(!example.isEmpty)
    for (index, (shown, compiled)) in zip(block, example).enumerated() where shown != compiled {
      Issue.record("README \(name) line \(index + 1): \"\(shown)\" but the example has \"\(compiled)\"")
      break
    }
    #expect(
      block.count == example.count, "README \(name) has \(block.count) lines, the example \(example.count)")
  }

  /// The install section's manifest compiles (SwiftPM evaluates it, in a package of its own beside a
  /// link to this checkout at the path it names), and the products it links are this package's.
  @Test func theInstallManifestCompiles() throws {
    let manifest = try #require(try Self.readmeBlock(Self.manifest), "README.md has no manifest block")
    let app = FileManager.default.temporaryDirectory.appendingPathComponent(
      "ferry-readme-app-\(UUID().uuidString)")
    defer { try? FileManager.default.removeItem(at: app) }
    try FileManager.default.createDirectory(
      at: app.appendingPathComponent("Sources/NotesApp"), withIntermediateDirectories: true)
    try FileManager.default.createDirectory(
      at: app.appendingPathComponent("Packages"), withIntermediateDirectories: true)
    try FileManager.default.createSymbolicLink(
      at: app.appendingPathComponent("Packages/ferry"), withDestinationURL: Self.root)
    try (manifest.joined(separator: "\n") + "\n").write(
      to: app.appendingPathComponent("Package.swift"), atomically: true, encoding: .utf8)
    try "print(\"notes\")\n".write(
      to: app.appendingPathComponent("Sources/NotesApp/main.swift"), atomically: true, encoding: .utf8)

    // Scratch paths of their own: the test run may hold the lock on this checkout's .build.
    func dump(_ package: URL) throws -> (status: Int32, output: String) {
      let process = Process()
      process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
      process.arguments = [
        "swift", "package", "--package-path", package.path,
        "--scratch-path", app.appendingPathComponent(".scratch-\(package.lastPathComponent)").path,
        "dump-package",
      ]
      let out = Pipe()
      let errors = app.appendingPathComponent("stderr-\(package.lastPathComponent)")
      _ = FileManager.default.createFile(atPath: errors.path, contents: nil)
      process.standardOutput = out
      process.standardError = try FileHandle(forWritingTo: errors)
      try process.run()
      let output = String(decoding: out.fileHandleForReading.readAll(), as: UTF8.self)
      process.waitUntilExit()
      if process.terminationStatus != 0 {
        return (process.terminationStatus, try String(contentsOf: errors, encoding: .utf8))
      }
      return (process.terminationStatus, output)
    }
    struct Dump: Decodable {
      struct Product: Decodable { var name: String }
      struct Target: Decodable {
        struct Dependency: Decodable { var product: [String?]?, byName: [String?]?, target: [String?]? }
        var dependencies: [Dependency]
      }
      var products: [Product]?
      var targets: [Target]
    }
    let appDump = try dump(app)
    try #require(appDump.status == 0, "the README's manifest does not compile:\n\(appDump.output)")
    let ferryDump = try dump(Self.root)
    try #require(ferryDump.status == 0, "\(ferryDump.output)")
    let linked = try JSONDecoder().decode(Dump.self, from: Data(appDump.output.utf8)).targets
      .flatMap(\.dependencies).compactMap { ($0.product ?? $0.byName ?? $0.target)?.first ?? nil }
    let products = Set(
      try JSONDecoder().decode(Dump.self, from: Data(ferryDump.output.utf8)).products?.map(\.name) ?? [])
    #expect(linked == ["Ferry"], "the manifest links \(linked)")
    #expect(
      Set(linked).isSubset(of: products), "not products of this package: \(Set(linked).subtracting(products))"
    )
  }

  /// The examples run to the end on real stores (in a temporary directory) and print what the
  /// README's comments say they print.
  @Test func theExamplesRun() throws {
    let process = Process()
    process.executableURL = productURL("ferry-readme-examples")
    let out = Pipe()
    process.standardOutput = out
    process.standardError = out
    try process.run()
    let output = String(decoding: out.fileHandleForReading.readAll(), as: UTF8.self)
    process.waitUntilExit()
    #expect(process.terminationStatus == 0, "\(output)")
    #expect(output.contains("2 ran (1 succeeded, 0 failed, 1 deferred)"), "\(output)")
    #expect(output.contains("notes: [\"buy milk\", \"call Sam\"]"), "\(output)")
    #expect(output.hasSuffix("readme examples: ok\n"), "\(output)")
  }

  /// Every line of the "Syncing with a server" article's client-side Swift (its code blocks, less
  /// the one marked server side, less end-of-line comments) is a line of the compiled
  /// Tools/readme-examples/Sync.swift, which the example run executes.
  @Test func theSyncArticlesExamplesAreCompiledLines() throws {
    let article = try String(
      contentsOf: Self.root.appendingPathComponent("Sources/Ferry/Ferry.docc/SyncingWithAServer.md"),
      encoding: .utf8)
    let compiled = Set(
      try String(
        contentsOf: Self.root.appendingPathComponent("Tools/readme-examples/Sync.swift"), encoding: .utf8
      )
      .split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) })
    var blocks: [[String]] = []
    var current: [String]?
    for line in article.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
      if line == "```swift" {
        current = []
      } else if line == "```", let block = current {
        blocks.append(block)
        current = nil
      } else if current != nil {
        current?.append(line)
      }
    }
    let client = blocks.filter { $0.first?.hasPrefix("// Server side") != true }
    #expect(client.count >= 4)
    for line in client.joined() {
      var code = line
      if let comment = code.range(of: "   //") { code = String(code[..<comment.lowerBound]) }
      code = code.trimmingCharacters(in: .whitespaces)
      if code.isEmpty { continue }
      #expect(compiled.contains(code), "not in Sync.swift: \(code)")
    }
  }
}
