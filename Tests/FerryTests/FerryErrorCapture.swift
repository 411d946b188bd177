@testable import Ferry

/// The error `body` threw, or nil. Typed: the compiler proves nothing but a ``FerryError`` escapes.
func thrownFerryError(_ body: () async throws(FerryError) -> Void) async -> FerryError? {
  do {
    try await body()
    return nil
  } catch {
    return error
  }
}
