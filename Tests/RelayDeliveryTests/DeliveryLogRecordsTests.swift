import Foundation
import RelayConfig
import RelayCore
import RelayDelivery
import RelayTestSupport
import Synchronization
import Testing

/// What the deliverer writes to the delivery log's topic, or to the delivery log in its own process: one
/// record per attempt's outcome, apart from the deliveries, so that the log's topic failing never holds back
/// or repeats a delivery.
@Suite(.serialized) struct DeliveryLogRecordsTests {
    /// A producer that refuses every record of `topic` for good (a topic missing on Kafka) and passes the rest on.
    final class RefusingProducer: RecordProducer {
        let inner: any RecordProducer
        let topic: String
        let refused = Atomic<Int>(0)

        init(inner: any RecordProducer, topic: String) {
            self.inner = inner
            self.topic = topic
        }

        func produce(_ record: OutgoingRecord) async throws(RecordLogError) -> RecordPosition {
            if record.topic == topic {
                refused.add(1, ordering: .relaxed)
                throw RecordLogError(code: .configuration, reason: "unknown topic", isRetriable: false)
            }
            return try await inner.produce(record)
        }

        func produce(_ records: [OutgoingRecord]) async throws(RecordLogError) -> [RecordPosition] {
            var positions: [RecordPosition] = []
            for record in records { positions.append(try await produce(record)) }
            return positions
        }
    }

    /// The delivery log in the deliverer's process (the local backend's): its first `failing` batches fail
    /// (the disk), then it keeps every entry it is handed.
    final class FailingThenRecordingLog: DeliveryLogRecorder {
        let failing: Int
        let calls = Atomic<Int>(0)
        let entries = LockedBox<[DeliveryLogEntry]>([])

        /// Batches holding a `retrying` attempt, refused for good (a read-only database) when `refuseRetrying`.
        let refuseRetrying: Bool
        let refused = Atomic<Int>(0)

        init(failing: Int, refuseRetrying: Bool = false) {
            self.failing = failing
            self.refuseRetrying = refuseRetrying
        }

        func recordFromDeliverer(_ entries: [DeliveryLogEntry]) async throws(DeliveryLogWriteError) {
            let call = calls.add(1, ordering: .relaxed).newValue
            if call <= failing { throw DeliveryLogWriteError(reason: "disk I/O error", isRetriable: true) }
            if refuseRetrying, entries.contains(where: { if case .attempt(let attempt) = $0 { attempt.outcome == .retrying } else { false } }) {
                refused.add(1, ordering: .relaxed)
                throw DeliveryLogWriteError(reason: "attempt to write a readonly database", isRetriable: false)
            }
            self.entries.withLock { $0.append(contentsOf: entries) }
        }

        var attempts: [DeliveryAttempt] { entries.withLock { $0 }.compactMap { if case .attempt(let attempt) = $0 { attempt } else { nil } } }
    }

    @Test func withTheDeliveryLogInItsProcessTheAttemptsSkipTheTopicAndAFailedBatchIsWrittenAgain() async throws {
        let receiver = try await DelivererTests.receiver([503, 200])
        let harness = try DeliveryHarness(endpoints: [("hooks", receiver.baseURL + "/hooks")])
        let (reader, topic) = try harness.reader(harness.configuration.topics.attempts)
        _ = try await harness.send(endpoint: "hooks", eventID: "stripe:evt_direct:renewal")
        let log = FailingThenRecordingLog(failing: 1)
        let deliverer = try Deliverer(
            configuration: harness.configuration, consumer: try harness.consumer(), producer: harness.producer, deliveryLog: log,
            logger: testLogger("deliverer"), options: harness.options)
        let task = Task { try await deliverer.run() }
        try await waitUntil("both attempts in the delivery log") { log.attempts.count >= 2 }
        let logged = log.attempts.sorted { $0.attempt < $1.attempt }
        #expect(logged.map(\.outcome) == [.retrying, .succeeded])
        #expect(logged.map(\.httpStatus) == [503, 200])
        #expect(logged.allSatisfy { $0.endpoint == "hooks" && $0.eventId == "stripe:evt_direct:renewal" && $0.app == "demo" })
        // The batch that failed was written again, not dropped: each attempt once, the endpoint's state too.
        #expect(log.calls.load(ordering: .relaxed) >= 2)
        #expect(Set(logged.map(\.attempt)).count == logged.count)
        #expect(log.entries.withLock { $0 }.contains { if case .status(let status) = $0 { status.endpoint == "hooks" } else { false } })
        task.cancel()
        _ = try? await task.value
        // Nothing went to the topic: a record appended after the deliverer stopped is the first the topic holds.
        _ = try await harness.producer.produce(OutgoingRecord(topic: harness.configuration.topics.attempts, key: nil, value: Array("marker".utf8), headers: []))
        let seen = try await topic.waitFor(count: 1)
        #expect(seen.map(\.value) == [Array("marker".utf8)])
        await reader.close()
        await harness.close()
        await receiver.stop()
    }

