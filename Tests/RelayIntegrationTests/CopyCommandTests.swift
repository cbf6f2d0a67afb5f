import Foundation
import RelayApp
import RelayConfig
import RelayCore
import RelayEmbeddedLog
import RelayKafka
import RelayTestSupport
import Testing

/// Moving up: `revenue-relay copy` takes what a stopped embedded log has not finished to Kafka.
@Suite struct CopyCommandTests {
    @Test func copiesTheUnfinishedRecordsAndTheDeadLettersAndRefusesARunningOwner() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("copy-log")).path
        let configuration = try RelayConfiguration.parse(
            yaml: "log: { kind: embedded, path: \"\(directory)\", partitions: 2 }\ndelivery: { retrySchedule: [1s] }\n", baseDirectory: "/", environment: [:])
        let topics = configuration.topics
        let embedded = try EmbeddedRecordLog.open(configuration: configuration, logger: testLogger())
        let producer = try embedded.producer
        for index in 0..<3 {
            _ = try await producer.produce(
                OutgoingRecord(topic: topics.notifications, key: Array("stripe:sub_1".utf8), value: Array("n\(index)".utf8),
                    headers: [RecordHeader(name: "relay-store", value: "stripe")]))
        }
        for index in 0..<2 {
            _ = try await producer.produce(
                OutgoingRecord(topic: topics.retry(step: 1), key: Array("hooks:sub_1".utf8), value: Array("r\(index)".utf8),
                    headers: [RecordHeader(name: "relay-due-at", value: "1900000000000")]))
        }
        _ = try await producer.produce(OutgoingRecord(topic: topics.deadLetter, key: Array("hooks:sub_2".utf8), value: Array("dead".utf8)))
        // The worker finished the first two notifications.
        let worker = try embedded.consumer(ConsumerOptions(groupID: "relay-worker", topics: [topics.notifications]))
        let collector = RecordCollector(worker.records)
        let handed = try await collector.waitFor(count: 3)
        worker.markDone(handed[0])
        worker.markDone(handed[1])
        await worker.close()

        // A relay still running on the log: the copy refuses instead of racing it.
        let cluster = try EmbeddedKafkaCluster(brokers: 1, logger: testLogger())
        for topic in topics.all(retrySteps: 1) { try cluster.createTopic(topic, partitions: 2) }
        let kafka = { KafkaRecordLog(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers), logger: testLogger()) }
        await #expect(throws: EmbeddedRecordLog.AlreadyOwned.self) {
            _ = try await CopyCommand.run(configuration: configuration, from: directory, to: kafka(), history: false, logger: testLogger())
        }
        await embedded.close()


        let summaries = try await CopyCommand.run(configuration: configuration, from: directory, to: kafka(), history: false, logger: testLogger())
        let byTopic = Dictionary(uniqueKeysWithValues: summaries.map { ($0.topic, $0) })
        #expect(byTopic[topics.notifications]?.copied == 1)
        #expect(byTopic[topics.notifications]?.skipped == 2)
        #expect(byTopic[topics.retry(step: 1)]?.copied == 2)
        #expect(byTopic[topics.deadLetter]?.copied == 1)
        #expect(byTopic[topics.events]?.copied == 0, "only the events the backend has not recorded; whole with --history")

        let destination = kafka()
        func records(_ topic: String) async throws -> [ConsumedRecord] {
            var result: [ConsumedRecord] = []
            for try await record in try destination.snapshot(of: topic).records { result.append(record) }
            return result
        }
        let notifications = try await records(topics.notifications)
        #expect(notifications.map { text($0.value) } == ["n2"], "only what the worker had not finished")
        #expect(notifications.first?.headers.first(named: "relay-store")?.stringValue == "stripe")
        let retries = try await records(topics.retry(step: 1))
        #expect(retries.map { text($0.value) } == ["r0", "r1"], "in order, one key on one partition")
        #expect(retries.allSatisfy { $0.headers.first(named: "relay-due-at")?.stringValue == "1900000000000" }, "still held until due")
        #expect(try await records(topics.deadLetter).map { text($0.value) } == ["dead"])
        await destination.close()
    }
}
