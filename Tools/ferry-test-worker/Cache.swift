// Modes that record cache fetches from another process.
@_spi(Engine) @_spi(Experimental) import Ferry
import Foundation

let cacheModes: [String: Mode] = [
  // Records a successful fetch of KEY (now, or at MS: Unix milliseconds — the time of a parent's
  // test clock) in the store, as another process refreshing a cache; says "recorded".
  "record-fetch": Mode(usage: "DIR KEY [MS]") { call in
    call.expect(1...2)
    let key = call.words[0]
    let at = call.word(1).map { _ in Date(timeIntervalSince1970: call.number(1, as: Double.self) / 1000) }
    call.runAsync {
      let store = try await FerryStore.open(at: call.directory)
      try await store.ledger.recordFetch(key: key, outcome: .success(isEmpty: false), at: at)
      store.close()
      say("recorded")
    }
  },
  // Opens the existing store and records COUNT failed fetches of keys "big-I", each with a message
  // of 60 KiB (so the map grows), one by one, saying "ack I" after each; then closes and says
  // "closed".
  "record-large-failures": Mode(usage: "DIR COUNT") { call in
    call.expect(1...1)
    let count = call.number(0)
    call.runAsync {
      let store = try await FerryStore.open(
        at: call.directory, configuration: storeConfiguration(existing: true))
      let message = String(repeating: "x", count: 60 * 1024)
      for i in 0..<count {
        try await store.ledger.recordFetch(key: "big-\(i)", outcome: .failure(message + "\(i)"))
        say("ack \(i)")
      }
      store.close()
      say("closed")
    }
  },
]
