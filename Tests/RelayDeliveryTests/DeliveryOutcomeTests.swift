import RelayCore
@testable import RelayDelivery
import RelayHTTPClient
import Testing

/// The deliverer's decision for one attempt, from its result alone: a table of results and what each
/// becomes.
@Suite struct DeliveryOutcomeTests {
    static let policy = RetryPolicy(schedule: [.seconds(5), .seconds(300), .seconds(1800)])
    static let now: Int64 = 1_900_000_000_000

    static func attempt(_ number: Int) -> DeliveryRecord {
        var delivery = DeliveryRecord(
            ConsumedRecord(
                topic: "relay.deliveries", partition: 0, offset: 0, key: nil, value: Array("{}".utf8),
                headers: [
                    RecordHeader(name: DeliveryHeaderName.endpoint, value: "hooks"), RecordHeader(name: RelayHeaderName.eventId, value: "evt"),
                ],
                timestampMilliseconds: nil, assignmentGeneration: 0))!
        delivery.attempts = number
        return delivery
    }

    static func response(_ status: Int, _ headers: [(String, String)] = [], body: String = "") -> HTTPTransferResult {
        HTTPTransferResult(response: HTTPClientResponse(status: status, headers: headers.map { (name: $0.0, value: $0.1) }, body: Array(body.utf8)))
    }

    static func error(_ kind: HTTPClientError.Kind) -> HTTPTransferResult {
        HTTPTransferResult(error: HTTPClientError(kind: kind, message: "test"))
    }

    /// A result, the attempt number, and what it must become: a short name, with the retry's topic step
    /// and wait (no jitter: random 0.5), and the recorded error.
    struct Case: Sendable, CustomTestStringConvertible {
        var name: String
        var result: HTTPTransferResult
        var attempt: Int
        var outcome: String
        var topicStep: Int? = nil
        var waitMilliseconds: Int64? = nil
        var lastError: String? = nil
        var testDescription: String { name }
    }

    static let cases: [Case] = [
        Case(name: "200", result: response(200), attempt: 1, outcome: "delivered"),
        Case(name: "204", result: response(204), attempt: 3, outcome: "delivered"),
        Case(name: "500, first attempt", result: response(500, body: "oops"), attempt: 1, outcome: "retry", topicStep: 1, waitMilliseconds: 5000, lastError: "HTTP 500"),
        Case(name: "500, last attempt", result: response(500), attempt: 4, outcome: "exhausted", lastError: "HTTP 500"),
        Case(name: "302 is a failure", result: response(302), attempt: 1, outcome: "retry", topicStep: 1, waitMilliseconds: 5000, lastError: "HTTP 302 (redirects are not followed)"),
        Case(name: "410", result: response(410), attempt: 1, outcome: "gone", lastError: "HTTP 410"),
        // 429: at least 60 s, which step 1's topic (5 s) cannot hold, so it goes to step 2's.
        Case(name: "429", result: response(429), attempt: 1, outcome: "retry", topicStep: 2, waitMilliseconds: 60_000, lastError: "HTTP 429"),
        // A 429 or 503 with Retry-After pauses the endpoint (within 1 s to 5 min), not an attempt spent.
        Case(name: "503 with Retry-After", result: response(503, [("retry-after", "8")]), attempt: 1, outcome: "throttled", waitMilliseconds: 8000, lastError: "HTTP 503"),
        Case(name: "429 with Retry-After 0", result: response(429, [("retry-after", "0")]), attempt: 2, outcome: "throttled", waitMilliseconds: 1000, lastError: "HTTP 429"),
        Case(name: "429 with Retry-After a day", result: response(429, [("retry-after", "86400")]), attempt: 1, outcome: "throttled", waitMilliseconds: 300_000, lastError: "HTTP 429"),
        // Retry-After on another failure is honoured up to twice the step.
        Case(name: "500 with Retry-After", result: response(500, [("retry-after", "8")]), attempt: 1, outcome: "retry", topicStep: 2, waitMilliseconds: 8000, lastError: "HTTP 500"),
        Case(name: "503 with an unreadable Retry-After", result: response(503, [("retry-after", "soon")]), attempt: 1, outcome: "retry", topicStep: 1, waitMilliseconds: 5000, lastError: "HTTP 503"),
        Case(name: "timeout", result: error(.timeout), attempt: 2, outcome: "retry", topicStep: 2, waitMilliseconds: 300_000, lastError: "timeout: test"),
        Case(name: "refused address", result: error(.addressRefused), attempt: 1, outcome: "retry", topicStep: 1, waitMilliseconds: 5000, lastError: "address_refused: test"),
        Case(name: "aborted by shutdown", result: error(.aborted), attempt: 1, outcome: "aborted"),
    ]

