import Testing
@testable import FerryLog

@Test func placeholder() {}
