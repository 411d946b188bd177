// Modes that add tasks to a store's queue from another process.
@_spi(Engine) @_spi(Experimental) import Ferry
import Foundation

let queueModes: [String: Mode] = [
  // Opens the store (creating it when missing) and adds COUNT tasks one by one, tag "app" and
  // data id "app-I", printing "ack ID I" once each add has returned. Exits 3 when the open fails.
  // With the write-ahead segment, the default, unless FERRY_WRITE_AHEAD_SEGMENT=0.
  "add-tasks": Mode(usage: "DIR COUNT") { call in
    call.expect(1...1)
    let count = call.number(0)
    call.runAsync {
      let queue: TaskQueue
      var configuration = FerryStore.Configuration()
      configuration.writeAheadSegment =
        ProcessInfo.processInfo.environment["FERRY_WRITE_AHEAD_SEGMENT"] != "0"
      do {
        queue = try await TaskQueue.open(at: call.directory, configuration: configuration)
      } catch {
        FileHandle.standardError.write(Data("open failed: \(error)\n".utf8))
        exit(3)
      }
      for i in 0..<count {
        let id = try await queue.add(tag: "app", payload: ["n": i], dataId: "app-\(i)")
        say("ack \(id) \(i)")
      }
      queue.close()
    }
  },
  // ROUNDS times: opens the store, adds one "app" task with data id "app-I", says "ack ID I" once
  // the add returned, closes, pauses 0-3 ms. An open that fails is tried again (not a round).
  "open-add-close-rounds": Mode(usage: "DIR ROUNDS") { call in
    call.expect(1...1)
    let rounds = call.number(0)
    call.runAsync {
      var i = 0
      while i < rounds {
        guard let queue = try? await TaskQueue.open(at: call.directory) else { continue }
        do {
          let id = try await queue.add(tag: "app", payload: ["n": i], dataId: "app-\(i)")
          say("ack \(id) \(i)")
        } catch {
          say("error \(error)")
        }
        i += 1
        queue.close()
        usleep(UInt32.random(in: 0...3000))
      }
      say("done")
    }
  },
  // Opens the existing store (with the write-ahead segment when "segment" is given) and adds
  // COUNT "job" tasks (payload kind "ok") with data id "dN" (N = i mod 3), unique keep or replace
  // chosen by SEED, printing "ack ID POLICY DATAID" once each add returned.
  "unique-adds": Mode(usage: "DIR COUNT SEED [segment]") { call in
    call.expect(2...3)
    let count = call.number(0)
    let firstSeed = call.number(1, as: UInt64.self)
    let segment = call.flag(2, "segment")
    call.runAsync(announce: true) {
      var seed = firstSeed
      let queue = try await TaskQueue.open(
        at: call.directory, configuration: storeConfiguration(existing: true, segment: segment))
      for i in 0..<count {
        seed = seed &* 6364136223846793005 &+ 1442695040888963407
        let policy: UniquePolicy = (seed >> 33) % 2 == 0 ? .keep : .replace
        let dataId = "d\(i % 3)"
        let id = try await queue.add(
          tag: "job", payload: ["kind": "ok"], dataId: dataId, options: [.unique(policy)])
        say("ack \(id) \(policy == .keep ? "keep" : "replace") \(dataId)")
      }
      queue.close()
      say("done")
    }
  },
]
