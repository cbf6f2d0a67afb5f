import RelayCore
@testable import RelayKafka
import Testing

/// The consumer's bookkeeping state machine, driven directly: no broker, no librdkafka, no clock.
@Suite struct ConsumerBookkeepingTests {
    let p0 = TopicPartition(topic: "events", partition: 0)
    let p1 = TopicPartition(topic: "events", partition: 1)
    let p2 = TopicPartition(topic: "events", partition: 2)
    let p3 = TopicPartition(topic: "events", partition: 3)
    /// Any instant: the state machine only compares instants it was given.
    let start = ContinuousClock.now

    func record(_ partition: TopicPartition, _ offset: Int64, generation: UInt64) -> ConsumedRecord {
        ConsumedRecord(
            topic: partition.topic, partition: partition.partition, offset: offset, key: nil, value: [], headers: [],
            timestampMilliseconds: nil, assignmentGeneration: generation)
    }

    /// Hands out `offsets` of `partition`, expecting each to be delivered in `generation`.
    func handOut(_ book: inout ConsumerBookkeeping, _ partition: TopicPartition, _ offsets: some Sequence<Int64>, generation: UInt64) {
        for offset in offsets {
            #expect(book.handOut(partition, offset: offset) == .deliver(generation: generation), "offset \(offset) of \(partition)")
        }
    }

    func complete(_ book: inout ConsumerBookkeeping, _ partition: TopicPartition, _ offset: Int64, generation: UInt64) -> ConsumerBookkeeping.Completion {
        book.markDone(partition, offset: offset, generation: generation)
    }

    @Test func outOfOrderCompletionsStoreOffsetsInOrder() {
        var book = ConsumerBookkeeping(maxInFlight: 100)
        #expect(book.assign([p0]) == .resume([p0]))
        handOut(&book, p0, 0..<5, generation: 1)
        #expect(book.inFlight == 5)

        // 2 finishes first: 0 and 1 are still out, nothing may be stored.
        #expect(complete(&book, p0, 2, generation: 1) == .init(storeOffset: nil, inFlightChanged: true))
        #expect(complete(&book, p0, 0, generation: 1) == .init(storeOffset: 1, inFlightChanged: true))
        #expect(complete(&book, p0, 1, generation: 1) == .init(storeOffset: 3, inFlightChanged: true))
        #expect(complete(&book, p0, 4, generation: 1) == .init(storeOffset: nil, inFlightChanged: true))
        #expect(complete(&book, p0, 3, generation: 1) == .init(storeOffset: 5, inFlightChanged: true))
        // Done twice: nothing counted or stored again.
        #expect(complete(&book, p0, 3, generation: 1) == .init())
        #expect(book.inFlight == 0)
    }

    @Test func aCompletionForARevokedGenerationIsIgnored() {
        var book = ConsumerBookkeeping(maxInFlight: 100)
        #expect(book.assign([p0, p1]) == .resume([p0, p1]))
        handOut(&book, p0, [10, 11], generation: 1)
        handOut(&book, p1, [0], generation: 2)
        #expect(book.inFlight == 3)

        // Nothing of p0 paused or held: nothing to resume. Its records are no longer in flight.
        #expect(book.revoke([p0]) == .none)
        #expect(book.inFlight == 1)
        #expect(!book.isAssigned(p0, generation: 1))
        #expect(complete(&book, p0, 10, generation: 1) == .init())

        // Assigned again: a new generation; the old one's completions still store nothing.
        #expect(book.assign([p0]) == .resume([p0]))
        #expect(book.isAssigned(p0, generation: 3))
        handOut(&book, p0, [10, 11], generation: 3)
        #expect(complete(&book, p0, 10, generation: 1) == .init())
        #expect(complete(&book, p0, 11, generation: 1) == .init())
        #expect(book.inFlight == 3)
        #expect(complete(&book, p0, 10, generation: 3) == .init(storeOffset: 11, inFlightChanged: true))
        // The other partition was not touched.
        #expect(complete(&book, p1, 0, generation: 2) == .init(storeOffset: 1, inFlightChanged: true))
        #expect(book.inFlight == 1)
    }

    @Test func aRefetchedOffsetIsRefused() {
        var book = ConsumerBookkeeping(maxInFlight: 100)
        _ = book.assign([p0])
        handOut(&book, p0, [0, 1, 2], generation: 1)
        // Still in flight, or done: either way not handed out, counted or tracked again.
        #expect(book.handOut(p0, offset: 1) == .refetched)
        #expect(complete(&book, p0, 0, generation: 1) == .init(storeOffset: 1, inFlightChanged: true))
        #expect(book.handOut(p0, offset: 0) == .refetched)
        #expect(book.inFlight == 2)
        handOut(&book, p0, [3], generation: 1)
        // Offsets are still stored in order: nothing past 1 until 1 itself is done.
        #expect(complete(&book, p0, 2, generation: 1) == .init(storeOffset: nil, inFlightChanged: true))
        #expect(complete(&book, p0, 1, generation: 1) == .init(storeOffset: 3, inFlightChanged: true))
    }

