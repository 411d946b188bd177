#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A mutex with one condition variable, on heap-allocated pthread objects that never move.
final class Condition: @unchecked Sendable {
  // Why @unchecked: this is the synchronisation primitive itself; the pthread objects are
  // allocated once, never moved, and destroyed in deinit when no thread can hold them.
  private let mutex: UnsafeMutablePointer<pthread_mutex_t>
  private let condition: UnsafeMutablePointer<pthread_cond_t>

  init() {
    mutex = .allocate(capacity: 1)
    mutex.initialize(to: pthread_mutex_t())
    pthread_mutex_init(mutex, nil)
    condition = .allocate(capacity: 1)
    condition.initialize(to: pthread_cond_t())
    pthread_cond_init(condition, nil)
  }

  deinit {
    pthread_cond_destroy(condition)
    pthread_mutex_destroy(mutex)
    condition.deallocate()
    mutex.deallocate()
  }

  func lock() { pthread_mutex_lock(mutex) }
  func unlock() { pthread_mutex_unlock(mutex) }
  /// Waits for a signal; the mutex must be held, and is held again on return.
  func wait() { pthread_cond_wait(condition, mutex) }
  func broadcast() { pthread_cond_broadcast(condition) }

  func withLock<R>(_ body: () throws -> R) rethrows -> R {
    lock()
    defer { unlock() }
    return try body()
  }
}
