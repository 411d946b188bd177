import Foundation
import TestSupport
import Testing

@Suite(.timeLimit(.minutes(20))) struct HelpTextTests {
  static let commands = [
    "demo", "inspect", "log", "replay", "verify", "export", "import", "stats", "compact", "recover",
    "salvage", "cancel",
    "revive", "resolve", "forget", "pause", "resume",
  ]

  /// The help's prose (before USAGE) is paragraphs the parser wraps to the width itself: a line
  /// broken in the source mid-sentence shows as a short line inside a paragraph.
  @Test(arguments: commands)
  func helpIsNotHardWrappedMidSentence(_ command: String) throws {
    let help = try ferry([command, "--help"])
    #expect(help.status == 0)
    let prose = help.stdout.components(separatedBy: "USAGE:").first ?? ""
    #expect(help.stdout.contains("Example"))
    for paragraph in prose.components(separatedBy: "\n\n") {
      let lines = paragraph.split(separator: "\n")
      for line in lines.dropLast() {
        #expect(line.count >= 50, "a short line inside a paragraph of `ferry \(command) --help`: '\(line)'")
      }
    }
  }
}
