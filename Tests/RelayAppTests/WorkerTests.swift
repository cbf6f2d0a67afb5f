import CoreMetrics
import Foundation
import RelayApp
import RelayCore
import RelayKafka
import RelayTestSupport
import RelayWorker
import ServiceLifecycle
import Synchronization
import Testing

/// The worker: consumes raw notifications, whoever produced them, with at-least-once semantics.
@Suite struct WorkerTests {
    @Test func recordFromAnyProducerWithRelayHeadersIsProcessedLikeAnIngestOne() async throws {
        let relay = try await TestRelay(configuration: try TestRelay.configuration())
        let producer = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: relay.environment.cluster.bootstrapServers), logger: testLogger())
        let notification = RawNotification(store: .paddle, app: "demo", receivedAtMilliseconds: 1_700_000_000_000, body: Array(#"{"event_id":"evt_x"}"#.utf8), requestHeaders: ["paddle-signature": "ts=1;h1=x"])
        _ = try await producer.send(notification.record(topic: "relay.notifications"))
        _ = try await producer.send(OutgoingRecord(topic: "relay.notifications", key: nil, value: Array("{}".utf8), headers: []))
        await producer.close()
        #expect(try await relay.post("/v1/notifications/apple/demo", body: #"{"signedPayload":"x"}"#).status == 200)

        try await waitUntil("the worker counted both notifications and the foreign record") {
            let metrics = try await relay.get("/metrics").bodyText
            return metrics.contains(#"relay_worker_notifications_total{store="paddle",app="demo"} 1"#)
                && metrics.contains(#"relay_worker_notifications_total{store="apple",app="demo"} 1"#)
                && metrics.contains("relay_worker_invalid_records_total 1")
        }
        try await relay.stop()
    }

    /// Fails the first attempt of every record, then succeeds; remembers the order of successes.
    final class FlakyProcessor: NotificationProcessor {
        let attempts = LockedBox<[String: Int]>([:])
        let succeeded = LockedBox<[String]>([])

        func process(_ record: ConsumedRecord) async throws {
            let value = text(record.value)
            let attempt = attempts.withLock { counts -> Int in
                counts[value, default: 0] += 1
                return counts[value]!
            }
            if attempt == 1 { throw RecordLogError(code: .timedOut, reason: "test failure", isRetriable: true) }
            succeeded.withLock { $0.append(value) }
        }
    }

    @Test func failingRecordsAreRetriedInPartitionOrderAndOnlyThenMarkedDone() async throws {
        let cluster = try EmbeddedKafkaCluster(brokers: 1, logger: testLogger())
        let topic = uniqueName("notifications")
        try cluster.createTopic(topic, partitions: 1)
        let connection = KafkaConfiguration(bootstrapServers: cluster.bootstrapServers)
        let producer = try KafkaProducer(configuration: connection, logger: testLogger())
        for index in 0..<5 { _ = try await producer.send(OutgoingRecord(topic: topic, key: nil, value: Array("n\(index)".utf8))) }
        await producer.close()

        let group = uniqueName("worker")
        let consumer = try KafkaConsumer(configuration: connection, consumer: testConsumerConfiguration(group: group, topics: [topic]), logger: testLogger())
        let processor = FlakyProcessor()
        let worker = WorkerService(consumer: consumer, processor: processor, logger: testLogger(), metrics: NOOPMetricsHandler.instance,
                                   retryBackoff: (.milliseconds(10), .milliseconds(50)))
        let serviceGroup = ServiceGroup(configuration: .init(services: [worker], logger: testLogger()))
        let running = Task { try await serviceGroup.run() }
        try await waitUntil("all records processed") { processor.succeeded.value.count == 5 }
        #expect(processor.succeeded.value == (0..<5).map { "n\($0)" })
        #expect(processor.attempts.value.values.allSatisfy { $0 == 2 })
        await serviceGroup.triggerGracefulShutdown()
        try await running.value

        // Everything was marked done and committed: the same group sees nothing new.
        let after = try KafkaConsumer(configuration: connection, consumer: testConsumerConfiguration(group: group, topics: [topic]), logger: testLogger())
        let collector = RecordCollector(after.records)
        try await waitUntil("the group rejoined") { !after.assignment.isEmpty }
        let extra = try KafkaProducer(configuration: connection, logger: testLogger())
        _ = try await extra.send(OutgoingRecord(topic: topic, key: nil, value: Array("n5".utf8)))
        await extra.close()
        let records = try await collector.waitFor(count: 1)
        #expect(records.map { text($0.value) } == ["n5"])
        await after.close()
    }
}
