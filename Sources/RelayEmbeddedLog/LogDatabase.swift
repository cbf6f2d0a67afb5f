import Foundation
import GRDB
import RelaySQLite
import RelayCore

/// The embedded log's SQLite database: topics and their partitions, records, and each consumer group's
/// next offset per partition. WAL with `synchronous = FULL`: a commit is on disk (the WAL fsynced) before
/// it returns, so an acknowledged append survives `kill -9` and power loss.
final class LogDatabase: Sendable {
    /// A WAL database pool on disk, or one in-memory connection (`inMemory`).
    let pool: any DatabaseWriter
    let path: String

    /// A topic as stored: its id in `record`, partition count, and how retention treats it.
    struct Topic: Sendable, Hashable {
        var id: Int64
        var name: String
        var partitions: Int32
        /// Keep only the newest record per key (Kafka's cleanup.policy=compact).
        var compacted: Bool
        /// Exempt from age retention (dead letters, the replay ledger): only the size bound removes them.
        var keptByAge: Bool
    }

    init(path: String) throws {
        self.path = path
        // WAL with a synced commit: durable on power loss, not only on a crash; checkpointed beside the commits
        // by the owner (`EmbeddedRecordLog`).
        let pool = try DurableSQLite.openPool(path: path, busyTimeout: 30)
        self.pool = pool
        try Self.migrator.migrate(pool)
    }

    /// The writer connection's `synchronous` level (2: FULL).
    func synchronousLevel() throws -> Int {
        guard let pool = pool as? DatabasePool else { return -1 }
        return try DurableSQLite.synchronousLevel(pool)
    }

    /// A database in memory only: the same schema and code, nothing kept (tests of the stages).
    init(inMemory name: String) throws {
        path = ":memory:\(name)"
        pool = try DatabaseQueue(named: name)
        try Self.migrator.migrate(pool)
    }

