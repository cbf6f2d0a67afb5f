import Foundation
import RelayConfig
import RelayCore
import RelayDelivery
import RelayTestSupport
import Synchronization
import Testing

/// Per-endpoint limits, on an injected clock: `endpoints[].rateLimit`, and a 429 or 503 with `Retry-After`,
/// which pauses that endpoint only and spends no attempt.
@Suite(.serialized) struct EndpointThrottleTests {
    /// A wall clock the test moves; the deliverer's timers wait for it.
    final class ManualClock: Sendable {
        private let milliseconds: Atomic<Int64>
        init() { milliseconds = Atomic(wallClockMilliseconds()) }
        func advance(milliseconds step: Int64) { milliseconds.add(step, ordering: .relaxed) }
        var now: Int64 { milliseconds.load(ordering: .relaxed) }

        var options: DelivererOptions {
            var options = DelivererOptions()
            options.now = { self.now }
            options.sleepUntil = { at in
                while self.now < at, !Task.isCancelled { try? await Task.sleep(for: .milliseconds(5)) }
            }
            return options
        }
    }

    /// Answers with `statuses` in turn (the last one repeats) and `headers` on the first `throttled` answers.
    static func receiver(_ statuses: [Int], retryAfter: String? = nil) async throws -> TestHTTPServer {
        let served = Atomic<Int>(0)
        return try await TestHTTPServer { _ in
            let index = served.add(1, ordering: .relaxed).newValue - 1
            let status = statuses[min(index, statuses.count - 1)]
            let headers = (status == 429 || status == 503) ? retryAfter.map { [("Retry-After", $0)] } ?? [] : []
            return TestHTTPResponse(status: status, headers: headers, text: "")
        }
    }

    static func attempts(_ harness: DeliveryHarness) throws -> (any RecordConsumer, RecordCollector) {
        try harness.reader(harness.configuration.topics.attempts)
    }

    @Test(arguments: [429, 503]) func retryAfterPausesOnlyThatEndpointAndSpendsNoAttempt(status: Int) async throws {
        let clock = ManualClock()
        let slow = try await Self.receiver([status, 200], retryAfter: "30")
        let other = try await Self.receiver([200])
        let harness = try DeliveryHarness(
            endpoints: [("slow", slow.baseURL + "/hooks"), ("other", other.baseURL + "/hooks")], schedule: "[10s, 10s]", perEndpoint: 1,
            options: clock.options)
        let (retryReader, retries) = try harness.reader((1...2).map { harness.configuration.topics.retry(step: $0) })
        let (logReader, log) = try Self.attempts(harness)
        // One subscription's deliveries: they go in order, the paused one first.
        for index in 1...3 { try await harness.send(endpoint: "slow", eventID: "evt_\(index)", subject: "sub_1") }
        try harness.start()

        try await waitUntil("the first answer") { slow.requests.count == 1 }
        // Paused for 30 s of the deliverer's clock: the other endpoint goes on, this one sends nothing more.
        for index in 1...3 { try await harness.send(endpoint: "other", eventID: "evt_other_\(index)", subject: "sub_\(index)") }
        try await waitUntil("the other endpoint's deliveries") { other.requests.count == 3 }
        try await Task.sleep(for: .milliseconds(200))
        #expect(slow.requests.count == 1)
        clock.advance(milliseconds: 29_000)
        try await Task.sleep(for: .milliseconds(200))
        #expect(slow.requests.count == 1, "still paused 1 s before the Retry-After")

        clock.advance(milliseconds: 1_000)
        try await waitUntil("the paused deliveries") { slow.requests.count == 4 }
        // The throttled delivery goes again first, with the same webhook-id, then the subscription's next ones in order.
        #expect(slow.requests.compactMap { $0.headers["webhook-id"] } == ["evt_1", "evt_1", "evt_2", "evt_3"])
        // Not an attempt spent: nothing went to a retry topic, and the log shows attempt 1 throttled, then attempt 1 succeeded.
        #expect(retries.count == 0)
        let entries = try await log.attempts(count: 7)
        let first = entries.filter { $0.eventId == "evt_1" }
        #expect(first.map(\.outcome) == [.throttled, .succeeded])
        #expect(first.map(\.attempt) == [1, 1])
        #expect(first.first?.httpStatus == status)
        #expect(first.first?.nextAttemptAt == (first.first?.finishedAt ?? 0) + 30_000)
        await retryReader.close()
        await logReader.close()
        await harness.close()
        await slow.stop()
        await other.stop()
    }

