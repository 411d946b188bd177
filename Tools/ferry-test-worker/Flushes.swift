import CFerryFlushCount
// A mode that counts what a process flushes to the disk: the flushes behind each promise of
// durability, counted by the C library's calls rather than by Ferry's own bookkeeping.
@_spi(Experimental) import Ferry
import Foundation

let flushModes: [String: Mode] = [
  // Counts the flushes (fsync, fdatasync, msync with MS_SYNC, by Ferry and LMDB alike) of one add
  // and of one pass that runs the one runnable task, after a warm-up of each (the first commit
  // of a process with the segment checkpoints). Prints "add N pass M".
  "count-flushes": Mode(usage: "DIR SEGMENT|FLUSHED") { call in
    call.expect(1...1)
    let segment: Bool
    switch call.word(0) {
    case "SEGMENT": segment = true
    case "FLUSHED": segment = false
    default: call.usageError()
    }
    call.runAsync {
      var configuration = FerryStore.Configuration()
      configuration.writeAheadSegment = segment
      let store = try await FerryStore.open(at: call.directory, configuration: configuration)
      let runner = TaskRunner(queue: store.queue)
      runner.register(tag: "job") { _ in .succeeded }
      try await store.queue.add(tag: "job", payload: ["item": "milk"])
      _ = try await runner.run()
      var before = ferry_flush_count()
      try await store.queue.add(tag: "job", payload: ["item": "eggs"])
      let add = ferry_flush_count() - before
      before = ferry_flush_count()
      let report = try await runner.run()
      let pass = ferry_flush_count() - before
      guard report.ran == 1 else { fail("the pass ran \(report.ran) tasks, not 1") }
      store.close()
      say("add \(add) pass \(pass)")
    }
  }
]
