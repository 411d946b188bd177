#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A reader-writer lock on a heap-allocated `pthread_rwlock_t` (which must never move in memory),
/// whose shared side may be taken again by a thread that already holds it.
///
/// Every LMDB transaction of this process holds it shared; growing the map holds it exclusively,
/// because `mdb_env_set_mapsize` may only run while this process has no transaction open. A thread
/// that reads inside a read (a projection query inside `EventLog.read`, say) only counts up, so it
/// can never queue behind a waiting writer and deadlock on itself.
final class ReadWriteLock: @unchecked Sendable {
  // Why @unchecked: the pthread rwlock is itself the synchronisation primitive, and its storage is
  // allocated once, never moved, and freed only in deinit when no thread can hold it. The depth
  // counter is thread-specific data, touched only by its own thread.
  private let lock: UnsafeMutablePointer<pthread_rwlock_t>
  private var depthKey = pthread_key_t()

  init() throws(LMDBError) {
    lock = .allocate(capacity: 1)
    lock.initialize(to: pthread_rwlock_t())
    let initialized = pthread_rwlock_init(lock, nil)
    guard initialized == 0 else {
      lock.deallocate()
      throw LMDBError(code: initialized, operation: "pthread_rwlock_init")
    }
    let keyed = pthread_key_create(&depthKey, nil)
    guard keyed == 0 else {
      pthread_rwlock_destroy(lock)
      lock.deallocate()
      throw LMDBError(code: keyed, operation: "pthread_key_create")
    }
  }

  deinit {
    pthread_key_delete(depthKey)
    pthread_rwlock_destroy(lock)
    lock.deallocate()
  }

  /// How many times the calling thread holds the lock shared.
  var sharedDepth: Int { Int(bitPattern: pthread_getspecific(depthKey)) }

  func lockShared() {
    let depth = sharedDepth
    if depth == 0 { pthread_rwlock_rdlock(lock) }
    pthread_setspecific(depthKey, UnsafeRawPointer(bitPattern: depth + 1))
  }

  func unlockShared() {
    let depth = sharedDepth
    pthread_setspecific(depthKey, UnsafeRawPointer(bitPattern: depth - 1))
    if depth == 1 { pthread_rwlock_unlock(lock) }
  }

  /// Takes the lock exclusively; the caller must not hold it shared (see ``sharedDepth``).
  func lockExclusive() { pthread_rwlock_wrlock(lock) }
  func unlockExclusive() { pthread_rwlock_unlock(lock) }
}
