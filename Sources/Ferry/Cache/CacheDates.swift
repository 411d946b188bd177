import Foundation

extension CacheState {
  /// When the cache was last fetched successfully (nil with no cache).
  public var lastFetched: Date? {
    guard case .cache(_, let lastFetched, _, _) = content else { return nil }
    return lastFetched
  }

  /// How long ago that was (nil with no cache).
  public var age: Duration? {
    guard case .cache(_, _, let age, _) = content else { return nil }
    return age
  }
}
