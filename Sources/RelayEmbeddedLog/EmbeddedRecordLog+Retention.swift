import CoreMetrics
import Foundation
import GRDB
import Glibc
import Logging
import RelayCore
import Synchronization

/// The owner's retention and compaction, once a minute between the writer's batches (docs/operations.md,
/// "The ingest on the internet"): by age and by size, never below what the topic's consumer groups processed.
extension EmbeddedRecordLog {
    /// Records per deleting transaction: appends wait for one chunk at most, not for a whole sweep.
    static let housekeepingChunk = 2_000

    static func housekeep(
        _ database: LogDatabase, retention: Duration, retentionBytes: Int64, retainedFor: [String: [String]], removals: LabeledCounters,
        now: Int64 = wallClockMilliseconds(), logger: Logger
    ) {
        do {
            let cutoff = now - retention.wholeMilliseconds
            for topic in try database.topics().values {
                if topic.compacted {
                    // The replay ledger: small, one record per dead letter replayed.
                    try database.pool.write { db in
                        try db.execute(
                            sql: """
                                DELETE FROM record WHERE topic_id = ? AND key IS NOT NULL AND id NOT IN (
                                    SELECT MAX(id) FROM record WHERE topic_id = ? AND key IS NOT NULL GROUP BY partition, key)
                                """, arguments: [topic.id, topic.id])
                        try recount(db, topic: topic)
                    }
                }
                for partition in 0..<topic.partitions {
                    // Oldest first, a chunk per transaction, while the oldest record is past its age or the
                    // partition over its size (appends keep partition_state.bytes current), and never a record
                    // one of the topic's groups has not processed.
                    let groups = retainedFor[topic.name] ?? []
                    var removed = Removed()
                    while try database.pool.write({ db in
                        let floor = try LogDatabase.processedFloor(db, topic: topic.id, partition: partition, groups: groups)
                        return try removeOldestChunk(
                            db, topic: topic, partition: partition, cutoff: topic.keptByAge ? nil : cutoff, maximumBytes: retentionBytes, floor: floor,
                            removed: &removed)
                    }) {}
                    if removed.byAge > 0 { removals.increment([("topic", topic.name), ("reason", "age")], by: removed.byAge) }
                    if removed.bySize > 0 {
                        removals.increment([("topic", topic.name), ("reason", "size")], by: removed.bySize)
                        // With groups, the size bound removes only what they processed (expected); without, it removes
                        // records nobody may have looked at yet (rejected notifications, dead letters) before their age.
                        if groups.isEmpty {
                            logger.warning(
                                "records removed by log.retentionBytes before log.retention",
                                metadata: ["topic": "\(topic.name)", "partition": "\(partition)", "records": "\(removed.bySize)"])
                        }
                    }
                    // What the groups have not processed stays, past its age too: say so, it means a stopped consumer.
                    if !groups.isEmpty, !topic.keptByAge, let kept = try database.pool.read({ db in
                        try overdue(db, topic: topic, partition: partition, groups: groups, cutoff: cutoff)
                    }) {
                        logger.warning(
                            "records past log.retention are kept: their consumer groups have not processed them",
                            metadata: [
                                "topic": "\(topic.name)", "partition": "\(partition)", "records": "\(kept.count)",
                                "oldest_age_seconds": "\((now - kept.oldest) / 1000)", "groups": "\(groups.joined(separator: ", "))",
                            ])
                    }
                }
            }
        } catch {
            logger.warning("embedded log retention failed; trying again later", metadata: [LogKey.error: "\(error)"])
        }
    }

    /// When the oldest record the groups have not processed is older than `cutoff`: how many records are
    /// unprocessed, and its time. One indexed lookup (not a scan of what is unprocessed).
    private static func overdue(_ db: Database, topic: LogDatabase.Topic, partition: Int32, groups: [String], cutoff: Int64) throws
        -> (count: Int64, oldest: Int64)?
    {
        guard let floor = try LogDatabase.processedFloor(db, topic: topic.id, partition: partition, groups: groups),
            let row = try Row.fetchOne(
                db, sql: "SELECT offset, timestamp FROM record WHERE topic_id = ? AND partition = ? AND offset >= ? ORDER BY offset LIMIT 1",
                arguments: [topic.id, partition, floor]),
            (row[1] as Int64) < cutoff
        else { return nil }
        let end = try Int64.fetchOne(
            db, sql: "SELECT next_offset FROM partition_state WHERE topic_id = ? AND partition = ?", arguments: [topic.id, partition]) ?? 0
        return (max(0, end - (row[0] as Int64)), row[1])
    }

    /// Records one retention pass removed from a partition, by the bound that removed them.
    struct Removed {
        var byAge: Int64 = 0
        var bySize: Int64 = 0
    }

    /// Deletes the oldest records of one partition that are older than `cutoff` or over `maximumBytes` and below
    /// `floor` (what every group of the topic processed; nil: no group), at most a chunk; returns whether more may remain.
    private static func removeOldestChunk(
        _ db: Database, topic: LogDatabase.Topic, partition: Int32, cutoff: Int64?, maximumBytes: Int64, floor: Int64?, removed tally: inout Removed
    ) throws -> Bool {
        var bytes = try Int64.fetchOne(
            db, sql: "SELECT bytes FROM partition_state WHERE topic_id = ? AND partition = ?", arguments: [topic.id, partition]) ?? 0
        let oldest = try Row.fetchAll(
            db, sql: "SELECT offset, timestamp, size FROM record WHERE topic_id = ? AND partition = ? ORDER BY offset LIMIT ?",
            arguments: [topic.id, partition, housekeepingChunk])
        var below: Int64?
        var removed: Int64 = 0
        for row in oldest {
            if let floor, (row["offset"] as Int64) >= floor { break }
            let expired = cutoff.map { (row["timestamp"] as Int64) < $0 } ?? false
            guard expired || bytes > maximumBytes else { break }
            if expired { tally.byAge += 1 } else { tally.bySize += 1 }
            let size: Int64 = row["size"]
            bytes -= size
            removed += size
            below = (row["offset"] as Int64) + 1
        }
        guard let below else { return false }
        try db.execute(sql: "DELETE FROM record WHERE topic_id = ? AND partition = ? AND offset < ?", arguments: [topic.id, partition, below])
        try db.execute(
            sql: "UPDATE partition_state SET bytes = MAX(0, bytes - ?) WHERE topic_id = ? AND partition = ?", arguments: [removed, topic.id, partition])
        return oldest.count == housekeepingChunk
    }

    /// Sets each partition's byte count from its records (after compaction removed records anywhere).
    private static func recount(_ db: Database, topic: LogDatabase.Topic) throws {
        try db.execute(
            sql: """
                UPDATE partition_state SET bytes = (SELECT COALESCE(SUM(size), 0) FROM record r
                    WHERE r.topic_id = partition_state.topic_id AND r.partition = partition_state.partition)
                WHERE topic_id = ?
                """, arguments: [topic.id])
    }
}
