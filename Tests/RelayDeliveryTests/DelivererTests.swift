import Foundation
import RelayConfig
import RelayCore
import RelayDelivery
import RelayTestSupport
import Synchronization
import Testing

/// The deliverer against the embedded broker and receivers on 127.0.0.1 that verify every signature
/// as the `standardwebhooks` and `svix` libraries do. Retry steps are compressed to 100 ms.
@Suite(.serialized) struct DelivererTests {
    /// Answers with `statuses` in turn (the last one repeats), recording what arrived.
    static func receiver(_ statuses: [Int], body: String = "") async throws -> TestHTTPServer {
        let served = Atomic<Int>(0)
        return try await TestHTTPServer { _ in
            let index = served.add(1, ordering: .relaxed).newValue - 1
            return TestHTTPResponse(status: statuses[min(index, statuses.count - 1)], text: body)
        }
    }

    @Test func failingTwiceThenSucceedingDeliversOnTheThirdAttemptWithTheSameWebhookID() async throws {
        let receiver = try await Self.receiver([500, 500, 200])
        // The deliverer's clock stands still, so the due time minus the attempt time is exactly the
        // jittered wait, however long the transfer took on a loaded machine.
        let frozen = wallClockMilliseconds()
        var options = DelivererOptions()
        options.now = { frozen }
        let harness = try DeliveryHarness(endpoints: [("hooks", receiver.baseURL + "/hooks")], options: options)
        let body = try await harness.send(endpoint: "hooks", eventID: "stripe:evt_1:renewal")
        let (retryReader, retries) = try harness.reader(harness.configuration.topics.retry(step: 2))
        try harness.start()

        try await waitUntil("three attempts") { receiver.requests.count >= 3 }
        let requests = receiver.requests
        #expect(requests.map(\.path) == ["/hooks", "/hooks", "/hooks"])
        for request in requests {
            #expect(request.headers["webhook-id"] == "stripe:evt_1:renewal")
            #expect(request.headers["svix-id"] == "stripe:evt_1:renewal")
            #expect(request.headers["content-type"] == "application/json")
            #expect(request.headers["user-agent"] == "revenue-relay/\(RelayVersion.current)")
            #expect(String(decoding: request.body, as: UTF8.self) == body)
            #expect(StandardWebhooksReceiver.verify(request, secret: DeliveryHarness.secret))
            #expect(StandardWebhooksReceiver.verify(request, secret: DeliveryHarness.secret, prefix: "svix"))
        }
        // The second retry step carries the history of the first two attempts.
        let retried = try #require(try await retries.waitFor(count: 1).first)
        #expect(retried.header(DeliveryHeaderName.attempts) == "2")
        #expect(retried.header(DeliveryHeaderName.lastStatus) == "500")
        #expect(retried.header(DeliveryHeaderName.lastError) == "HTTP 500")
        #expect(retried.header(DeliveryHeaderName.firstAttemptAt) != nil)
        #expect(retried.keyString == "hooks:stripe:sub_1")
        let attemptedAt = try #require(Timestamp.milliseconds(retried.header(DeliveryHeaderName.lastAttemptAt)))
        let due = try #require(retried.header(DeliveryHeaderName.dueAt).flatMap { Int64($0) })
        #expect((80...120).contains(due - attemptedAt), "100 ms ±20%")
        // Delivered: no fourth request, nothing dead-lettered.
        let (dlqReader, dlq) = try harness.reader(harness.configuration.topics.deadLetter)
        try await Task.sleep(for: .milliseconds(500))
        #expect(receiver.requests.count == 3)
        #expect(dlq.count == 0)
        await dlqReader.close()
        await retryReader.close()
        await harness.close()
        await receiver.stop()
    }

