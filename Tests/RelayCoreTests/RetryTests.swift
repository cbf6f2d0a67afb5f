import CoreMetrics
import RelayCore
import RelayTestSupport
import Synchronization
import Testing

@Suite struct RetryTests {
    struct Failure: Error, Equatable {
        var retriable: Bool
        var attempt: Int
    }

    @Test func retriesARetriableFailureOncePerDelayThenThrowsTheLast() async {
        let attempts = Mutex(0)
        let retries = Mutex<[Int]>([])
        await #expect(throws: Failure(retriable: true, attempt: 3)) {
            try await withRetries(delays: [.milliseconds(1), .milliseconds(1)], isRetriable: \Failure.retriable) { _, retry in
                retries.withLock { $0.append(retry) }
            } _: { () async throws(Failure) -> Int in
                let attempt = attempts.withLock { $0 += 1; return $0 }
                throw Failure(retriable: true, attempt: attempt)
            }
        }
        #expect(attempts.withLock { $0 } == 3)
        #expect(retries.withLock { $0 } == [1, 2])
    }

    @Test func stopsAtTheFirstSuccessOrAFailureThatIsNotRetriable() async throws {
        let attempts = Mutex(0)
        let value = try await withRetries(delays: [.milliseconds(1), .milliseconds(1)], isRetriable: \Failure.retriable) {
            () async throws(Failure) -> Int in
            let attempt = attempts.withLock { $0 += 1; return $0 }
            if attempt < 2 { throw Failure(retriable: true, attempt: attempt) }
            return attempt
        }
        #expect(value == 2)
        attempts.withLock { $0 = 0 }
        await #expect(throws: Failure(retriable: false, attempt: 1)) {
            try await withRetries(delays: [.milliseconds(1)], isRetriable: \Failure.retriable) { () async throws(Failure) -> Int in
                let attempt = attempts.withLock { $0 += 1; return $0 }
                throw Failure(retriable: false, attempt: attempt)
            }
        }
        #expect(attempts.withLock { $0 } == 1)
    }

    @Test func backoffDoublesUpToItsMaximumAndGivesTheDelaysOfAFiniteRetry() {
        var backoff = Backoff(initial: .milliseconds(100), maximum: .milliseconds(350))
        #expect((0..<5).map { _ in backoff.next() } == [.milliseconds(100), .milliseconds(200), .milliseconds(350), .milliseconds(350), .milliseconds(350)])
        #expect(Backoff(initial: .seconds(1), maximum: .seconds(3)).delays(3) == [.seconds(1), .seconds(2), .seconds(3)])
        #expect(Backoff(initial: .seconds(1), maximum: .seconds(3)).delays(0).isEmpty)
    }

    @Test func theWaitBeforeARetryComesFromTheFailureAndTheScheduledDelay() async throws {
        let asked = Mutex<[Duration]>([])
        let attempts = Mutex(0)
        let value = try await withRetries(
            delays: [.milliseconds(7), .milliseconds(9)], isRetriable: \Failure.retriable,
            wait: { failure, scheduled in
                asked.withLock { $0.append(scheduled) }
                return failure.attempt == 1 ? .milliseconds(1) : scheduled
            }
        ) { () async throws(Failure) -> Int in
            let attempt = attempts.withLock { $0 += 1; return $0 }
            if attempt < 3 { throw Failure(retriable: true, attempt: attempt) }
            return attempt
        }
        #expect(value == 3)
        #expect(asked.withLock { $0 } == [.milliseconds(7), .milliseconds(9)])
    }
}

@Suite struct LabeledCountersTests {
    @Test func eachSetOfLabelValuesCountsOnItsOwnCounter() throws {
        let metrics = TestMetrics()
        let counters = LabeledCounters(label: "relay_test_total", factory: metrics)
        counters.increment([("store", "apple"), ("type", "renewal")])
        counters.increment([("store", "apple"), ("type", "renewal")], by: 2)
        counters.increment([("store", "stripe"), ("type", "renewal")])
        #expect(metrics.value(of: "relay_test_total", ["apple", "renewal"]) == 3)
        #expect(metrics.value(of: "relay_test_total", ["stripe", "renewal"]) == 1)
        // One counter made per label values, not per increment.
        #expect(metrics.made.withLock { $0 } == 2)
    }
}
