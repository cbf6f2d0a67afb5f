import Foundation
import GRDB
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
        do {
            _ = try await reopened.producer.produce(OutgoingRecord(topic: "notifications", key: nil, value: [0]))
            Issue.record("an append to a full budget was taken")
        } catch {
            #expect(error.code == .full)
        }
        await reopened.close()
    }

    @Test func onlyTheFullPartitionRefusesAndItReopensBelowNinetyPercent() async throws {
        let log = try EmbeddedRecordLog(
            directory: EmbeddedLogTests.directory(), topics: ["notifications"], partitions: 2, retainedFor: ["notifications": ["worker"]],
            budgeted: ["notifications"], retentionBytes: Self.megabyte, logger: testLogger())
        let producer = try log.producer
        // Keys that hash to partition 0 and to partition 1.
        func key(for partition: Int32) -> [UInt8] {
            (0...).lazy.map { Array("k\($0)".utf8) }.first { Int32(Int(Self.fnv1a($0)) % 2) == partition }!
        }
        let hot = key(for: 0)
        let cold = key(for: 1)
        var taken = 0
        while true {
            do {
                _ = try await producer.produce(OutgoingRecord(topic: "notifications", key: hot, value: Array(repeating: 1, count: 100_000)))
                taken += 1
            } catch {
                #expect(error.code == .full)
                break
            }
        }
        #expect(taken == 11)
        #expect(log.isFull("notifications"))
        // The other partition still takes its notifications.
        _ = try await producer.produce(OutgoingRecord(topic: "notifications", key: cold, value: [2]))

        // The worker processes one record of the full partition (100 kB of 1.1 MB): still over 90%, still full.
        let consumer = try log.consumer(ConsumerOptions(groupID: "worker", topics: ["notifications"]))
        let collector = RecordCollector(consumer.records)
        let records = try await collector.waitFor(count: 12).filter { $0.partition == 0 }.sorted { $0.offset < $1.offset }
        consumer.markDone(records[0])
        try await waitUntil("one record stored") { try log.committedOffsets(group: "worker", topic: "notifications")[0] == 1 }
        log.countUnprocessed()
        #expect(log.isFull("notifications"), "no flapping at the limit: it opens under 90%")
        // Two more (under 900 kB unprocessed): open.
        consumer.markDone(records[1])
        consumer.markDone(records[2])
        try await waitUntil("three records stored") { try log.committedOffsets(group: "worker", topic: "notifications")[0] == 3 }
        log.countUnprocessed()
        #expect(!log.isFull("notifications"))
        _ = try await producer.produce(OutgoingRecord(topic: "notifications", key: hot, value: [3]))
        await consumer.close()
        await log.close()
    }

    /// FNV-1a, as the embedded log places keyed records.
    static func fnv1a(_ bytes: [UInt8]) -> UInt32 {
        bytes.reduce(2_166_136_261) { ($0 ^ UInt32($1)) &* 16_777_619 }
    }

    @Test func aLogFromBeforeTheByteCountIsCountedAfterItsUpgrade() async throws {
        // A log as the previous version wrote it: the v1 schema, three records of 300 kB, one processed.
        let directory = EmbeddedLogTests.directory()
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let queue = try DatabaseQueue(path: directory + "/log.sqlite")
        try await queue.write { db in
            try db.execute(
                sql: """
                    CREATE TABLE grdb_migrations (identifier TEXT NOT NULL PRIMARY KEY);
                    INSERT INTO grdb_migrations VALUES ('v1: topics, records, group offsets');
                    CREATE TABLE topic (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, partitions INTEGER NOT NULL, compacted INTEGER NOT NULL,
                        kept_by_age INTEGER NOT NULL);
                    CREATE TABLE partition_state (topic_id INTEGER NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
                        bytes INTEGER NOT NULL, PRIMARY KEY (topic_id, partition)) WITHOUT ROWID;
                    CREATE TABLE record (id INTEGER PRIMARY KEY, topic_id INTEGER NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
                        timestamp INTEGER NOT NULL, key BLOB, value BLOB NOT NULL, headers BLOB NOT NULL, size INTEGER NOT NULL);
                    CREATE UNIQUE INDEX record_position ON record (topic_id, partition, offset);
                    CREATE TABLE group_offset (group_id TEXT NOT NULL, topic_id INTEGER NOT NULL, partition INTEGER NOT NULL,
                        next_offset INTEGER NOT NULL, PRIMARY KEY (group_id, topic_id, partition)) WITHOUT ROWID;
                    INSERT INTO topic VALUES (1, 'notifications', 1, 0, 0);
                    INSERT INTO partition_state VALUES (1, 0, 3, 900000);
                    INSERT INTO group_offset VALUES ('worker', 1, 0, 1);
                    """)
            for offset in 0..<3 {
                try db.execute(
                    sql: "INSERT INTO record (topic_id, partition, offset, timestamp, key, value, headers, size) VALUES (1, 0, ?, ?, NULL, ?, ?, 300000)",
                    arguments: [offset, wallClockMilliseconds(), Data(count: 300_000), Data([0, 0, 0, 0])])
            }
        }
        try queue.close()

        let log = try EmbeddedRecordLog(
            directory: directory, topics: ["notifications"], partitions: 1, retainedFor: ["notifications": ["worker"]], budgeted: ["notifications"],
            retentionBytes: Self.megabyte, logger: testLogger())
        log.countUnprocessed()
        #expect(log.unprocessedBytes(of: "notifications")[0] == 600_000, "two of the old records are unprocessed")
        let producer = try log.producer
        _ = try await producer.produce(OutgoingRecord(topic: "notifications", key: nil, value: Array(repeating: 0, count: 300_000)))
        log.countUnprocessed()
        #expect(log.unprocessedBytes(of: "notifications")[0] == 900_000)
        _ = try await producer.produce(OutgoingRecord(topic: "notifications", key: nil, value: Array(repeating: 0, count: 300_000)))
        #expect(log.isFull("notifications"))
        // The worker gets past the old records: the count comes from the new ones alone.
        let consumer = try log.consumer(ConsumerOptions(groupID: "worker", topics: ["notifications"]))
        let collector = RecordCollector(consumer.records)
        let records = try await collector.waitFor(count: 4).sorted { $0.offset < $1.offset }
        #expect(records.map(\.offset) == [1, 2, 3, 4])
        for record in records.prefix(3) { consumer.markDone(record) }
        try await waitUntil("the old records processed") { try log.committedOffsets(group: "worker", topic: "notifications")[0] == 4 }
        log.countUnprocessed()
        #expect(log.unprocessedBytes(of: "notifications")[0] == 300_000)
        #expect(!log.isFull("notifications"))
        await consumer.close()
        await log.close()
    }
}
