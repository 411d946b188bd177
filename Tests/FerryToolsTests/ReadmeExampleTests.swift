import Foundation
import TestSupport
import Testing

/// The README's push and pull examples are the visible lines of Tools/readme-examples/*.swift,
/// which the build compiles and this suite runs on a real store: they cannot drift from the API.
@Suite(.timeLimit(.minutes(2))) struct ReadmeExampleTests {
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

  /// The Swift block that follows `<!-- snippet: NAME -->` in README.md.
  static func readmeBlock(_ name: String) throws -> [String]? {
    let readme = try String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8)
    let lines = readme.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    guard let marker = lines.firstIndex(of: "<!-- snippet: \(name) -->"),
      marker + 1 < lines.count, lines[marker + 1] == "```swift",
      let end = lines[(marker + 2)...].firstIndex(of: "```")
    else { return nil }
    return Array(lines[(marker + 2)..<end])
  }

  @Test(arguments: ["Push", "Pull"])
  func theReadmeShowsExactlyTheCompiledExample(_ name: String) throws {
    let block = try #require(try Self.readmeBlock(name), "README.md has no `<!-- snippet: \(name) -->` block")
    let example = try Self.visibleLines(of: name)
    #expect(!example.isEmpty)
    for (index, (shown, compiled)) in zip(block, example).enumerated() where shown != compiled {
      Issue.record("README \(name) line \(index + 1): \"\(shown)\" but the example has \"\(compiled)\"")
      break
    }
    #expect(block.count == example.count, "README \(name) has \(block.count) lines, the example \(example.count)")
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
      contentsOf: Self.root.appendingPathComponent("Sources/Ferry/Ferry.docc/SyncingWithAServer.md"), encoding: .utf8)
    let compiled = Set(
      try String(contentsOf: Self.root.appendingPathComponent("Tools/readme-examples/Sync.swift"), encoding: .utf8)
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
