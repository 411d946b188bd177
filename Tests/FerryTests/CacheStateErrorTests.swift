import Foundation
import Testing

@testable import Ferry

/// A repository's `currentState()` throws ``FerryError`` alone, like every other call of the API:
/// the typed `catch` below is what an app writes, and the compiler holds it to that.
@Suite struct CacheStateErrorTests {
  private func state<Value>(_ repository: CacheRepository<Value>) async -> FerryError? {
    do throws(FerryError) {
      _ = try await repository.currentState()
      return nil
    } catch {
      return error
    }
  }

  private func source() -> CacheSource<[String]> {
    CacheSource(fetch: { ["milk"] }, save: { _ in }, load: { ["milk"] })
  }

  @Test func theStateOfAClosedStoreIsClosed() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    let notes = try CacheRepository<[String]>(
      key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: source(), automaticRefresh: false)
    _ = await notes.refresh(force: true)
    #expect(await state(notes) == nil)
    store.close()
    #expect(await state(notes) == .closed)
  }

  @Test func theStateOfASuspendedStoreIsSuspended() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let notes = try CacheRepository<[String]>(
      key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: source(), automaticRefresh: false)
    await store.suspend()
    #expect(await state(notes) == .suspended)
    try await store.resume()
    #expect(await state(notes) == nil)
  }

  @Test func thePagedStateOfAClosedStoreIsClosed() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    let pages = try CachePagingRepository<[String], [String]>(
      key: "pages", ledger: store.ledger, maxAge: .seconds(60),
      source: PagingSource(fetchPage: { _ in (["milk"], nil) }, save: { _, _ in }, load: { nil }),
      automaticRefresh: false)
    store.close()
    do throws(FerryError) {
      _ = try await pages.currentState()
      Issue.record("the paged state of a closed store was read")
    } catch {
      #expect(error == .closed)
    }
  }
}
