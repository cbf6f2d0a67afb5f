import Foundation
import RelayCore
import RelayKafka
import RelayTestSupport
import Synchronization
import Testing

/// Producer and consumer against the embedded broker (librdkafka's mock cluster) over real TCP.
@Suite struct KafkaClientTests {
    let cluster: EmbeddedKafkaCluster
    let connection: KafkaConfiguration

    init() throws {
        cluster = try EmbeddedKafkaCluster(brokers: 3, logger: testLogger("mock-cluster"))
        connection = KafkaConfiguration(bootstrapServers: cluster.bootstrapServers)
    }

    func makeTopic(partitions: Int = 3) throws -> String {
        let topic = uniqueName("topic")
        try cluster.createTopic(topic, partitions: partitions)
        return topic
    }

    func produce(_ producer: KafkaProducer, topic: String, count: Int, key: (Int) -> String = { "key-\($0)" }) async throws -> [RecordPosition] {
        var positions: [RecordPosition] = []
        for index in 0..<count {
            positions.append(try await producer.send(OutgoingRecord(topic: topic, key: Array(key(index).utf8), value: Array("value-\(index)".utf8))))
        }
        return positions
    }

    @Test func producedRecordIsConsumedWithKeyValueAndHeaders() async throws {
        let topic = try makeTopic()
        let producer = try KafkaProducer(configuration: connection, logger: testLogger())
        let value: [UInt8] = Array("{\"signedPayload\":\"a.b.c\"}".utf8) + [0, 255, 10]
        let headers = [
            RecordHeader(name: "relay-store", value: "apple"),
            RecordHeader(name: "relay-app", value: "demo"),
            RecordHeader(name: "binary", value: [0, 1, 2, 255]),
            RecordHeader(name: "empty", value: []),
        ]
        let position = try await producer.send(OutgoingRecord(topic: topic, key: Array("apple:1000".utf8), value: value, headers: headers))
        #expect(position.topic == topic)
        #expect(position.offset >= 0)
        await producer.close()

        let consumer = try KafkaConsumer(configuration: connection, consumer: testConsumerConfiguration(group: uniqueName("group"), topics: [topic]), logger: testLogger())
        let collector = RecordCollector(consumer.records)
        let record = try #require(try await collector.waitFor(count: 1).first)
        #expect(record.topic == topic)
        #expect(record.partition == position.partition)
        #expect(record.offset == position.offset)
        #expect(record.keyString == "apple:1000")
        #expect(record.value == value)
        #expect(record.headers == headers)
        #expect(record.timestampMilliseconds != nil)
        await consumer.close()
    }

    @Test func sameKeyAlwaysLandsOnTheSamePartition() async throws {
        let topic = try makeTopic(partitions: 6)
        let producer = try KafkaProducer(configuration: connection, logger: testLogger())
        let positions = try await produce(producer, topic: topic, count: 60) { "apple:subscription-\($0 % 5)" }
        await producer.close()
        var partitionByKey: [Int: Set<Int32>] = [:]
        for (index, position) in positions.enumerated() { partitionByKey[index % 5, default: []].insert(position.partition) }
        #expect(partitionByKey.values.allSatisfy { $0.count == 1 })
        // Five keys over six partitions should not all hash to one partition.
        #expect(Set(partitionByKey.values.map { $0.first! }).count > 1)
    }

    @Test func recordsNotMarkedDoneAreRedeliveredAfterRestartAndDoneOnesAreNot() async throws {
        let topic = try makeTopic(partitions: 1)
        let group = uniqueName("group")
        let producer = try KafkaProducer(configuration: connection, logger: testLogger())
        _ = try await produce(producer, topic: topic, count: 10)
        await producer.close()

        let first = try KafkaConsumer(configuration: connection, consumer: testConsumerConfiguration(group: group, topics: [topic]), logger: testLogger())
        let firstRecords = RecordCollector(first.records)
        let received = try await firstRecords.waitFor(count: 10)
        for record in received.prefix(4) { first.markDone(record) }
        await first.close()

        let second = try KafkaConsumer(configuration: connection, consumer: testConsumerConfiguration(group: group, topics: [topic]), logger: testLogger())
        let secondRecords = RecordCollector(second.records)
        let redelivered = try await secondRecords.waitFor(count: 6)
        #expect(redelivered.map { text($0.value) } == (4..<10).map { "value-\($0)" })
        await second.close()
    }