    @Test func exhaustedRetriesDeadLetterWithTheAttemptHistoryAndTheTruncatedResponse() async throws {
        let longBody = String(repeating: "maintenance ", count: 200)
        let receiver = try await Self.receiver([503], body: longBody)
        let harness = try DeliveryHarness(endpoints: [("hooks", receiver.baseURL + "/hooks")])
        try await harness.send(endpoint: "hooks", eventID: "stripe:evt_2:renewal", type: "renewal")
        let (reader, dlq) = try harness.reader(harness.configuration.topics.deadLetter)
        try harness.start()

        let dead = try #require(try await dlq.waitFor(count: 1).first)
        #expect(receiver.requests.count == 3, "the first attempt and one per step")
        #expect(dead.header(DeliveryHeaderName.deadLetterReason) == "retries_exhausted")
        #expect(dead.header(DeliveryHeaderName.attempts) == "3")
        #expect(dead.header(DeliveryHeaderName.lastStatus) == "503")
        #expect(dead.header(DeliveryHeaderName.lastError) == "HTTP 503")
        #expect(dead.header(DeliveryHeaderName.lastResponse) == String(longBody.prefix(1024)))
        #expect(dead.header(DeliveryHeaderName.endpoint) == "hooks")
        #expect(dead.header(RelayHeaderName.eventId) == "stripe:evt_2:renewal")
        #expect(dead.header(RelayHeaderName.eventType) == "renewal")
        #expect(dead.header(DeliveryHeaderName.dueAt) == nil)
        let first = try #require(Timestamp.milliseconds(dead.header(DeliveryHeaderName.firstAttemptAt)))
        let last = try #require(Timestamp.milliseconds(dead.header(DeliveryHeaderName.lastAttemptAt)))
        let deadAt = try #require(Timestamp.milliseconds(dead.header(DeliveryHeaderName.deadLetteredAt)))
        #expect(last - first >= 160, "two steps of 100 ms ±20% lie between them")
        #expect(deadAt >= last)
        #expect(dead.keyString == "hooks:stripe:sub_1")
        await reader.close()
        await harness.close()
        await receiver.stop()
    }

    @Test func goneDeadLettersAtOnceAndDisablesTheEndpoint() async throws {
        let receiver = try await Self.receiver([410])
        let harness = try DeliveryHarness(endpoints: [("hooks", receiver.baseURL + "/hooks")])
        try await harness.send(endpoint: "hooks", eventID: "stripe:evt_3:renewal")
        let (reader, dlq) = try harness.reader(harness.configuration.topics.deadLetter)
        try harness.start()
        let gone = try #require(try await dlq.waitFor(count: 1).first)
        #expect(gone.header(DeliveryHeaderName.deadLetterReason) == "endpoint_gone")
        #expect(gone.header(DeliveryHeaderName.attempts) == "1")
        #expect(gone.header(DeliveryHeaderName.lastStatus) == "410")

        // Later deliveries to it are dead-lettered without a request.
        try await harness.send(endpoint: "hooks", eventID: "stripe:evt_4:renewal")
        let records = try await dlq.waitFor(count: 2)
        #expect(records[1].header(DeliveryHeaderName.deadLetterReason) == "endpoint_disabled")
        #expect(records[1].header(DeliveryHeaderName.attempts) == "0")
        #expect(receiver.requests.count == 1)
        await reader.close()
        await harness.close()
        await receiver.stop()
    }

    @Test func aTimeoutIsRetriedNoSoonerThanTheThrottledMinimumAndAConnectionResetDeadLetters() async throws {
        // Hangs past the 300 ms timeout once, then answers.
        let calls = Atomic<Int>(0)
        let slowOnce = try await TestHTTPServer { _ in
            if calls.add(1, ordering: .relaxed).newValue == 1 { try? await Task.sleep(for: .seconds(3)) }
            return TestHTTPResponse(status: 204)
        }
        let reset = try ResettingServer()
        let harness = try DeliveryHarness(
            endpoints: [("slow", slowOnce.baseURL + "/slow"), ("reset", "http://127.0.0.1:\(reset.port)/reset")], timeout: "300ms")
        // A wait longer than its step can hold goes to a later step's topic: read both.
        let (retryReader, retries) = try harness.reader([1, 2].map { harness.configuration.topics.retry(step: $0) })
        let (dlqReader, dlq) = try harness.reader(harness.configuration.topics.deadLetter)
        try await harness.send(endpoint: "slow", eventID: "stripe:evt_5:renewal", subject: "stripe:sub_a")
        try await harness.send(endpoint: "reset", eventID: "stripe:evt_6:renewal", subject: "stripe:sub_b")
        try harness.start()

        try await waitUntil("the slow endpoint's second attempt") { slowOnce.requests.count >= 2 }
        let dead = try #require(try await dlq.waitFor(count: 1).first)
        #expect(dead.header(DeliveryHeaderName.endpoint) == "reset")
        #expect(dead.header(DeliveryHeaderName.attempts) == "3")
        #expect(dead.header(DeliveryHeaderName.lastStatus) == nil)
        // Reset before or after the request went out: curl reports a failed send/receive or connection.
        let resetError = dead.header(DeliveryHeaderName.lastError) ?? ""
        #expect(resetError.hasPrefix("transfer:") || resetError.hasPrefix("connect:"), "\(resetError)")
        #expect(reset.connections >= 3)

        let firstRetries = try await retries.waitFor(count: 3)
        let timedOut = try #require(firstRetries.first { $0.header(DeliveryHeaderName.endpoint) == "slow" })
        #expect(timedOut.topic == harness.configuration.topics.retry(step: 2), "300 ms does not fit the 100 ms step")
        #expect(timedOut.header(DeliveryHeaderName.lastError)?.hasPrefix("timeout:") == true)
        let attemptedAt = try #require(Timestamp.milliseconds(timedOut.header(DeliveryHeaderName.lastAttemptAt)))
        let due = try #require(timedOut.header(DeliveryHeaderName.dueAt).flatMap { Int64($0) })
        #expect(due - attemptedAt >= 300 + 300, "the wait after a timeout is at least the throttled minimum (compressed to 300 ms)")
        #expect(slowOnce.requests.map { $0.headers["webhook-id"] } == ["stripe:evt_5:renewal", "stripe:evt_5:renewal"])
        await retryReader.close()
        await dlqReader.close()
        await harness.close()
        await slowOnce.stop()
        reset.stop()
    }

