import CoreMetrics
import Synchronization

/// A metrics backend for `--metrics`: what an exporter does on the hot path — counters as atomic
/// adds, recorders and timers keep a count, a sum and the largest value under a lock — so that
/// the benchmark shows what Ferry's metrics cost once an app has bootstrapped a backend.
final class BenchMetrics: MetricsFactory {
  final class Handler: CounterHandler, FloatingPointCounterHandler, RecorderHandler, MeterHandler,
    TimerHandler,
    Sendable
  {
    private let state = Mutex<(count: Int64, sum: Double, max: Double)>((0, 0, 0))
    private let total = Atomic<Int64>(0)

    func increment(by amount: Int64) { total.add(amount, ordering: .relaxed) }
    func increment(by amount: Double) { observe(amount) }
    func decrement(by amount: Double) { observe(-amount) }
    func reset() { total.store(0, ordering: .relaxed) }
    func record(_ value: Int64) { observe(Double(value)) }
    func record(_ value: Double) { observe(value) }
    func set(_ value: Int64) { observe(Double(value)) }
    func set(_ value: Double) { observe(value) }
    func recordNanoseconds(_ duration: Int64) { observe(Double(duration)) }

    private func observe(_ value: Double) {
      state.withLock { s in
        s.count += 1
        s.sum += value
        s.max = Swift.max(s.max, value)
      }
    }
  }

  private let handlers = Mutex<[String: Handler]>([:])

  private func handler(_ label: String, _ dimensions: [(String, String)]) -> Handler {
    let key = label + dimensions.map { "|\($0.0)=\($0.1)" }.joined()
    return handlers.withLock { handlers in
      if let known = handlers[key] { return known }
      let made = Handler()
      handlers[key] = made
      return made
    }
  }

  func makeCounter(label: String, dimensions: [(String, String)]) -> any CounterHandler {
    handler(label, dimensions)
  }
  func makeFloatingPointCounter(
    label: String, dimensions: [(String, String)]
  ) -> any FloatingPointCounterHandler {
    handler(label, dimensions)
  }
  func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any RecorderHandler {
    handler(label, dimensions)
  }
  func makeMeter(label: String, dimensions: [(String, String)]) -> any MeterHandler {
    handler(label, dimensions)
  }
  func makeTimer(label: String, dimensions: [(String, String)]) -> any TimerHandler {
    handler(label, dimensions)
  }
  func destroyCounter(_ handler: any CounterHandler) {}
  func destroyFloatingPointCounter(_ handler: any FloatingPointCounterHandler) {}
  func destroyRecorder(_ handler: any RecorderHandler) {}
  func destroyMeter(_ handler: any MeterHandler) {}
  func destroyTimer(_ handler: any TimerHandler) {}
}
