import FerryLog
import FerryTesting
import Foundation
import Synchronization
import TestSupport
import Testing

@testable import Ferry

/// Deferrals as a hostile app makes them: a deferred task that leaves the queue, the network
/// going away after a deferral, a window over a deferral. Counted from the runner's own log
/// ("pass ended" records), never timed: a loop that spins runs hundreds of passes in the half
/// second a loop that waits runs none in.
@Suite(.timeLimit(.minutes(20))) struct DeferralSpinTests {
  static func passes(_ sink: CapturingLogHandler.Sink) -> Int {
    sink.all.filter { $0.message == "pass ended" }.count
  }

  /// Passes run in about half a second of real time, the store's clock standing still.
  static func passesWhileIdle(_ sink: CapturingLogHandler.Sink) async throws -> Int {
    // Let whatever the last change woke settle first.
    try await Task.sleep(for: .milliseconds(200))
    let before = passes(sink)
    try await Task.sleep(for: .milliseconds(500))
    return passes(sink) - before
  }

  static func deferredOnce(_ queue: TaskQueue, _ id: TaskID) async throws {
    try await pollUntil {
      (try? queue.history(of: id).contains { $0.event == .runDeferred(reason: "portal") }) == true
    }
  }

  @Test func aDeferredTaskCancelledDoesNotMakeAutomaticRunningSpin() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let logs = CapturingLogHandler.Sink()
    let store = try await fixture.openStore { $0.logger = CapturingLogHandler.logger(logs) }
    defer { store.close() }
    let run = runner(store.queue) { $0.deferralDelay = .seconds(30) }
    run.register(tag: "t") { _ in .deferred("portal") }
    let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
    run.startAutomaticRunning()
    defer { run.stop() }
    try await Self.deferredOnce(store.queue, id)
    try await store.queue.cancel(id)
    // The deferral's time passes; the task it was for is gone, so nothing is due.
    fixture.time += 31_000
    let idle = try await Self.passesWhileIdle(logs)
    #expect(idle <= 2, "automatic running ran \(idle) passes with nothing to do")
  }

  @Test func theNetworkGoingAwayAfterADeferralDoesNotMakeAutomaticRunningSpin() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let logs = CapturingLogHandler.Sink()
    let store = try await fixture.openStore { $0.logger = CapturingLogHandler.logger(logs) }
    defer { store.close() }
    let network = ManualConnectivity(online: true)
    let run = runner(store.queue) {
      $0.deferralDelay = .seconds(30)
      $0.connectivity = network
    }
    run.register(tag: "t") { _ in .deferred("portal") }
    let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
    run.startAutomaticRunning()
    defer { run.stop() }
    try await Self.deferredOnce(store.queue, id)
    network.set(online: false)
    fixture.time += 31_000
    // Offline: nothing may start, so a pass a moment is all the loop can do — and should not.
    let idle = try await Self.passesWhileIdle(logs)
    #expect(idle <= 2, "automatic running ran \(idle) passes while offline")
    #expect(try store.queue.task(id)?.attemptsSpent == 0)
    network.set(online: true)
    run.register(tag: "t") { _ in .succeeded }
    try await pollUntil { (try? store.queue.task(id)) == nil }
  }

  @Test func aWindowOverACancelledDeferralDoesNotSpin() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let logs = CapturingLogHandler.Sink()
    let store = try await fixture.openStore { $0.logger = CapturingLogHandler.logger(logs) }
    defer { store.close() }
    let run = runner(store.queue) { $0.deferralDelay = .seconds(30) }
    run.register(tag: "t") { _ in .deferred("portal") }
    let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
    #expect(try await run.run().outcome(of: id) == .deferred("portal"))
    // Another task keeps the window waiting for a retry time.
    run.register(tag: "later") { _ in .failed("busy") }
    let later = try await store.queue.add(tag: "later", payload: Item(name: "b"))
    #expect(try await run.run(.task(later)).outcome(of: later) != nil)
    try await store.queue.cancel(id)
    fixture.time += 31_000
    let window = Task { try await run.run(for: .seconds(600)) }
    let idle = try await Self.passesWhileIdle(logs)
    #expect(idle <= 3, "a window ran \(idle) passes with nothing due")
    fixture.time += 601_000
    _ = try await window.value
  }
}
