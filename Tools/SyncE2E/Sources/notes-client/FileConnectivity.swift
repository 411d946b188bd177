import Ferry
import Foundation

/// The network as the end-to-end script sets it: offline while `<directory>/offline` exists.
///
/// A flag file stands in for the system's reachability (NWPathMonitor on Apple platforms) so that
/// a script can cut every client's network at once without touching the machine's own. It is
/// polled, like a path monitor's updates arrive: a change is seen within `interval`.
final class FileConnectivity: Connectivity {
  let flagPath: String
  let interval: Duration

  init(directory: String, interval: Duration = .milliseconds(50)) {
    self.flagPath = directory + "/offline"
    self.interval = interval
  }

  var isOnline: Bool { !FileManager.default.fileExists(atPath: flagPath) }

  func changes() -> AsyncStream<Bool> {
    let (stream, continuation) = AsyncStream.makeStream(of: Bool.self, bufferingPolicy: .bufferingNewest(1))
    let poller = Task { [flagPath, interval] in
      var last = !FileManager.default.fileExists(atPath: flagPath)
      while !Task.isCancelled {
        try? await Task.sleep(for: interval)
        let now = !FileManager.default.fileExists(atPath: flagPath)
        if now != last {
          last = now
          continuation.yield(now)
        }
      }
      continuation.finish()
    }
    continuation.onTermination = { _ in poller.cancel() }
    return stream
  }
}
