import CoreMetrics
import Foundation
import RelayCore
import RelayEmbeddedLog
import RelayTestSupport
import RelayWorker
import ServiceLifecycle
import Synchronization
import Testing

/// A failing record is retried in place, in its partition's order, and marked done only once it succeeded.
@Suite struct WorkerRetryTests {
    @Test func failingRecordsAreRetriedInPartitionOrderAndOnlyThenMarkedDone() async throws {
        // On the in-memory record log: no broker needed for the worker's own semantics.
        let topic = uniqueName("notifications")
        let log = try EmbeddedRecordLog.inMemory(topics: [topic], partitions: 1, logger: testLogger())
        let producer = try log.producer
        for index in 0..<5 { _ = try await producer.produce(OutgoingRecord(topic: topic, key: nil, value: Array("n\(index)".utf8))) }

        let group = uniqueName("worker")
        let consumer = try log.consumer(ConsumerOptions(groupID: group, topics: [topic]))
        let processor = FlakyProcessor()
        let worker = WorkerService(consumer: consumer, handler: processor, logger: testLogger(), metrics: NOOPMetricsHandler.instance,
                                   retryBackoff: (.milliseconds(10), .milliseconds(50)))
        let serviceGroup = ServiceGroup(configuration: .init(services: [worker], logger: testLogger()))
        let running = Task { try await serviceGroup.run() }
        try await waitUntil("all records processed") { processor.succeeded.value.count == 5 }
        #expect(processor.succeeded.value == (0..<5).map { "n\($0)" })
        #expect(processor.attempts.value.values.allSatisfy { $0 == 2 })
        await serviceGroup.triggerGracefulShutdown()
        try await running.value

        // Everything was marked done and stored: the same group sees nothing but what comes after.
        let after = try log.consumer(ConsumerOptions(groupID: group, topics: [topic]))
        let collector = RecordCollector(after.records)
        _ = try await producer.produce(OutgoingRecord(topic: topic, key: nil, value: Array("n5".utf8)))
        let records = try await collector.waitFor(count: 1)
        #expect(records.map { text($0.value) } == ["n5"])
        await after.close()
        await log.close()
    }

    /// Fails the first attempt of every record, then succeeds; remembers the order of successes.
    final class FlakyProcessor: WorkerRecordHandler {
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
}
