import Testing
import RelayCore

@Suite struct OffsetTrackerTests {
    @Test func storesTheNextOffsetWhenRecordsFinishInOrder() {
        var tracker = OffsetTracker()
        for offset in 10...12 { _ = tracker.handOut(Int64(offset)) }
        let done1 = tracker.markDone(10)
        #expect(done1.store == 11)
        let done2 = tracker.markDone(11)
        #expect(done2.store == 12)
        let done3 = tracker.markDone(12)
        #expect(done3.store == 13)
        #expect(tracker.undoneCount == 0)
    }

    @Test func storesOnlyTheContiguousDonePrefixWhenRecordsFinishOutOfOrder() {
        var tracker = OffsetTracker()
        for offset in 0...4 { _ = tracker.handOut(Int64(offset)) }
        let done4 = tracker.markDone(1)
        #expect(done4.store == nil)
        let done5 = tracker.markDone(3)
        #expect(done5.store == nil)
        let done6 = tracker.markDone(4)
        #expect(done6.store == nil)
        // 0 finishes: 0 and 1 are a done prefix, 2 is not.
        let done7 = tracker.markDone(0)
        #expect(done7.store == 2)
        // 2 finishes: everything through 4 is done.
        let done8 = tracker.markDone(2)
        #expect(done8.store == 5)
        #expect(tracker.storedOffset == 5)
    }

    @Test func ignoresUnknownAndRepeatedCompletions() {
        var tracker = OffsetTracker()
        _ = tracker.handOut(7)
        let done9 = tracker.markDone(6)
        #expect(done9 == (nil, false))
        let done10 = tracker.markDone(7)
        #expect(done10 == (8, true))
        let done11 = tracker.markDone(7)
        #expect(done11 == (nil, false))
        #expect(tracker.undoneCount == 0)
    }

    @Test func handlesGapsInOffsets() {
        // Compacted topics and transaction markers leave gaps between consecutive records.
        var tracker = OffsetTracker()
        _ = tracker.handOut(3)
        _ = tracker.handOut(9)
        let done12 = tracker.markDone(9)
        #expect(done12.store == nil)
        let done13 = tracker.markDone(3)
        #expect(done13.store == 10)
    }

    @Test func countsOnlyUndoneRecordsAsInFlight() {
        var tracker = OffsetTracker()
        _ = tracker.handOut(10)
        _ = tracker.handOut(11)
        // 11 is done but waits behind 10: it is no longer in flight.
        let done14 = tracker.markDone(11)
        #expect(done14.store == nil)
        #expect(tracker.undoneCount == 1)
    }

    @Test func refetchedOffsetsAreNotHandedOutAgain() {
        var tracker = OffsetTracker()
        #expect(!tracker.hasHandedOut)
        let first = tracker.handOut(5)
        let second = tracker.handOut(6)
        #expect(first && second)
        // librdkafka refetches 5 and 6 while 5 is still being processed, and 6 is done.
        let done15 = tracker.markDone(6)
        #expect(done15.store == nil)
        let refetched1 = tracker.handOut(5)
        #expect(!refetched1)
        let refetched2 = tracker.handOut(6)
        #expect(!refetched2)
        #expect(tracker.undoneCount == 1)
        // The copy never stores past the unfinished original; the original does when it finishes.
        let done16 = tracker.markDone(5)
        #expect(done16.store == 7)
        let next = tracker.handOut(7)
        #expect(next)
    }
}
