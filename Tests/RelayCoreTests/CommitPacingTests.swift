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
        let until = ContinuousClock.now + .milliseconds(20)
        #expect(CommitPacing.nanoseconds(until: until) > 0)
        #expect(CommitPacing.nanoseconds(until: until) <= 20_000_000)
        #expect(CommitPacing.nanoseconds(until: until - .seconds(1)) == 0)
    }
}