    @Test func aRetryAfterOutsideItsBoundsIsClampedAndA429WithoutOneIsAFailedAttempt() async throws {
        let clock = ManualClock()
        // An hour asked for: paused 5 minutes (the longest pause), then a 429 with no Retry-After is an ordinary failure.
        let slow = try await Self.receiver([429, 500, 200], retryAfter: "3600")
        let harness = try DeliveryHarness(endpoints: [("slow", slow.baseURL + "/hooks")], schedule: "[10s, 10s]", options: clock.options)
        let (retryReader, retries) = try harness.reader(harness.configuration.topics.retry(step: 1))
        try await harness.send(endpoint: "slow", eventID: "evt_1")
        try harness.start()
        try await waitUntil("the first answer") { slow.requests.count == 1 }
        clock.advance(milliseconds: 299_000)
        try await Task.sleep(for: .milliseconds(200))
        #expect(slow.requests.count == 1)
        clock.advance(milliseconds: 1_000)
        try await waitUntil("the attempt after the pause") { slow.requests.count == 2 }
        // The 500 is attempt 1 failing: to the first retry step.
        let retried = try #require(try await retries.waitFor(count: 1).first)
        #expect(retried.header(DeliveryHeaderName.attempts) == "1")
        #expect(retried.header(DeliveryHeaderName.lastStatus) == "500")
        await retryReader.close()
        await harness.close()
        await slow.stop()
    }

    @Test func rateLimitSpacesAttemptsAtTheConfiguredRate() async throws {
        let clock = ManualClock()
        let receiver = try await Self.receiver([200])
        let harness = try DeliveryHarness(endpoints: [("hooks", receiver.baseURL + "/hooks")], options: clock.options, rateLimits: ["hooks": "2/s"])
        for index in 1...6 { try await harness.send(endpoint: "hooks", eventID: "evt_\(index)", subject: "sub_\(index)") }
        try harness.start()
        // A second's worth at once, then one every 500 ms of the deliverer's clock.
        try await waitUntil("the burst") { receiver.requests.count == 2 }
        try await Task.sleep(for: .milliseconds(200))
        #expect(receiver.requests.count == 2)
        clock.advance(milliseconds: 500)
        try await waitUntil("one more") { receiver.requests.count == 3 }
        try await Task.sleep(for: .milliseconds(200))
        #expect(receiver.requests.count == 3)
        clock.advance(milliseconds: 1_000)
        try await waitUntil("two more") { receiver.requests.count == 5 }
        try await Task.sleep(for: .milliseconds(200))
        #expect(receiver.requests.count == 5)
        clock.advance(milliseconds: 500)
        try await waitUntil("the last") { receiver.requests.count == 6 }
        #expect(Set(receiver.requests.compactMap { $0.headers["webhook-id"] }) == Set((1...6).map { "evt_\($0)" }))
        await harness.close()
        await receiver.stop()
    }

    @Test func deliveriesBeyondAPausedEndpointsQueueComeBackWhenThePauseEndsNotAfterARetryStep() async throws {
        let clock = ManualClock()
        let slow = try await Self.receiver([429, 200], retryAfter: "30")
        let harness = try DeliveryHarness(endpoints: [("slow", slow.baseURL + "/hooks")], schedule: "[100s, 100s]", perEndpoint: 1, options: clock.options)
        let (retryReader, retries) = try harness.reader(harness.configuration.topics.retry(step: 1))
        try await harness.send(endpoint: "slow", eventID: "evt_0", subject: "sub_0")
        try harness.start()
        try await waitUntil("the 429") { slow.requests.count == 1 }
        try await Task.sleep(for: .milliseconds(100))
        let pausedAt = clock.now
        // The paused endpoint keeps a queue of one (the answered delivery): three more are deferred unsent, due
        // when the pause ends (30 s), not after the first step's 100 s.
        for index in 1...3 { try await harness.send(endpoint: "slow", eventID: "evt_\(index)", subject: "sub_\(index)") }
        let deferred = try await retries.waitFor(count: 3)
        #expect(deferred.compactMap { $0.header(DeliveryHeaderName.dueAt).flatMap { Int64($0) } } == Array(repeating: pausedAt + 30_000, count: 3))
        #expect(deferred.allSatisfy { ($0.header(DeliveryHeaderName.attempts) ?? "0") == "0" }, "no attempt spent")
        await retryReader.close()
        await harness.close()
        await slow.stop()
    }
}