    @Test func outOfOrderCompletionStoresOnlyTheContiguousPrefix() async throws {
        let topic = try makeTopic(partitions: 1)
        let group = uniqueName("group")
        let producer = try KafkaProducer(configuration: connection, logger: testLogger())
        _ = try await produce(producer, topic: topic, count: 6)
        await producer.close()

        let first = try KafkaConsumer(configuration: connection, consumer: testConsumerConfiguration(group: group, topics: [topic]), logger: testLogger())
        let records = try await RecordCollector(first.records).waitFor(count: 6)
        // 0, 1, 3, 4, 5 finish; 2 is still in flight when the consumer stops.
        for index in [5, 3, 0, 4, 1] { first.markDone(records[index]) }
        #expect(first.inFlightCount == 1)
        await first.close()

        let second = try KafkaConsumer(configuration: connection, consumer: testConsumerConfiguration(group: group, topics: [topic]), logger: testLogger())
        let redelivered = try await RecordCollector(second.records).waitFor(count: 4)
        #expect(redelivered.map { text($0.value) } == ["value-2", "value-3", "value-4", "value-5"])
        await second.close()
    }

    @Test func twoMembersSplitPartitionsAndTheSurvivorTakesOverWithNothingLost() async throws {
        let topic = try makeTopic(partitions: 4)
        let group = uniqueName("group")
        let producer = try KafkaProducer(configuration: connection, logger: testLogger())

        let memberA = try KafkaConsumer(configuration: connection, consumer: testConsumerConfiguration(group: group, topics: [topic]), logger: testLogger())
        let memberB = try KafkaConsumer(configuration: connection, consumer: testConsumerConfiguration(group: group, topics: [topic]), logger: testLogger())
        // Reading starts each member.
        let collectorA = RecordCollector(memberA.records)
        let collectorB = RecordCollector(memberB.records)
        try await waitUntil("both members assigned") { !memberA.assignment.isEmpty && !memberB.assignment.isEmpty }
        #expect(memberA.assignment.union(memberB.assignment).count == 4)
        #expect(memberA.assignment.isDisjoint(with: memberB.assignment))

        let total = 40
        _ = try await produce(producer, topic: topic, count: total)
        try await waitUntil("all records handed out") { collectorA.count + collectorB.count >= total }

        // B finishes everything it got. A finishes only half, then leaves.
        var done = Set<String>()
        for record in collectorB.records {
            memberB.markDone(record)
            done.insert(text(record.value))
        }
        let aRecords = collectorA.records
        for record in aRecords.prefix(aRecords.count / 2) {
            memberA.markDone(record)
            done.insert(text(record.value))
        }
        let seenByB = collectorB.count
        await memberA.close()

        // B takes over A's partitions and receives what A had not finished.
        try await waitUntil("B owns every partition") { memberB.assignment.count == 4 }
        let expectedRedelivered = aRecords.count - aRecords.count / 2
        let all = try await collectorB.waitFor(count: seenByB + expectedRedelivered)
        for record in all.dropFirst(seenByB) {
            memberB.markDone(record)
            done.insert(text(record.value))
        }
        #expect(done == Set((0..<total).map { "value-\($0)" }))
        await memberB.close()
        await producer.close()
    }

    @Test func consumeHandsRecordsInOrderOnThePollThreadAndStopsWhenCancelled() async throws {
        let topic = try makeTopic(partitions: 2)
        let group = uniqueName("group")
        let producer = try KafkaProducer(configuration: connection, logger: testLogger())
        _ = try await produce(producer, topic: topic, count: 10, key: { _ in "same" })

        let consumer = try KafkaConsumer(configuration: connection, consumer: testConsumerConfiguration(group: group, topics: [topic]), logger: testLogger())
        let handled = LockedBox<[String]>([])
        let intake = Task {
            await consumer.consume { record in
                handled.withLock { $0.append(text(record.value)) }
                consumer.markDone(record)
            }
        }
        try await waitUntil("the first ten records") { handled.value.count == 10 }
        #expect(handled.value == (0..<10).map { "value-\($0)" }, "one partition's records, in order")

        // Cancelled: it returns, and records produced afterwards are not handed out.
        intake.cancel()
        await intake.value
        _ = try await produce(producer, topic: topic, count: 6)

        // The stopped member still serves its group: a new member is given a partition and reads it
        // while the first is open; after the first closes it reads the rest. Nothing is lost.
        let next = try KafkaConsumer(configuration: connection, consumer: testConsumerConfiguration(group: group, topics: [topic]), logger: testLogger())
        let rest = RecordCollector(next.records)
        try await waitUntil("the new member's first records") { rest.count > 0 && !next.assignment.isEmpty }
        #expect(next.assignment.count == 1)
        await consumer.close()
        let all = try await rest.waitFor(count: 6)
        #expect(Set(all.map { text($0.value) }) == Set((0..<6).map { "value-\($0)" }))
        #expect(all.count == 6)
        #expect(handled.value.count == 10)
        for record in all { next.markDone(record) }
        await next.close()
        await producer.close()
    }

