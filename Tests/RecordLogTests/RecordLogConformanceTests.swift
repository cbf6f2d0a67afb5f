import Foundation
import RelayCore
import RelayEmbeddedLog
import RelayKafka
import RelayTestSupport
import Synchronization
import Testing

/// The record log's contract, the same test on every log the stages run on: the embedded log (a SQLite
/// data directory), Kafka (librdkafka's mock cluster over loopback TCP), and the in-memory log of tests.
enum LogUnderTest: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case embedded, kafka, memory
    var testDescription: String { rawValue }
}

/// One log with one topic of three partitions, made for one test; `restart` is a new process's view of
/// the same data (the embedded log closed and opened again; for Kafka, new clients; the in-memory log,
/// whose data lives only in its instance, is kept).
final class LogFixture: Sendable {
    let kind: LogUnderTest
    let topic = uniqueName("topic")
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("embedded-log")).path
    private let cluster: EmbeddedKafkaCluster?
    private let current = Mutex<(any RecordLog)?>(nil)

    init(_ kind: LogUnderTest) throws {
        self.kind = kind
        if kind == .kafka {
            let cluster = try EmbeddedKafkaCluster(brokers: 1, logger: testLogger())
            try cluster.createTopic(topic, partitions: 3)
            self.cluster = cluster
        } else {
            cluster = nil
        }
        let log = try open()
        current.withLock { $0 = log }
    }

    var log: any RecordLog { current.withLock { $0! } }

    private func open() throws -> any RecordLog {
        if let cluster {
            // Quick group joins and commits against the mock cluster (it admits a member after session.timeout.ms - 1 s).
            let configuration = KafkaConfiguration(
                bootstrapServers: cluster.bootstrapServers,
                properties: ["session.timeout.ms": "6000", "auto.commit.interval.ms": "200", "fetch.wait.max.ms": "10"])
            return KafkaRecordLog(configuration: configuration, logger: testLogger())
        }
        if kind == .memory { return try EmbeddedRecordLog.inMemory(topics: [topic], partitions: 3, logger: testLogger()) }
        return try EmbeddedRecordLog(directory: directory, topics: [topic], partitions: 3, logger: testLogger())
    }

    /// Closes the log and opens the same data again, as a restarted process would.
    func restart() async throws {
        guard kind != .memory else { return }
        await log.close()
        current.withLock { $0 = nil }
        let log = try open()
        current.withLock { $0 = log }
    }

    func append(_ value: String, key: String, headers: [RecordHeader] = []) async throws -> RecordPosition {
        try await log.producer.produce(OutgoingRecord(topic: topic, key: Array(key.utf8), value: Array(value.utf8), headers: headers))
    }

    func consumer(group: String, dueTime: (@Sendable (ConsumedRecord) -> Int64?)? = nil, now: (@Sendable () -> Int64)? = nil) throws
        -> (any RecordConsumer, RecordCollector)
    {
        var options = ConsumerOptions(groupID: group, topics: [topic], dueTime: dueTime)
        if let now { options.now = now }
        let consumer = try log.consumer(options)
        return (consumer, RecordCollector(consumer.records))
    }

    func close() async {
        await log.close()
    }
}

