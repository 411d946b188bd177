import Foundation
import Synchronization

#if canImport(Network)
  import Network
#endif

/// Whether the device can reach the network, as a runner reads it
/// (``TaskRunner/Configuration/connectivity``).
///
/// Offline is a state, not a failure: while ``isOnline`` is false a runner starts no run, so no
/// attempt is spent and no backoff grows; a retryable failure that ends then is a deferral. When
/// ``changes()`` yields `true`, automatic running and every window run a pass at once.
public protocol Connectivity: Sendable {
  /// Whether the network may be reached now. Read often, from any thread: keep it cheap.
  var isOnline: Bool { get }
  /// Every change of ``isOnline`` from now on (each call a stream of its own).
  func changes() -> AsyncStream<Bool>
  /// How many times the input has gone from online to offline so far: a runner compares it at a
  /// run's start and end, so that a drop during the run counts even when the network is back by
  /// the time the handler returns. An input that cannot count answers 0 (the default).
  var timesWentOffline: UInt64 { get }
}

extension Connectivity {
  /// Not counted: only the state at a run's end tells a drop.
  public var timesWentOffline: UInt64 { 0 }
}

/// A connectivity input set by hand: for tests, for a platform without a path monitor, or for an
/// app that learns of the network its own way.
///
/// ```swift
/// let network = ManualConnectivity(online: false)
/// var configuration = TaskRunner.Configuration()
/// configuration.connectivity = network
/// let runner = TaskRunner(queue: store.queue, configuration: configuration)
/// network.set(online: true)          // waiting work goes on at once
/// ```
public final class ManualConnectivity: Connectivity {
  private struct State {
    var online: Bool
    var streams: [Int: AsyncStream<Bool>.Continuation] = [:]
    var next = 0
    var wentOffline: UInt64 = 0
  }
  private let state: Mutex<State>

  /// An input that reads `online` until ``set(online:)`` changes it.
  public init(online: Bool = true) { state = Mutex(State(online: online)) }

  /// The state last set.
  public var isOnline: Bool { state.withLock { $0.online } }

  /// How many times ``set(online:)`` took it from online to offline.
  public var timesWentOffline: UInt64 { state.withLock { $0.wentOffline } }

  /// Sets the state; a change is told to every stream.
  public func set(online: Bool) {
    let streams = state.withLock { s -> [AsyncStream<Bool>.Continuation] in
      guard s.online != online else { return [] }
      s.online = online
      if !online { s.wentOffline &+= 1 }
      return Array(s.streams.values)
    }
    for stream in streams { stream.yield(online) }
  }

  /// Every change ``set(online:)`` makes from now on.
  public func changes() -> AsyncStream<Bool> {
    let (stream, continuation) = AsyncStream<Bool>.makeStream(bufferingPolicy: .bufferingNewest(16))
    let key = state.withLock { s -> Int in
      defer { s.next += 1 }
      s.streams[s.next] = continuation
      return s.next
    }
    continuation.onTermination = { [weak self] _ in
      _ = self?.state.withLock { $0.streams.removeValue(forKey: key) }
    }
    return stream
  }
}

#if canImport(Network)
  /// The device's network path, from `NWPathMonitor`: online while the path is satisfied.
  ///
  /// A satisfied path means a route exists, not that the server answers: a request that fails
  /// while online is the server's (or the route's) answer and counts as an attempt.
  public final class PathConnectivity: Connectivity {
    private let monitor: NWPathMonitor
    private let manual: ManualConnectivity

    /// Starts monitoring every interface (or those of `interfaceType`) on a queue of its own.
    public init(requiredInterfaceType interfaceType: NWInterface.InterfaceType? = nil) {
      monitor = interfaceType.map { NWPathMonitor(requiredInterfaceType: $0) } ?? NWPathMonitor()
      // Online until the monitor's first answer: a runner must not hold work back on a guess.
      let manual = ManualConnectivity(online: true)
      self.manual = manual
      monitor.pathUpdateHandler = { path in manual.set(online: path.status == .satisfied) }
      monitor.start(queue: DispatchQueue(label: "ferry.connectivity"))
    }

    deinit { monitor.cancel() }

    /// Whether the path was satisfied at the monitor's last update.
    public var isOnline: Bool { manual.isOnline }
    /// How many times the path went from satisfied to not.
    public var timesWentOffline: UInt64 { manual.timesWentOffline }
    /// Every change of the path's state from now on.
    public func changes() -> AsyncStream<Bool> { manual.changes() }
  }
#endif
