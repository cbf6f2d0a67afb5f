import DequeModule

/// Tracks the records of one partition that were handed out and not yet done, and says which offset
/// may be stored: the first offset not yet done, so a crash redelivers exactly the unfinished records
/// and everything after them. Records finish in any order; the stored offset only ever moves forward
/// over a contiguous done prefix.
public struct OffsetTracker: Sendable {
    public init() {}

    /// Handed-out offsets, ascending, with whether each is done.
    private var pending: Deque<(offset: Int64, done: Bool)> = []
    /// The highest offset already returned for storing (exclusive: the next offset to consume).
    public private(set) var storedOffset: Int64?
    /// The highest offset handed out in this assignment.
    private var lastHandedOut: Int64?
    /// Handed out and not yet done (done records waiting behind an earlier unfinished one are not counted).
    public private(set) var undoneCount = 0

    /// A record at `offset` is about to be handed out. Returns false for an offset at or below one
    /// already handed out in this assignment (librdkafka refetched it): that record is either done or
    /// still being processed, so it must not be handed out, counted or tracked a second time.
    public mutating func handOut(_ offset: Int64) -> Bool {
        if let lastHandedOut, offset <= lastHandedOut { return false }
        lastHandedOut = offset
        pending.append((offset, false))
        undoneCount += 1
        return true
    }

    /// Marks `offset` done. Returns the offset to store (next offset to consume) when the done prefix
    /// grew, or nil when nothing new may be stored (an earlier record is still in flight, or the offset
    /// is unknown). Also returns whether the offset was pending at all.
    public mutating func markDone(_ offset: Int64) -> (store: Int64?, wasPending: Bool) {
        guard let index = index(of: offset), !pending[index].done else { return (nil, false) }
        pending[index].done = true
        undoneCount -= 1
        var advancedTo: Int64?
        while let first = pending.first, first.done {
            pending.removeFirst()
            advancedTo = first.offset + 1
        }
        guard let advancedTo, advancedTo > (storedOffset ?? Int64.min) else { return (nil, true) }
        storedOffset = advancedTo
        return (advancedTo, true)
    }

    /// Whether a record was handed out in this assignment, i.e. librdkafka's fetch position for the
    /// partition reflects this assignment rather than an earlier one.
    public var hasHandedOut: Bool { lastHandedOut != nil }

    /// Binary search: pending offsets are ascending.
    private func index(of offset: Int64) -> Int? {
        var low = 0
        var high = pending.count - 1
        while low <= high {
            let middle = (low + high) / 2
            let value = pending[middle].offset
            if value == offset { return middle }
            if value < offset { low = middle + 1 } else { high = middle - 1 }
        }
        return nil
    }
}