    @Test func pausesAtMaxInFlightAndResumesAsRecordsFinish() async throws {
        let topic = try makeTopic(partitions: 2)
        let producer = try KafkaProducer(configuration: connection, logger: testLogger())
        _ = try await produce(producer, topic: topic, count: 30)
        await producer.close()

        let consumer = try KafkaConsumer(
            configuration: connection, consumer: testConsumerConfiguration(group: uniqueName("group"), topics: [topic], maxInFlight: 8),
            logger: testLogger())
        let collector = RecordCollector(consumer.records)
        try await collector.waitFor(count: 8)
        // Paused: nothing beyond a fetch already under way arrives while nothing is done.
        try await Task.sleep(for: .milliseconds(500))
        let whilePaused = collector.count
        #expect(whilePaused < 30)

        var marked = 0
        while marked < 30 {
            let records = try await collector.waitFor(count: marked + 1)
            for record in records.dropFirst(marked) { consumer.markDone(record) }
            marked = records.count
        }
        #expect(collector.count == 30)
        #expect(consumer.inFlightCount == 0)
        await consumer.close()
    }

    @Test func aRecordNotYetDueHoldsItsPartitionUntilItIsDueAndOthersFlow() async throws {
        let topic = try makeTopic(partitions: 2)
        let producer = try KafkaProducer(configuration: connection, logger: testLogger())
        // A clock the test moves, so how long the sends take under load cannot make the record due early.
        let clock = Atomic<Int64>(1_000)
        var configuration = testConsumerConfiguration(group: uniqueName("group"), topics: [topic])
        configuration.dueTime = { record in record.headers.first(named: "due")?.stringValue.flatMap { Int64($0) } }
        configuration.now = { clock.load(ordering: .relaxed) }
        let consumer = try KafkaConsumer(configuration: connection, consumer: configuration, logger: testLogger())
        let collector = RecordCollector(consumer.records)
        // Once the consumer reads (it joined its group), records arrive within a poll.
        let warmUp = try await producer.send(OutgoingRecord(topic: topic, key: Array("a".utf8), value: Array("warm-up".utf8)))
        try await collector.waitFor(count: 1)

        // Same key, same partition: the first is due later; the one behind it must wait with it.
        _ = try await producer.send(
            OutgoingRecord(topic: topic, key: Array("a".utf8), value: Array("held".utf8), headers: [RecordHeader(name: "due", value: "2000")]))
        _ = try await producer.send(OutgoingRecord(topic: topic, key: Array("a".utf8), value: Array("behind".utf8)))
        // A key on the other partition.
        var other = 0
        while try await producer.send(OutgoingRecord(topic: topic, key: Array("b\(other)".utf8), value: Array("free".utf8))).partition == warmUp.partition {
            other += 1
        }
        await producer.close()

        let firstTwo = try await collector.waitFor(count: 2)
        #expect(firstTwo.dropFirst().map { text($0.value) } == ["free"], "the other partition was not held up")
        try await waitUntil("the not-yet-due record to be held") { consumer.heldCount == 1 }
        // Polls go on (about every 100 ms) and still hand out neither the held record nor the one behind it.
        try await Task.sleep(for: .milliseconds(300))
        #expect(collector.count == 2)

        clock.store(2_000, ordering: .relaxed)
        let all = try await collector.waitFor(count: 4)
        #expect(all.dropFirst(2).map { text($0.value) } == ["held", "behind"])
        #expect(consumer.heldCount == 0)
        for record in all { consumer.markDone(record) }
        await consumer.close()
    }

    @Test func sendFailsWhileEveryBrokerIsDownAndSucceedsAfterTheyReturn() async throws {
        let topic = try makeTopic(partitions: 1)
        let producer = try KafkaProducer(configuration: connection, producer: .init(deliveryTimeout: .milliseconds(1500)), logger: testLogger())
        _ = try await producer.send(OutgoingRecord(topic: topic, key: nil, value: Array("before".utf8)))
        try cluster.takeDown()
        await #expect(throws: KafkaError.self) {
            _ = try await producer.send(OutgoingRecord(topic: topic, key: nil, value: Array("during".utf8)))
        }
        try cluster.bringUp()
        // As a store would, retry until the producer has reconnected.
        try await waitUntil("a send to succeed after the brokers returned") {
            (try? await producer.send(OutgoingRecord(topic: topic, key: nil, value: Array("after".utf8)))) != nil
        }
        await producer.close()
    }
}
