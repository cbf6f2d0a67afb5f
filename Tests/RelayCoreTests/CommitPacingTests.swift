import RelayCore
import Testing

@Suite struct CommitPacingTests {
    @Test func aCommitMayStartAtOnceUnlessTheLastStartedWithinTheInterval() {
        let pacing = CommitPacing(interval: .milliseconds(3))
        let last = ContinuousClock.now
        // Nothing committed yet: at once.
        #expect(pacing.wait(after: nil, now: last) == nil)
        // Within the interval: when it is over.
        #expect(pacing.wait(after: last, now: last) == .milliseconds(3))
        #expect(pacing.wait(after: last, now: last + .milliseconds(2)) == .milliseconds(1))
        // At or after its end: at once.
        #expect(pacing.wait(after: last, now: last + .milliseconds(3)) == nil)
        #expect(pacing.wait(after: last, now: last + .seconds(60)) == nil)
    }

    @Test func aZeroOrNegativeIntervalNeverHoldsACommitBack() {
        let last = ContinuousClock.now
        for interval in [Duration.zero, .milliseconds(-5)] {
            let pacing = CommitPacing(interval: interval)
            #expect(pacing.interval == .zero)
            #expect(pacing.wait(after: last, now: last) == nil)
        }
    }
}