@Suite struct RecordLogConformanceTests {
    @Test(arguments: LogUnderTest.allCases)
    func recordsOfOneKeyStayInOrderOnOnePartition(_ kind: LogUnderTest) async throws {
        let fixture = try LogFixture(kind)
        // Ten keys appended concurrently, each key's records one after another.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for key in 0..<10 {
                group.addTask {
                    for index in 0..<30 { _ = try await fixture.append("\(key):\(index)", key: "key-\(key)") }
                }
            }
            try await group.waitForAll()
        }
        let (consumer, collector) = try fixture.consumer(group: uniqueName("order"))
        let records = try await collector.waitFor(count: 300)
        #expect(records.count == 300)
        for key in 0..<10 {
            let mine = records.filter { $0.keyString == "key-\(key)" }
            #expect(Set(mine.map(\.partition)).count == 1, "key-\(key) on one partition")
            #expect(mine.map { text($0.value) } == (0..<30).map { "\(key):\($0)" }, "key-\(key) in order")
            #expect(mine.map(\.offset) == mine.map(\.offset).sorted())
        }
        await consumer.close()
        await fixture.close()
    }

    @Test(arguments: LogUnderTest.allCases)
    func aGroupGoesOnAfterItsDonePrefixAndGetsTheUnfinishedRecordsAgain(_ kind: LogUnderTest) async throws {
        let fixture = try LogFixture(kind)
        for index in 0..<10 { _ = try await fixture.append("\(index)", key: "one-partition") }
        let group = uniqueName("offsets")
        let (first, firstRecords) = try fixture.consumer(group: group)
        let records = try await firstRecords.waitFor(count: 10)
        // Done out of order, with 3 and 4 unfinished: only 0...2 may be stored.
        for index in [0, 1, 2, 5, 6, 9] { first.markDone(records[index]) }
        await first.close()
        firstRecords.cancel()

        try await fixture.restart()
        let (second, secondRecords) = try fixture.consumer(group: group)
        let again = try await secondRecords.waitFor(count: 7)
        #expect(again.map { text($0.value) } == (3..<10).map(String.init), "everything from the first unfinished record, done or not")
        await second.close()
        await fixture.close()
    }

    @Test(arguments: LogUnderTest.allCases)
    func aRecordIsHeldUntilItIsDueWithEverythingBehindItOnItsPartition(_ kind: LogUnderTest) async throws {
        let fixture = try LogFixture(kind)
        let start: Int64 = 1_900_000_000_000
        let clock = LockedBox<Int64>(start)
        let due = "\(start + 60_000)"
        let held = try await fixture.append("held", key: "k-held", headers: [RecordHeader(name: "due", value: due)])
        _ = try await fixture.append("behind", key: "k-held")
        // A key on another partition is not held back.
        var otherKey = "k-other-0"
        for candidate in 0..<64 {
            otherKey = "k-other-\(candidate)"
            let position = try await fixture.append("probe-\(candidate)", key: otherKey)
            if position.partition != held.partition { break }
        }
        _ = try await fixture.append("free", key: otherKey)

        let (consumer, collector) = try fixture.consumer(
            group: uniqueName("due"), dueTime: { record in record.headers.first(named: "due")?.stringValue.flatMap { Int64($0) } },
            now: { clock.value })
        try await waitUntil("the record on the other partition") { collector.records.contains { text($0.value) == "free" } }
        // Nothing on the held partition comes out early; a correct log never hands these out before the clock moves.
        try await Task.sleep(for: .milliseconds(300))
        #expect(!collector.records.contains { ["held", "behind"].contains(text($0.value)) })

        clock.withLock { $0 = start + 60_000 }
        try await waitUntil("the held records once due") { collector.records.contains { text($0.value) == "behind" } }
        let heldPartition = collector.records.filter { $0.partition == held.partition }.map { text($0.value) }
        #expect(heldPartition.suffix(2) == ["held", "behind"], "due, then what was behind it, in order")
        await consumer.close()
        await fixture.close()
    }

    @Test(arguments: LogUnderTest.allCases)
    func aHeldRecordComesOutWhenDueEvenIfHeldRecordsFillTheInFlightBound(_ kind: LogUnderTest) async throws {
        let fixture = try LogFixture(kind)
        let start: Int64 = 1_900_000_000_000
        let clock = LockedBox<Int64>(start)
        _ = try await fixture.append("later", key: "k", headers: [RecordHeader(name: "due", value: "\(start + 1_000)")])
        var options = ConsumerOptions(
            groupID: uniqueName("bound"), topics: [fixture.topic], maxInFlight: 1,
            dueTime: { record in record.headers.first(named: "due")?.stringValue.flatMap { Int64($0) } })
        options.now = { clock.value }
        let consumer = try fixture.log.consumer(options)
        let collector = RecordCollector(consumer.records)
        try await Task.sleep(for: .milliseconds(200))
        #expect(collector.count == 0)
        clock.withLock { $0 = start + 1_000 }
        try await collector.waitFor(count: 1)
        #expect(text(collector.records[0].value) == "later")
        await consumer.close()
        await fixture.close()
    }

    @Test(arguments: LogUnderTest.allCases)
    func aSnapshotReadsFromTheStartToTheEndItHadWhenItBegan(_ kind: LogUnderTest) async throws {
        let fixture = try LogFixture(kind)
        for index in 0..<50 { _ = try await fixture.append("\(index)", key: "key-\(index % 7)") }
        let snapshot = try fixture.log.snapshot(of: fixture.topic)
        for index in 50..<60 { _ = try await fixture.append("\(index)", key: "key-\(index % 7)") }
        var values: [String] = []
        for try await record in snapshot.records { values.append(text(record.value)) }
        await snapshot.close()
        #expect(values.count == 50)
        #expect(Set(values) == Set((0..<50).map(String.init)))
        #expect(snapshot.expectedCount >= 50)
        await fixture.close()
    }

    @Test(arguments: LogUnderTest.allCases)
    func anAcknowledgedAppendIsThereAfterARestart(_ kind: LogUnderTest) async throws {
        let fixture = try LogFixture(kind)
        var positions: [RecordPosition] = []
        for index in 0..<20 { positions.append(try await fixture.append("\(index)", key: "key-\(index % 3)")) }
        #expect(Set(positions).count == 20, "every append has its own position")
        try await fixture.restart()
        let snapshot = try fixture.log.snapshot(of: fixture.topic)
        var found: [RecordPosition: String] = [:]
        for try await record in snapshot.records {
            found[RecordPosition(topic: record.topic, partition: record.partition, offset: record.offset)] = text(record.value)
        }
        for (index, position) in positions.enumerated() { #expect(found[position] == "\(index)") }
        await fixture.close()
    }
}
