import RelayCore
import Testing

@Suite struct CommitPacingTests {
    @Test func aCommitMayStartAtOnceUnlessTheLastStartedWithinTheInterval() {
        let pacing = CommitPacing(interval: .milliseconds(3))
        let last = ContinuousClock.now
        // Nothing committed yet: at once.
        #expect(pacing.due(after: nil, now: last) == nil)
        // Within the interval: when it is over.
        #expect(pacing.due(after: last, now: last) == last + .milliseconds(3))
        #expect(pacing.due(after: last, now: last + .milliseconds(2)) == last + .milliseconds(3))
        // At or after its end: at once.
        #expect(pacing.due(after: last, now: last + .milliseconds(3)) == nil)
        #expect(pacing.due(after: last, now: last + .seconds(60)) == nil)
    }

    @Test func aZeroOrNegativeIntervalNeverHoldsACommitBack() {
        let last = ContinuousClock.now
        for interval in [Duration.zero, .milliseconds(-5)] {
            let pacing = CommitPacing(interval: interval)
            #expect(pacing.interval == .zero)
            #expect(pacing.due(after: last, now: last) == nil)
        }
    }

    @Test func theDelayCountsDownToZero() {
        // A minute ahead: however long this thread is kept off a core, the delay is still under way.
        let until = ContinuousClock.now + .seconds(60)
        let delay = CommitPacing.nanoseconds(until: until)
        #expect(delay > 0 && delay <= 60_000_000_000)
        #expect(CommitPacing.nanoseconds(until: until) <= delay)
        #expect(CommitPacing.nanoseconds(until: ContinuousClock.now - .seconds(1)) == 0)
    }
}
