#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A reader-writer lock on a heap-allocated `pthread_rwlock_t` (which must never move in memory).
///
/// Every LMDB transaction of this process holds it shared; growing the map holds it exclusively,
/// because `mdb_env_set_mapsize` may only run while this process has no transaction open.
final class ReadWriteLock: @unchecked Sendable {
  // Why @unchecked: the pthread rwlock is itself the synchronisation primitive, and its storage is
  // allocated once, never moved, and freed only in deinit when no thread can hold it.
  private let lock: UnsafeMutablePointer<pthread_rwlock_t>

  init() {
    lock = .allocate(capacity: 1)
    lock.initialize(to: pthread_rwlock_t())
    pthread_rwlock_init(lock, nil)
  }

  deinit {
    pthread_rwlock_destroy(lock)
    lock.deallocate()
  }

  func lockShared() { pthread_rwlock_rdlock(lock) }
  func lockExclusive() { pthread_rwlock_wrlock(lock) }
  func unlock() { pthread_rwlock_unlock(lock) }
}
