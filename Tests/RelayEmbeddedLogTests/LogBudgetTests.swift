import Foundation
import RelayCore
import RelayEmbeddedLog
import RelayTestSupport
import Testing

/// Retention never removes what a topic's consumer groups have not processed, and a budgeted topic
/// refuses appends (`full`) while a partition holds `retentionBytes` of unprocessed records: a flood
/// while the worker is stopped cannot push real notifications out of the log.
@Suite struct LogBudgetTests {
    static let megabyte: Int64 = 1_048_576

    func values(_ log: EmbeddedRecordLog, _ topic: String) async throws -> [String] {
        var values: [String] = []
        for try await record in try log.snapshot(of: topic).records { values.append(text(record.key ?? [])) }
        return values
    }

    @Test func aFloodWhileTheWorkerIsStoppedEvictsNothingUnprocessedAndIsRefusedOnceTheBudgetIsFull() async throws {
        let log = try EmbeddedRecordLog(
            directory: EmbeddedLogTests.directory(), topics: ["notifications", "rejected"], partitions: 1, retainedFor: ["notifications": ["worker"]],
            budgeted: ["notifications"], retentionBytes: Self.megabyte, logger: testLogger())
        let producer = try log.producer
        let real = (0..<10).map { "real-\($0)" }
        for key in real { _ = try await producer.produce(OutgoingRecord(topic: "notifications", key: Array(key.utf8), value: Array(repeating: 1, count: 1_000))) }
        // 8 MB of junk: appended until the budget is full, then refused.
        var junk = 0
        var refused = 0
        for index in 0..<80 {
            do {
                _ = try await producer.produce(OutgoingRecord(topic: "notifications", key: Array("junk-\(index)".utf8), value: Array(repeating: 2, count: 100_000)))
                junk += 1
            } catch {
                #expect(error.code == .full)
                #expect(error.isRetriable)
                #expect(error.reason.contains("log.retentionBytes"))
                refused += 1
            }
        }
        #expect(junk >= 10 && junk <= 11, "appended until 1 MiB was unprocessed (\(junk))")
        #expect(refused == 80 - junk)
        #expect(log.isFull("notifications"))
        #expect((log.unprocessedBytes(of: "notifications")[0] ?? 0) >= Self.megabyte)
        // Other topics are not budgeted: the worker's own writes go on.
        _ = try await producer.produce(OutgoingRecord(topic: "rejected", key: nil, value: Array(repeating: 3, count: 100_000)))

        // Retention by size and by age, an hour later: every unprocessed record stays.
        log.runHousekeeping(retention: .seconds(60), retentionBytes: Self.megabyte, now: wallClockMilliseconds() + 3_600_000)
        let kept = try await values(log, "notifications")
        #expect(Array(kept.prefix(10)) == real, "the real notifications are still there")
        #expect(kept.count == 10 + junk)

        // The worker catches up: the budget has room again, and retention may now remove what it processed.
        let consumer = try log.consumer(ConsumerOptions(groupID: "worker", topics: ["notifications"]))
        let collector = RecordCollector(consumer.records)
        let total = 10 + junk
        for record in try await collector.waitFor(count: total) { consumer.markDone(record) }
        try await waitUntil("the worker's offsets stored") { try log.committedOffsets(group: "worker", topic: "notifications")[0] == Int64(total) }
        log.countUnprocessed()
        #expect(!log.isFull("notifications"))
        #expect(log.unprocessedBytes(of: "notifications")[0] == 0)
        _ = try await producer.produce(OutgoingRecord(topic: "notifications", key: Array("after".utf8), value: Array(repeating: 1, count: 1_000)))
        log.runHousekeeping(retention: .seconds(3600), retentionBytes: Self.megabyte)
        let after = try await values(log, "notifications")
        #expect(after.last == "after")
        #expect(!after.contains("real-0"), "processed records over the size bound go, oldest first")
        await consumer.close()
        await log.close()
    }

    @Test func retentionWaitsForEveryGroupOfATopicAndAgeRemovesOnlyProcessedRecords() async throws {
        let log = try EmbeddedRecordLog(
            directory: EmbeddedLogTests.directory(), topics: ["events", "free"], partitions: 1, retainedFor: ["events": ["a", "b"]],
            logger: testLogger())
        let producer = try log.producer
        for index in 0..<6 {
            for topic in ["events", "free"] { _ = try await producer.produce(OutgoingRecord(topic: topic, key: Array("\(index)".utf8), value: [1])) }
        }
        // Group a processed 4 records, group b 2: the first 2 are processed by both.
        for (group, count) in [("a", 4), ("b", 2)] {
            let consumer = try log.consumer(ConsumerOptions(groupID: group, topics: ["events"]))
            let collector = RecordCollector(consumer.records)
            for record in try await collector.waitFor(count: 6).prefix(count) { consumer.markDone(record) }
            try await waitUntil("\(group)'s offsets stored") { try log.committedOffsets(group: group, topic: "events")[0] == Int64(count) }
            await consumer.close()
        }
        log.runHousekeeping(retention: .milliseconds(1), retentionBytes: Self.megabyte, now: wallClockMilliseconds() + 3_600_000)
        #expect(try await values(log, "events") == ["2", "3", "4", "5"], "past their age, but b has not processed these")
        #expect(try await values(log, "free") == [], "a topic no group is configured for keeps the plain age bound")
        await log.close()
    }

    @Test func countsSurviveReopeningTheLog() async throws {
        let directory = EmbeddedLogTests.directory()
        do {
            let log = try EmbeddedRecordLog(
                directory: directory, topics: ["notifications"], partitions: 1, retainedFor: ["notifications": ["worker"]], budgeted: ["notifications"],
                retentionBytes: Self.megabyte, logger: testLogger())
            for index in 0..<11 {
                _ = try? await log.producer.produce(OutgoingRecord(topic: "notifications", key: Array("\(index)".utf8), value: Array(repeating: 0, count: 100_000)))
            }
            #expect(log.isFull("notifications"))
            await log.close()
        }
        // A restart does not forget what is unprocessed: the budget is still full.
        let reopened = try EmbeddedRecordLog(
            directory: directory, topics: ["notifications"], partitions: 1, retainedFor: ["notifications": ["worker"]], budgeted: ["notifications"],
            retentionBytes: Self.megabyte, logger: testLogger())
        reopened.countUnprocessed()
        #expect(reopened.isFull("notifications"))
        await #expect(throws: RecordLogError.self) {
            try await reopened.producer.produce(OutgoingRecord(topic: "notifications", key: nil, value: [0]))
        }
        await reopened.close()
    }
}
