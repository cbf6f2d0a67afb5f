import Testing
@testable import RelayKafka

@Suite struct OffsetTrackerTests {
    @Test func storesTheNextOffsetWhenRecordsFinishInOrder() {
        var tracker = OffsetTracker()
        for offset in 10...12 { tracker.handedOut(Int64(offset)) }
        #expect(tracker.markDone(10).store == 11)
        #expect(tracker.markDone(11).store == 12)
        #expect(tracker.markDone(12).store == 13)
        #expect(tracker.pendingCount == 0)
    }

    @Test func storesOnlyTheContiguousDonePrefixWhenRecordsFinishOutOfOrder() {
        var tracker = OffsetTracker()
        for offset in 0...4 { tracker.handedOut(Int64(offset)) }
        #expect(tracker.markDone(1).store == nil)
        #expect(tracker.markDone(3).store == nil)
        #expect(tracker.markDone(4).store == nil)
        // 0 finishes: 0 and 1 are a done prefix, 2 is not.
        #expect(tracker.markDone(0).store == 2)
        // 2 finishes: everything through 4 is done.
        #expect(tracker.markDone(2).store == 5)
        #expect(tracker.storedOffset == 5)
    }

    @Test func ignoresUnknownAndRepeatedCompletions() {
        var tracker = OffsetTracker()
        tracker.handedOut(7)
        #expect(tracker.markDone(6) == (nil, false))
        #expect(tracker.markDone(7) == (8, true))
        #expect(tracker.markDone(7) == (nil, false))
        #expect(tracker.pendingCount == 0)
    }

    @Test func handlesGapsInOffsets() {
        // Compacted topics and transaction markers leave gaps between consecutive records.
        var tracker = OffsetTracker()
        tracker.handedOut(3)
        tracker.handedOut(9)
        #expect(tracker.markDone(9).store == nil)
        #expect(tracker.markDone(3).store == 10)
    }
}