    private static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1: topics, records, group offsets") { db in
            try db.execute(
                sql: """
                    CREATE TABLE topic (
                        id INTEGER PRIMARY KEY,
                        name TEXT NOT NULL UNIQUE,
                        partitions INTEGER NOT NULL,
                        compacted INTEGER NOT NULL,
                        kept_by_age INTEGER NOT NULL
                    );
                    CREATE TABLE partition_state (
                        topic_id INTEGER NOT NULL,
                        partition INTEGER NOT NULL,
                        next_offset INTEGER NOT NULL,
                        bytes INTEGER NOT NULL,
                        PRIMARY KEY (topic_id, partition)
                    ) WITHOUT ROWID;
                    CREATE TABLE record (
                        id INTEGER PRIMARY KEY,
                        topic_id INTEGER NOT NULL,
                        partition INTEGER NOT NULL,
                        offset INTEGER NOT NULL,
                        timestamp INTEGER NOT NULL,
                        key BLOB,
                        value BLOB NOT NULL,
                        headers BLOB NOT NULL,
                        size INTEGER NOT NULL
                    );
                    CREATE UNIQUE INDEX record_position ON record (topic_id, partition, offset);
                    CREATE TABLE group_offset (
                        group_id TEXT NOT NULL,
                        topic_id INTEGER NOT NULL,
                        partition INTEGER NOT NULL,
                        next_offset INTEGER NOT NULL,
                        PRIMARY KEY (group_id, topic_id, partition)
                    ) WITHOUT ROWID;
                    """)
        }
        migrator.registerMigration("v2: cumulative bytes per partition") { db in
            // `end_bytes`: the partition's bytes appended up to and including the record, so the bytes from any
            // offset to the end are one lookup (the budget of unprocessed records). Records from before stay
            // NULL: filling them would rewrite every row (and its value) in one transaction. The count starts
            // at what the partition holds (`bytes`, kept current by the appends); `bytes(from:)` sums those
            // older records when it has to, until retention has removed them.
            try db.execute(
                sql: """
                    ALTER TABLE record ADD COLUMN end_bytes INTEGER;
                    ALTER TABLE partition_state ADD COLUMN appended_bytes INTEGER NOT NULL DEFAULT 0;
                    UPDATE partition_state SET appended_bytes = bytes;
                    """)
        }
        return migrator
    }

    /// Creates the topics that do not exist yet, with `partitions` partitions each. An existing topic keeps
    /// its partition count (records are placed by key hash over it; changing it would reorder a key).
    func ensureTopics(_ names: [String], partitions: Int32, compacted: Set<String>, keptByAge: Set<String>) throws -> [String: Topic] {
        try pool.write { db in
            for name in names {
                guard try Int64.fetchOne(db, sql: "SELECT id FROM topic WHERE name = ?", arguments: [name]) == nil else { continue }
                try db.execute(
                    sql: "INSERT INTO topic (name, partitions, compacted, kept_by_age) VALUES (?, ?, ?, ?)",
                    arguments: [name, partitions, compacted.contains(name), keptByAge.contains(name)])
                let id = db.lastInsertedRowID
                for partition in 0..<partitions {
                    try db.execute(
                        sql: "INSERT INTO partition_state (topic_id, partition, next_offset, bytes) VALUES (?, ?, 0, 0)", arguments: [id, partition])
                }
            }
            return try Self.topics(db)
        }
    }

    func topics() throws -> [String: Topic] {
        try pool.read { db in try Self.topics(db) }
    }

    static func topics(_ db: Database) throws -> [String: Topic] {
        var result: [String: Topic] = [:]
        for row in try Row.fetchAll(db, sql: "SELECT id, name, partitions, compacted, kept_by_age FROM topic") {
            let topic = Topic(id: row["id"], name: row["name"], partitions: row["partitions"], compacted: row["compacted"], keptByAge: row["kept_by_age"])
            result[topic.name] = topic
        }
        return result
    }

    /// Each partition's start (oldest offset kept) and end (next offset) of a topic.
    func ends(of topic: Topic) throws -> [PartitionEnd] {
        try pool.read { db in
            try Row.fetchAll(
                db,
                sql: """
                    SELECT p.partition, p.next_offset, (SELECT MIN(offset) FROM record r WHERE r.topic_id = p.topic_id AND r.partition = p.partition) AS start
                    FROM partition_state p WHERE p.topic_id = ? ORDER BY p.partition
                    """, arguments: [topic.id]
            ).map { row in
                let end: Int64 = row["next_offset"]
                return PartitionEnd(topic: topic.name, partition: row["partition"], endOffset: end, startOffset: row["start"] ?? end)
            }
        }
    }

    /// Where group `group` goes on in each partition of `topic` (absent: it has stored nothing there).
    func groupOffsets(_ group: String, topic: Topic) throws -> [Int32: Int64] {
        try pool.read { db in
            var result: [Int32: Int64] = [:]
            for row in try Row.fetchAll(
                db, sql: "SELECT partition, next_offset FROM group_offset WHERE group_id = ? AND topic_id = ?", arguments: [group, topic.id])
            {
                result[row["partition"]] = row["next_offset"]
            }
            return result
        }
    }

    /// The bytes of one partition's records from `offset` to its end (records retention removed count as 0).
    static func bytes(_ db: Database, topic: Int64, partition: Int32, from offset: Int64) throws -> Int64 {
        let appended = try Int64.fetchOne(
            db.cachedStatement(sql: "SELECT appended_bytes FROM partition_state WHERE topic_id = ? AND partition = ?"),
            arguments: [topic, partition]) ?? 0
        // The first record kept at or after `offset`: the partition's bytes before it are its end_bytes - size.
        guard let first = try Row.fetchOne(
            db.cachedStatement(sql: "SELECT end_bytes, size FROM record WHERE topic_id = ? AND partition = ? AND offset >= ? ORDER BY offset LIMIT 1"),
            arguments: [topic, partition, offset])
        else { return 0 }
        if let end = first[0] as Int64? { return max(0, appended - (end - (first[1] as Int64))) }
        // A record from before the count (a log upgraded from v1): add up what is left from there.
        return try Int64.fetchOne(
            db.cachedStatement(sql: "SELECT COALESCE(SUM(size), 0) FROM record WHERE topic_id = ? AND partition = ? AND offset >= ?"),
            arguments: [topic, partition, offset]) ?? 0
    }

    /// The lowest offset every one of `groups` goes on from in one partition: what all of them processed is
    /// below it. A group that stored nothing there has processed nothing (0).
    static func processedFloor(_ db: Database, topic: Int64, partition: Int32, groups: [String]) throws -> Int64? {
        guard !groups.isEmpty else { return nil }
        var floor = Int64.max
        for group in groups {
            let stored = try Int64.fetchOne(
                db.cachedStatement(sql: "SELECT next_offset FROM group_offset WHERE group_id = ? AND topic_id = ? AND partition = ?"),
                arguments: [group, topic, partition]) ?? 0
            floor = min(floor, stored)
        }
        return floor
    }

    /// Up to `limit` records of one partition from `offset` on, in offset order.
    static func records(_ db: Database, topic: Topic, partition: Int32, from offset: Int64, below end: Int64 = .max, limit: Int) throws
        -> [ConsumedRecord]
    {
        let statement = try db.cachedStatement(
            sql: """
                SELECT offset, timestamp, key, value, headers FROM record
                WHERE topic_id = ? AND partition = ? AND offset >= ? AND offset < ? ORDER BY offset LIMIT ?
                """)
        var records: [ConsumedRecord] = []
        // Bound, stepped and read with SQLite's own calls (DirectRead), the columns by index in the SELECT's
        // order. Through `Row` each value was a generic decode (a metadata lookup) and each blob two copies
        // (Data, then an array): a third of the consumers' CPU under a steady load.
        try DirectRead(statement).forEach { parameters in
            parameters.int64(topic.id)
            parameters.int64(Int64(partition))
            parameters.int64(offset)
            parameters.int64(end)
            parameters.int64(Int64(limit))
        } row: { columns in
            records.append(
                ConsumedRecord(
                    topic: topic.name, partition: partition, offset: columns.int64(0), key: columns.bytes(2), value: columns.bytes(3) ?? [],
                    headers: HeaderCoding.decode(columns.bytes(4) ?? []), timestampMilliseconds: columns.int64(1), assignmentGeneration: 1))
        }
        return records
    }

    /// Every partition's next offset, keyed by `partitionKey`.
    static func ends(_ db: Database) throws -> [Int64: Int64] {
        var ends: [Int64: Int64] = [:]
        try DirectRead(db.cachedStatement(sql: "SELECT topic_id, partition, next_offset FROM partition_state")).forEach { _ in } row: { columns in
            ends[partitionKey(topic: columns.int64(0), partition: Int32(truncatingIfNeeded: columns.int64(1)))] = columns.int64(2)
        }
        return ends
    }

    /// One key for a topic's partition.
    static func partitionKey(topic: Int64, partition: Int32) -> Int64 {
        topic << 32 | Int64(UInt32(bitPattern: partition))
    }
}