    @Test func aSlowEndpointDoesNotDelayAHealthyOne() async throws {
        let release = Eventual<Void>()
        let hanging = try await TestHTTPServer { _ in
            await release.value()
            return TestHTTPResponse(status: 200)
        }
        let healthy = try await Self.receiver([200])
        let harness = try DeliveryHarness(
            endpoints: [("hanging", hanging.baseURL + "/h"), ("healthy", healthy.baseURL + "/ok")], timeout: "30s", perEndpoint: 4)
        for index in 0..<30 {
            try await harness.send(endpoint: "hanging", eventID: "stripe:evt_h\(index):renewal", subject: "stripe:sub_h\(index)")
            try await harness.send(endpoint: "healthy", eventID: "stripe:evt_ok\(index):renewal", subject: "stripe:sub_ok\(index)")
        }
        try harness.start()
        // Every healthy delivery completes while the hanging endpoint holds its four transfers.
        try await waitUntil("the healthy endpoint's 30 deliveries") { healthy.requests.count >= 30 }
        #expect(hanging.requests.count == 4, "no more than maxInFlightPerEndpoint transfers at once")
        #expect(Set(healthy.requests.compactMap { $0.headers["webhook-id"] }).count == 30)
        release.set(())
        await harness.close()
        await hanging.stop()
        await healthy.stop()
    }

    @Test func loopbackEndpointsAreRefusedUnlessPrivateNetworksAreAllowed() async throws {
        let receiver = try await Self.receiver([200])
        let harness = try DeliveryHarness(
            endpoints: [("local", receiver.baseURL + "/local"), ("byname", "http://localhost:\(receiver.port)/byname")], schedule: "[]",
            allowPrivateNetworks: false)
        let (reader, dlq) = try harness.reader(harness.configuration.topics.deadLetter)
        try await harness.send(endpoint: "local", eventID: "stripe:evt_7:renewal", subject: "stripe:sub_a")
        try await harness.send(endpoint: "byname", eventID: "stripe:evt_8:renewal", subject: "stripe:sub_b")
        try harness.start()
        let dead = try await dlq.waitFor(count: 2)
        for record in dead {
            #expect(record.header(DeliveryHeaderName.lastError)?.hasPrefix("address_refused: refused to connect to ") == true)
            #expect(record.header(DeliveryHeaderName.lastError)?.contains("loopback") == true)
        }
        #expect(receiver.requests.isEmpty)
        await reader.close()
        await harness.close()
        await receiver.stop()
    }

    @Test func aRedirectIsAFailureAndIsNotFollowed() async throws {
        let target = try await Self.receiver([200])
        let redirecting = try await TestHTTPServer { _ in TestHTTPResponse(status: 302, headers: [("Location", target.baseURL + "/elsewhere")]) }
        let harness = try DeliveryHarness(endpoints: [("hooks", redirecting.baseURL + "/hooks")], schedule: "[]")
        let (reader, dlq) = try harness.reader(harness.configuration.topics.deadLetter)
        try await harness.send(endpoint: "hooks", eventID: "stripe:evt_9:renewal")
        try harness.start()
        let dead = try #require(try await dlq.waitFor(count: 1).first)
        #expect(dead.header(DeliveryHeaderName.lastStatus) == "302")
        #expect(dead.header(DeliveryHeaderName.lastError) == "HTTP 302 (redirects are not followed)")
        #expect(target.requests.isEmpty)
        await reader.close()
        await harness.close()
        await redirecting.stop()
        await target.stop()
    }

