import Testing
@testable import LMDB

@Test func placeholder() {}