/// Record headers as one blob: a count, then each name and value with its length (big-endian UInt32).
enum HeaderCoding {
    static func encode(_ headers: [RecordHeader]) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(4 + headers.reduce(0) { $0 + 8 + $1.name.utf8.count + $1.value.count })
        append(UInt32(headers.count), to: &bytes)
        for header in headers {
            append(UInt32(header.name.utf8.count), to: &bytes)
            bytes.append(contentsOf: header.name.utf8)
            append(UInt32(header.value.count), to: &bytes)
            bytes.append(contentsOf: header.value)
        }
        return bytes
    }

    /// The headers, or as many as the blob holds intact (it is only ever written by `encode`).
    static func decode(_ bytes: [UInt8]) -> [RecordHeader] {
        var index = 0
        func next() -> UInt32? {
            guard index + 4 <= bytes.count else { return nil }
            defer { index += 4 }
            return bytes[index..<index + 4].reduce(0) { $0 << 8 | UInt32($1) }
        }
        func take(_ count: Int) -> ArraySlice<UInt8>? {
            guard count >= 0, index + count <= bytes.count else { return nil }
            defer { index += count }
            return bytes[index..<index + count]
        }
        guard let count = next() else { return [] }
        var headers: [RecordHeader] = []
        for _ in 0..<count {
            guard let nameLength = next(), let name = take(Int(nameLength)), let valueLength = next(), let value = take(Int(valueLength)) else { break }
            headers.append(RecordHeader(name: String(decoding: name, as: UTF8.self), value: Array(value)))
        }
        return headers
    }

    private static func append(_ value: UInt32, to bytes: inout [UInt8]) {
        bytes.append(UInt8(value >> 24))
        bytes.append(UInt8(value >> 16 & 0xff))
        bytes.append(UInt8(value >> 8 & 0xff))
        bytes.append(UInt8(value & 0xff))
    }
}
