#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// The calling thread's `pthread_t` as a plain number, to be kept in a `Mutex` and compared.
///
/// On Apple platforms `pthread_t` is a pointer, which is not `Sendable`: Swift 6 refuses to move
/// one into a `Mutex`. Its bits are the thread's identity there as on Linux (where `pthread_t` is
/// already an integer, and `pthread_equal` compares the values), and stay valid while the thread
/// lives — as long as either holder below needs them.
package struct ThreadIdentity: Hashable, Sendable {
  private let bits: UInt

  /// The calling thread.
  package static var current: ThreadIdentity {
    #if canImport(Darwin)
      ThreadIdentity(bits: UInt(bitPattern: pthread_self()))
    #else
      ThreadIdentity(bits: UInt(pthread_self()))
    #endif
  }
}