    @Test func aCrashBetweenDeliveryAndOffsetStoreRepeatsTheDeliveryWithTheSameWebhookID() async throws {
        let receiver = try await Self.receiver([200])
        let harness = try DeliveryHarness(endpoints: [("hooks", receiver.baseURL + "/hooks")])
        try await harness.send(endpoint: "hooks", eventID: "stripe:evt_10:renewal")
        // This deliverer delivers, then "crashes" before any offset is stored.
        try harness.start(consumer: ForgetfulConsumer(try harness.consumer()))
        try await waitUntil("the first delivery") { receiver.requests.count == 1 }
        await harness.stopDeliverers()

        // Its successor in the group reads the record again and delivers it again, same id.
        try harness.start()
        try await waitUntil("the repeated delivery") { receiver.requests.count == 2 }
        #expect(receiver.requests.map { $0.headers["webhook-id"] } == ["stripe:evt_10:renewal", "stripe:evt_10:renewal"])
        #expect(receiver.requests.allSatisfy { StandardWebhooksReceiver.verify($0, secret: DeliveryHarness.secret) })
        // That one stored its offset: a third deliverer has nothing to repeat.
        try await Task.sleep(for: .milliseconds(400))  // past the 200 ms auto-commit interval
        await harness.stopDeliverers()
        try harness.start()
        try await harness.send(endpoint: "hooks", eventID: "stripe:evt_11:renewal")
        try await waitUntil("the next delivery") { receiver.requests.count >= 3 }
        try await Task.sleep(for: .milliseconds(300))
        #expect(receiver.requests.map { $0.headers["webhook-id"] }.suffix(from: 2) == ["stripe:evt_11:renewal"])
        await harness.close()
        await receiver.stop()
    }

    @Test func anOpenCircuitSendsNewDeliveriesToTheFirstRetryStepAndAProbeClosesIt() async throws {
        let failing = Atomic<Bool>(true)
        let receiver = try await TestHTTPServer { _ in TestHTTPResponse(status: failing.load(ordering: .relaxed) ? 500 : 200) }
        // The breaker's clock is the test's: load on the machine cannot stretch the open state past its cool-down.
        let clock = Atomic<Int64>(wallClockMilliseconds())
        var options = DelivererOptions()
        options.breakerThreshold = 2
        options.breakerCooldown = .seconds(3)
        options.now = { clock.load(ordering: .relaxed) }
        // A long first step keeps the failed deliveries' retries out of the way.
        let harness = try DeliveryHarness(endpoints: [("hooks", receiver.baseURL + "/hooks")], schedule: "[60s]", options: options)
        let (reader, retries) = try harness.reader(harness.configuration.topics.retry(step: 1))
        try await harness.send(endpoint: "hooks", eventID: "stripe:evt_12:renewal", subject: "stripe:sub_a")
        try await harness.send(endpoint: "hooks", eventID: "stripe:evt_13:renewal", subject: "stripe:sub_b")
        let deliverer = try harness.start()
        try await waitUntil("two failures open the circuit") { deliverer.isCircuitOpen(endpoint: "hooks") == true }

        // While it is open, a new delivery goes to the first retry step without being sent.
        try await harness.send(endpoint: "hooks", eventID: "stripe:evt_14:renewal", subject: "stripe:sub_c")
        try await waitUntil("the diverted delivery") {
            retries.records.contains { $0.header(RelayHeaderName.eventId) == "stripe:evt_14:renewal" }
        }
        let diverted = try #require(retries.records.first { $0.header(RelayHeaderName.eventId) == "stripe:evt_14:renewal" })
        #expect(diverted.header(DeliveryHeaderName.attempts) == "0")
        #expect(receiver.requests.count == 2)

        // After the cool-down one new delivery probes; its success closes the circuit.
        failing.store(false, ordering: .relaxed)
        clock.add(3_100, ordering: .relaxed)
        try await harness.send(endpoint: "hooks", eventID: "stripe:evt_15:renewal", subject: "stripe:sub_d")
        try await waitUntil("the probe") { receiver.requests.contains { $0.headers["webhook-id"] == "stripe:evt_15:renewal" } }
        try await waitUntil("the circuit closed") { deliverer.isCircuitOpen(endpoint: "hooks") == false }
        try await harness.send(endpoint: "hooks", eventID: "stripe:evt_16:renewal", subject: "stripe:sub_e")
        try await waitUntil("a delivery through the closed circuit") {
            receiver.requests.contains { $0.headers["webhook-id"] == "stripe:evt_16:renewal" }
        }
        #expect(receiver.requests.count == 4)
        await reader.close()
        await harness.close()
        await receiver.stop()
    }
}

/// Accepts TCP connections and resets each at once (SO_LINGER 0), like a crashing receiver.
final class ResettingServer: Sendable {
    private let listener: LoopbackListener
    var port: Int { listener.port }
    var connections: Int { listener.connections.load(ordering: .relaxed) }

    init() throws {
        listener = try LoopbackListener { client in
            var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
            setsockopt(client, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
            Glibc.close(client)
        }
    }

    func stop() { listener.close() }
}
