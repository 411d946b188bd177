// A helper process for Ferry's own tests: it acts on a store from another process, which is the
// only way to exercise what LMDB does across processes (map resizing, concurrent readers, locks).
// `ferry-test-worker MODE DIR [WORDS…]`; each subject's file says what its modes do.
import Foundation

let modeGroups = [
  logModes, environmentModes, storeModes, queueModes, runModes, cacheModes, rebuildModes, compactionModes,
  segmentModes, writerSpinModes, flushModes,
]
let modes = modeGroups.reduce(into: [String: Mode]()) { all, group in
  all.merge(group) { first, _ in fail("a mode is defined twice: \(first.usage)") }
}

let arguments = CommandLine.arguments
guard arguments.count >= 3, let mode = modes[arguments[1]] else {
  let usage = modes.keys.sorted().map { "  \($0) \(modes[$0]?.usage ?? "")" }.joined(separator: "\n")
  fail("usage: ferry-test-worker MODE DIR [ARGUMENTS]\n\(usage)")
}
mode.run(
  Invocation(
    mode: arguments[1], usage: mode.usage, directory: arguments[2], words: Array(arguments.dropFirst(3))))
