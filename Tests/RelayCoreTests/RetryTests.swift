import CoreMetrics
import RelayCore
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

/// Counts what it makes and each counter's value, for the test above.
private final class TestMetrics: MetricsFactory, Sendable {
    final class Handler: CounterHandler, RecorderHandler, TimerHandler, Sendable {
        let total = Mutex<Int64>(0)
        func increment(by amount: Int64) { total.withLock { $0 += amount } }
        func reset() { total.withLock { $0 = 0 } }
        func record(_ value: Int64) {}
        func record(_ value: Double) {}
        func recordNanoseconds(_ duration: Int64) {}
    }

    let made = Mutex(0)
    private let handlers = Mutex<[String: Handler]>([:])

    func value(of label: String, _ values: [String]) -> Int64? {
        handlers.withLock { $0[([label] + values).joined(separator: "|")] }?.total.withLock { $0 }
    }

    func makeCounter(label: String, dimensions: [(String, String)]) -> any CounterHandler {
        made.withLock { $0 += 1 }
        let key = ([label] + dimensions.map(\.1)).joined(separator: "|")
        return handlers.withLock { handlers in
            if let existing = handlers[key] { return existing }
            let handler = Handler()
            handlers[key] = handler
            return handler
        }
    }
    func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any RecorderHandler { Handler() }
    func makeTimer(label: String, dimensions: [(String, String)]) -> any TimerHandler { Handler() }
    func destroyCounter(_ handler: any CounterHandler) {}
    func destroyRecorder(_ handler: any RecorderHandler) {}
    func destroyTimer(_ handler: any TimerHandler) {}
}
