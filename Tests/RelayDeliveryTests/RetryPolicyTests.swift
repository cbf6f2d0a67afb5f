import RelayCore
@testable import RelayDelivery
import Testing

/// The retry schedule's arithmetic, at the default (uncompressed) values.
@Suite struct RetryPolicyTests {
    let policy = RetryPolicy(schedule: [.seconds(5), .seconds(300), .seconds(1800), .seconds(7200), .seconds(18000), .seconds(36000), .seconds(36000)])

    @Test func eachStepIsJitteredByAtMostTwentyPercentAndTheLastFailureDeadLetters() {
        #expect(policy.next(afterAttempt: 1, failure: .init(status: 500), random: 0) == .retry(step: 1, waitMilliseconds: 4000))
        #expect(policy.next(afterAttempt: 1, failure: .init(status: 500), random: 0.5) == .retry(step: 1, waitMilliseconds: 5000))
        #expect(policy.next(afterAttempt: 1, failure: .init(status: 500), random: 0.999_999) == .retry(step: 1, waitMilliseconds: 6000))
        #expect(policy.next(afterAttempt: 2, failure: .init(status: 500), random: 0.5) == .retry(step: 2, waitMilliseconds: 300_000))
        #expect(policy.next(afterAttempt: 7, failure: .init(status: 500), random: 0.5) == .retry(step: 7, waitMilliseconds: 36_000_000))
        #expect(policy.next(afterAttempt: 8, failure: .init(status: 500), random: 0.5) == .deadLetter)
        #expect(RetryPolicy(schedule: []).next(afterAttempt: 1, failure: .init(status: 500), random: 0.5) == .deadLetter)
    }

    @Test func aTooManyRequestsOrATimeoutWaitsAtLeastSixtySeconds() {
        #expect(policy.next(afterAttempt: 1, failure: .init(status: 429), random: 0.5) == .retry(step: 1, waitMilliseconds: 60_000))
        #expect(policy.next(afterAttempt: 1, failure: .init(status: nil, timedOut: true), random: 0.5) == .retry(step: 1, waitMilliseconds: 60_000))
        #expect(policy.next(afterAttempt: 2, failure: .init(status: 429), random: 0.5) == .retry(step: 2, waitMilliseconds: 300_000))
        #expect(policy.next(afterAttempt: 1, failure: .init(status: 503), random: 0.5) == .retry(step: 1, waitMilliseconds: 5000))
    }

    @Test func retryAfterIsHonouredBetweenOnceAndTwiceTheScheduledWait() {
        func wait(_ retryAfter: Int64) -> RetryPolicy.Decision {
            policy.next(afterAttempt: 2, failure: .init(status: 503, retryAfterMilliseconds: retryAfter), random: 0.5)
        }
        #expect(wait(1000) == .retry(step: 2, waitMilliseconds: 300_000))
        #expect(wait(450_000) == .retry(step: 2, waitMilliseconds: 450_000))
        #expect(wait(86_400_000) == .retry(step: 2, waitMilliseconds: 600_000))
        // With a 429 the 60 s floor applies on top.
        #expect(policy.next(afterAttempt: 1, failure: .init(status: 429, retryAfterMilliseconds: 8000), random: 0.5) == .retry(step: 1, waitMilliseconds: 60_000))
    }

    @Test func aWaitLongerThanItsStepGoesToTheFirstStepThatHoldsIt() {
        #expect(policy.topicStep(forWait: 5000, from: 1) == 1)
        #expect(policy.topicStep(forWait: 6000, from: 1) == 1, "within the step's jitter")
        #expect(policy.topicStep(forWait: 60_000, from: 1) == 2, "a 429 after the first attempt waits in the 5 min topic")
        #expect(policy.topicStep(forWait: 600_000, from: 2) == 3)
        #expect(policy.topicStep(forWait: 100_000_000, from: 6) == 7, "the last step holds anything longer")
    }

    @Test func retryAfterReadsSecondsAndHTTPDates() {
        let now = Timestamp.milliseconds("1994-11-06T08:49:00Z")!
        #expect(RetryAfter.milliseconds("120", now: now) == 120_000)
        #expect(RetryAfter.milliseconds("Sun, 06 Nov 1994 08:49:37 GMT", now: now) == 37_000)
        #expect(RetryAfter.milliseconds("Sun, 06 Nov 1994 08:48:00 GMT", now: now) == 0)
        #expect(RetryAfter.milliseconds("soon", now: now) == nil)
        #expect(RetryAfter.milliseconds("-5", now: now) == nil)
        #expect(RetryAfter.milliseconds(nil, now: now) == nil)
    }

    @Test func theBreakerOpensAfterTheThresholdProbesAfterTheCooldownAndClosesOnSuccess() {
        var breaker = CircuitBreaker(threshold: 3, cooldownMilliseconds: 1000)
        #expect(breaker.record(success: false, now: 0) == .none)
        #expect(breaker.record(success: true, now: 0) == .none, "a success resets the count")
        #expect(breaker.record(success: false, now: 0) == .none)
        #expect(breaker.record(success: false, now: 0) == .none)
        #expect(breaker.record(success: false, now: 10) == .opened)
        #expect(breaker.admitNew(now: 500) == .divert)
        #expect(breaker.admitNew(now: 1010) == .probe)
        #expect(breaker.admitNew(now: 1011) == .divert, "one probe at a time")
        #expect(breaker.record(success: false, now: 1200) == .none)
        #expect(breaker.admitNew(now: 2100) == .divert, "a failed probe starts another cool-down")
        #expect(breaker.admitNew(now: 2200) == .probe)
        #expect(breaker.record(success: true, now: 2300) == .closed)
        #expect(breaker.admitNew(now: 2301) == .pass)
    }

    @Test func timestampsFormatAsRFC3339AndReadBack() {
        for milliseconds: Int64 in [0, 1_754_067_715_103, 951_782_400_000, 4_102_444_799_999, -1] {
            #expect(Timestamp.milliseconds(Timestamp.rfc3339(milliseconds: milliseconds)) == milliseconds)
        }
        #expect(Timestamp.rfc3339(milliseconds: 1_754_067_715_103) == "2025-08-01T17:01:55.103Z")
        #expect(Timestamp.rfc3339(milliseconds: 951_782_400_000) == "2000-02-29T00:00:00.000Z")
    }

    @Test func aTruncatedResponseStaysValidUTF8() {
        let body = Array(String(repeating: "é", count: 600).utf8)  // 1200 bytes
        let text = try! #require(DeliveryRecord.truncatedResponse(body))
        #expect(text.utf8.count == 1024)
        #expect(text.allSatisfy { $0 == "é" })
        #expect(DeliveryRecord.truncatedResponse([]) == nil)
    }
}