    @Test func aBatchTheDeliveryLogRefusesForGoodIsDroppedAndTheNextOnesAreRecorded() async throws {
        let receiver = try await DelivererTests.receiver([503, 200])
        let harness = try DeliveryHarness(endpoints: [("hooks", receiver.baseURL + "/hooks")])
        _ = try await harness.send(endpoint: "hooks", eventID: "stripe:evt_refused_direct:renewal")
        let log = FailingThenRecordingLog(failing: 0, refuseRetrying: true)
        let deliverer = try Deliverer(
            configuration: harness.configuration, consumer: try harness.consumer(), producer: harness.producer, deliveryLog: log,
            logger: testLogger("deliverer"), options: harness.options)
        let task = Task { try await deliverer.run() }
        // The retry's success is recorded after the refused batch, which was offered once and not again.
        try await waitUntil("the success in the delivery log") { log.attempts.contains { $0.outcome == .succeeded } }
        #expect(log.refused.load(ordering: .relaxed) == 1)
        #expect(!log.attempts.contains { $0.outcome == .retrying })
        #expect(receiver.requests.count == 2, "the delivery itself went on")
        task.cancel()
        _ = try? await task.value
        await harness.close()
        await receiver.stop()
    }

    @Test func eachAttemptsOutcomeIsRecordedWithItsTimeline() async throws {
        let receiver = try await DelivererTests.receiver([503, 200])
        let harness = try DeliveryHarness(endpoints: [("hooks", receiver.baseURL + "/hooks")])
        let (reader, attempts) = try harness.reader(harness.configuration.topics.attempts)
        _ = try await harness.send(endpoint: "hooks", eventID: "stripe:evt_log:renewal")
        try harness.start()
        let logged = try await attempts.attempts(count: 2).sorted { $0.attempt < $1.attempt }
        let records = attempts.records.filter { record in (try? JSON.parse(record.value)).flatMap(DeliveryAttempt.init(json:)) != nil }
        #expect(logged.map(\.outcome) == [.retrying, .succeeded])
        #expect(logged.map(\.httpStatus) == [503, 200])
        #expect(logged.allSatisfy { $0.endpoint == "hooks" && $0.eventId == "stripe:evt_log:renewal" && $0.eventType == "renewal" && $0.app == "demo" })
        #expect(logged.first?.subject == "stripe:sub_1")
        #expect(logged.first?.nextAttemptAt != nil)
        #expect(logged.first?.error == "HTTP 503")
        #expect(records.allSatisfy { $0.keyString == "hooks" })
        await reader.close()
        await harness.close()
        await receiver.stop()
    }

    @Test func aRefusedLogTopicNeitherHoldsBackNorRepeatsADelivery() async throws {
        let receiver = try await DelivererTests.receiver([500, 200])
        let harness = try DeliveryHarness(endpoints: [("hooks", receiver.baseURL + "/hooks")])
        let refusing = RefusingProducer(inner: harness.producer, topic: harness.configuration.topics.attempts)
        _ = try await harness.send(endpoint: "hooks", eventID: "stripe:evt_refused:renewal")
        _ = try await harness.send(endpoint: "hooks", eventID: "stripe:evt_refused_2:renewal", subject: "stripe:sub_2")
        let deliverer = try Deliverer(
            configuration: harness.configuration, consumer: try harness.consumer(), producer: refusing, logger: testLogger("deliverer"),
            options: harness.options)
        let task = Task { try await deliverer.run() }
        // Each delivery goes through: the first attempt of one fails, its retry succeeds; nothing more is sent.
        try await waitUntil("both delivered") { receiver.requests.count >= 3 }
        try await Task.sleep(for: .milliseconds(500))
        #expect(receiver.requests.count == 3)
        #expect(refusing.refused.load(ordering: .relaxed) >= 1)
        task.cancel()
        _ = try? await task.value
        await harness.close()
        await receiver.stop()
    }
}