    @Test func backPressureStopsPollingAtTheBoundAndResumesAtTheMark() {
        var book = ConsumerBookkeeping(maxInFlight: 8)
        #expect(book.resumeMark == 6)
        _ = book.assign([p0])
        handOut(&book, p0, 0..<7, generation: 1)
        #expect(book.checkRoom(now: start) == .poll)
        handOut(&book, p0, [7], generation: 1)
        #expect(book.checkRoom(now: start) == .waitForRoom)

        // Hysteresis: still waiting at 7 and 6 records out; the wait ends below 6, signalled once.
        #expect(complete(&book, p0, 0, generation: 1).signalRoom == false)
        #expect(book.checkRoom(now: start + .seconds(1)) == .waitForRoom)
        #expect(complete(&book, p0, 1, generation: 1).signalRoom == false)
        #expect(book.checkRoom(now: start + .seconds(2)) == .waitForRoom)
        #expect(complete(&book, p0, 2, generation: 1) == .init(storeOffset: 3, inFlightChanged: true, signalRoom: true))
        #expect(complete(&book, p0, 3, generation: 1).signalRoom == false)
        #expect(book.checkRoom(now: start + .seconds(3)) == .poll)

        // Back to the full bound: 7 out is not enough to stop again.
        handOut(&book, p0, 8..<11, generation: 1)
        #expect(book.inFlight == 7)
        #expect(book.checkRoom(now: start + .seconds(4)) == .poll)
        // Waiting never turned into pausing.
        #expect(book.applyBackPressure(now: start + .seconds(60)) == .none)
    }

    @Test func afterTheWaitPeriodPausesThePartitionsThatDeliveredAndResumesAtHalf() {
        var book = ConsumerBookkeeping(maxInFlight: 8)
        #expect(book.assign([p0, p1, p2]) == .resume([p0, p1, p2]))
        handOut(&book, p0, 0..<4, generation: 1)
        handOut(&book, p1, 0..<4, generation: 2)

        #expect(book.checkRoom(now: start) == .waitForRoom)
        #expect(book.applyBackPressure(now: start) == .none)
        let almost = start + ConsumerBookkeeping.pauseAfter - .milliseconds(1)
        #expect(book.checkRoom(now: almost) == .waitForRoom)
        #expect(book.applyBackPressure(now: almost) == .none)

        // After 10 s at the bound: poll on, with the partitions that delivered paused (p2 has not).
        let later = start + ConsumerBookkeeping.pauseAfter
        #expect(book.checkRoom(now: later) == .poll)
        #expect(book.applyBackPressure(now: later) == .pause([p0, p1], turnedOn: true))
        #expect(book.checkRoom(now: later) == .poll)
        #expect(book.applyBackPressure(now: later) == .none)

        // A partition that starts delivering now is paused on the next round; one assigned now starts paused.
        handOut(&book, p2, [0], generation: 3)
        #expect(book.applyBackPressure(now: later) == .pause([p2], turnedOn: false))
        #expect(book.assign([p3]) == .pause([p3]))
        #expect(book.inFlight == 9)

        // Resumed at half of maxInFlight (4 out), not before.
        for offset: Int64 in 0..<4 { _ = complete(&book, p0, offset, generation: 1) }
        #expect(book.inFlight == 5)
        #expect(book.applyBackPressure(now: later) == .none)
        _ = complete(&book, p1, 0, generation: 2)
        #expect(book.applyBackPressure(now: later) == .resume([p0, p1, p2, p3]))
        #expect(book.applyBackPressure(now: later) == .none)
        #expect(book.assign([p3]) == .resume([p3]))
    }

