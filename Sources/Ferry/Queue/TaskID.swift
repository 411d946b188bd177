import FerryLog
import Foundation

/// A task's id: the sequence number of the event that added it. Ids are never reused, and their
/// order is the order tasks were added (FIFO by log order, never by wall clock).
public typealias TaskID = UInt64