    @Test(arguments: cases)
    func eachResultBecomesItsOutcome(_ testCase: Case) {
        let outcome = DeliveryOutcome.classify(testCase.result, attempt: Self.attempt(testCase.attempt), policy: Self.policy, now: Self.now, random: { 0.5 })
        switch outcome {
        case .aborted: #expect(testCase.outcome == "aborted")
        case .delivered: #expect(testCase.outcome == "delivered")
        case .gone(let failed):
            #expect(testCase.outcome == "gone")
            #expect(failed.lastError == testCase.lastError)
        case .exhausted(let failed):
            #expect(testCase.outcome == "exhausted")
            #expect(failed.lastError == testCase.lastError)
        case .retry(let failed, let topicStep, let dueAt):
            #expect(testCase.outcome == "retry")
            #expect(topicStep == testCase.topicStep)
            #expect(dueAt - Self.now == testCase.waitMilliseconds)
            #expect(failed.lastError == testCase.lastError)
            #expect(failed.lastStatus == testCase.result.response?.status)
        case .throttled(let answered, let wait):
            #expect(testCase.outcome == "throttled")
            #expect(wait == testCase.waitMilliseconds)
            #expect(answered.lastError == testCase.lastError)
        }
    }

    /// Asking for time is free only within the schedule's span (35 min 5 s here) from the first attempt: an
    /// endpoint that asks forever still ends its deliveries in the dead-letter topic.
    @Test func aThrottleAfterTheSchedulesSpanIsAFailedAttempt() {
        func outcome(firstAttemptAgo: Int64, attempt: Int) -> DeliveryOutcome {
            var delivery = Self.attempt(attempt)
            delivery.firstAttemptAt = Self.now - firstAttemptAgo
            return DeliveryOutcome.classify(Self.response(429, [("retry-after", "30")]), attempt: delivery, policy: Self.policy, now: Self.now) { 0.5 }
        }
        let span = Self.policy.spanMilliseconds
        #expect(span == 2_105_000)
        guard case .throttled = outcome(firstAttemptAgo: span - 1, attempt: 1) else { Issue.record("within the span: not throttled"); return }
        guard case .retry = outcome(firstAttemptAgo: span, attempt: 1) else { Issue.record("past the span, attempt 1: not a retry"); return }
        guard case .exhausted(let failed) = outcome(firstAttemptAgo: span, attempt: 4) else { Issue.record("past the span, last attempt: not dead-lettered"); return }
        #expect(failed.lastError == "HTTP 429")
    }

    @Test func theJitterIsAskedForOnlyWhenARetryIsConsidered() {
        var asked = 0
        _ = DeliveryOutcome.classify(Self.response(200), attempt: Self.attempt(1), policy: Self.policy, now: Self.now) { asked += 1; return 0.5 }
        _ = DeliveryOutcome.classify(Self.response(410), attempt: Self.attempt(1), policy: Self.policy, now: Self.now) { asked += 1; return 0.5 }
        #expect(asked == 0)
        _ = DeliveryOutcome.classify(Self.response(500), attempt: Self.attempt(1), policy: Self.policy, now: Self.now) { asked += 1; return 0.5 }
        #expect(asked == 1)
    }
}