    @Test func heldRecordsPauseTheirPartitionOnceAndReleaseInLogOrderWhenDue() {
        var book = ConsumerBookkeeping(maxInFlight: 100)
        _ = book.assign([p0, p1])
        handOut(&book, p0, 0..<3, generation: 1)
        handOut(&book, p1, [0], generation: 2)

        #expect(book.hold(record(p0, 0, generation: 1), until: 2_000) == .pause([p0]))
        #expect(book.hold(record(p0, 1, generation: 1), until: 1_500) == .none)
        #expect(book.hold(record(p0, 2, generation: 1), until: 3_000) == .none)
        #expect(book.hold(record(p1, 0, generation: 2), until: 1_000) == .pause([p1]))
        #expect(book.heldCount == 4)
        // Held records are still in flight.
        #expect(book.inFlight == 4)

        var release = book.releaseDue(now: 999)
        #expect(release.records.isEmpty)
        #expect(release.resume == .none)

        // p1's record is due and p1 holds nothing more; p0's second record is due but waits behind the first.
        release = book.releaseDue(now: 1_999)
        #expect(release.records.map(\.offset) == [0])
        #expect(release.records.map(\.partition) == [1])
        #expect(release.resume == .resume([p1]))

        release = book.releaseDue(now: 2_000)
        #expect(release.records.map(\.offset) == [0, 1])
        #expect(release.resume == .none, "p0 still holds offset 2")

        release = book.releaseDue(now: 5_000)
        #expect(release.records.map(\.offset) == [2])
        #expect(release.resume == .resume([p0]))
        #expect(book.heldCount == 0)
        #expect(book.inFlight == 4)
    }

    /// Two records in flight (the limit), p0's held until 100, and back-pressure on after the wait.
    func heldUnderBackPressure() -> ConsumerBookkeeping {
        var book = ConsumerBookkeeping(maxInFlight: 2)
        _ = book.assign([p0, p1])
        handOut(&book, p0, [0], generation: 1)
        handOut(&book, p1, [0], generation: 2)
        #expect(book.hold(record(p0, 0, generation: 1), until: 100) == .pause([p0]))
        #expect(book.checkRoom(now: start) == .waitForRoom)
        #expect(book.checkRoom(now: start + .seconds(10)) == .poll)
        #expect(book.applyBackPressure(now: start + .seconds(10)) == .pause([p0, p1], turnedOn: true))
        return book
    }

    @Test func aReleasedPartitionStaysPausedWhileBackPressureIsOn() {
        var book = heldUnderBackPressure()

        // Due, but back-pressure keeps its partition paused.
        let release = book.releaseDue(now: 100)
        #expect(release.records.map(\.offset) == [0])
        #expect(release.resume == .none)

        _ = complete(&book, p0, 0, generation: 1)
        #expect(book.applyBackPressure(now: start + .seconds(11)) == .resume([p0, p1]))
    }

    @Test func endingBackPressureLeavesAPartitionThatHoldsARecordPaused() {
        var book = heldUnderBackPressure()

        _ = complete(&book, p1, 0, generation: 2)
        #expect(book.applyBackPressure(now: start + .seconds(11)) == .resume([p1]))

        // Resumed only once nothing is held any more.
        #expect(book.releaseDue(now: 99).resume == .none)
        let release = book.releaseDue(now: 100)
        #expect(release.records.map(\.offset) == [0])
        #expect(release.resume == .resume([p0]))
    }

    @Test func revokingAPartitionDropsItsHeldRecords() {
        var book = ConsumerBookkeeping(maxInFlight: 100)
        _ = book.assign([p0, p1])
        handOut(&book, p0, [0, 1], generation: 1)
        handOut(&book, p1, [0], generation: 2)
        #expect(book.hold(record(p0, 0, generation: 1), until: 100) == .pause([p0]))
        #expect(book.hold(record(p0, 1, generation: 1), until: 100) == .none)
        #expect(book.hold(record(p1, 0, generation: 2), until: 100) == .pause([p1]))

        // Its pause is lifted so none is left behind for a later assignment; its held records are gone.
        #expect(book.revoke([p0]) == .resume([p0]))
        #expect(book.heldCount == 1)
        #expect(book.inFlight == 1)
        // A record of the revoked assignment is not held either.
        #expect(book.hold(record(p0, 2, generation: 1), until: 100) == .none)
        #expect(book.heldCount == 1)

        let release = book.releaseDue(now: 100)
        #expect(release.records.map(\.partition) == [1])
        #expect(release.resume == .resume([p1]))
    }

    @Test func stoppedIntakeKeepsEveryPartitionPaused() {
        var book = ConsumerBookkeeping(maxInFlight: 8)
        _ = book.assign([p0, p1])
        handOut(&book, p0, [0, 1], generation: 1)
        #expect(book.hold(record(p0, 1, generation: 1), until: 100) == .pause([p0]))

        #expect(book.stopIntake() == .pause([p0, p1]))
        #expect(book.stopIntake() == .none)
        // Nothing resumes it: not completions, not released records, not a new assignment.
        _ = complete(&book, p0, 0, generation: 1)
        _ = complete(&book, p0, 1, generation: 1)
        #expect(book.inFlight == 0)
        #expect(book.applyBackPressure(now: start + .seconds(60)) == .none)
        let release = book.releaseDue(now: 100)
        #expect(release.records.map(\.offset) == [1])
        #expect(release.resume == .none)
        #expect(book.assign([p2]) == .pause([p2]))
        #expect(book.checkRoom(now: start) == .poll)
    }
}
