public import CoreMetrics
import Foundation
import GRDB
import Glibc
public import Logging
public import RelayConfig
public import RelayCore
import Synchronization

/// The embedded durable record log: one machine, no broker, the Kafka semantics the stages rely on, in a
/// SQLite database (`log.sqlite`) in a data directory.
///
/// - **Owner.** One process owns a data directory: the one that consumes (`run`, `dev`). It holds an
///   exclusive lock on `owner.lock` while open; a second owner fails at once, naming the directory. Tools
///   (`replay`, `tail`, `topics`) open it without owning it: they read and append, the owner's consumers
///   see their appends.
/// - **Durability.** An append is acknowledged after its transaction is committed with `synchronous =
///   FULL` in WAL mode (on disk, fsynced), group-committed with every other waiting append.
/// - **Retention** (the owner, once a minute): records older than `log.retention` go, except in the
///   dead-letter topic and the replay ledger; the oldest records of a partition over `log.retentionBytes`
///   go; the replay ledger is compacted to the newest record per key.
public final class EmbeddedRecordLog: RecordLog {
    public let directory: String
    private let database: LogDatabase
    private let topics: [String: LogDatabase.Topic]
    private let appender: EmbeddedAppender
    private let consumers: ConsumerRegistry
    private let lock: OwnerLock?
    /// Consumes (holds the directory's lock, or is in memory).
    private let isOwner: Bool
    private let logger: Logger
    private let metrics: any MetricsFactory

    /// Why the data directory cannot be owned: another process owns it.
    public struct AlreadyOwned: Error, CustomStringConvertible {
        public var directory: String
        public var description: String {
            "the embedded log in \(directory) is in use by another revenue-relay process (it holds \(directory)/owner.lock);"
                + " stop it, or give this one another directory (log.path, or dev --data)"
        }
    }

    /// Opens (creating if needed) the log at `log.path` with every topic the configuration uses.
    /// - Parameter owner: take the directory's lock (a process that consumes); tools pass false.
    public static func open(
        configuration: RelayConfiguration, directory: String? = nil, owner: Bool = true, logger: Logger,
        metrics: any MetricsFactory = MetricsSystem.factory
    ) throws -> EmbeddedRecordLog {
        let topics = configuration.topics
        return try EmbeddedRecordLog(
            directory: directory ?? configuration.log.path, topics: topics.all(retrySteps: configuration.delivery.retrySchedule.count),
            partitions: configuration.log.partitions, compacted: [topics.replayed], keptByAge: [topics.deadLetter, topics.replayed],
            retention: configuration.log.retention, retentionBytes: configuration.log.retentionBytes, owner: owner, logger: logger, metrics: metrics)
    }

    public convenience init(
        directory: String, topics names: [String], partitions: Int, compacted: Set<String> = [], keptByAge: Set<String> = [],
        retention: Duration = .seconds(7 * 86_400), retentionBytes: Int64 = 1 << 30, owner: Bool = true, logger: Logger,
        metrics: any MetricsFactory = MetricsSystem.factory
    ) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let lock = owner ? try OwnerLock(path: directory + "/owner.lock", directory: directory) : nil
        try self.init(
            directory: directory, database: try LogDatabase(path: directory + "/log.sqlite"), lock: lock, owner: owner, topics: names,
            partitions: partitions, compacted: compacted, keptByAge: keptByAge, retention: retention, retentionBytes: retentionBytes,
            logger: logger, metrics: metrics)
    }

    /// The log in memory: the embedded log's code and semantics with nothing on disk, for tests of the stages
    /// (no broker, no directory). It lives as long as the instance.
    public static func inMemory(
        topics names: [String], partitions: Int, compacted: Set<String> = [], logger: Logger, metrics: any MetricsFactory = MetricsSystem.factory
    ) throws -> EmbeddedRecordLog {
        let name = "relay-log-\(UInt64.random(in: 0...UInt64.max))"
        return try EmbeddedRecordLog(
            directory: ":memory:", database: try LogDatabase(inMemory: name), lock: nil, owner: true, topics: names, partitions: partitions,
            compacted: compacted, keptByAge: [], retention: .seconds(7 * 86_400), retentionBytes: 1 << 30, logger: logger, metrics: metrics)
    }

    private init(
        directory: String, database: LogDatabase, lock: OwnerLock?, owner: Bool, topics names: [String], partitions: Int, compacted: Set<String>,
        keptByAge: Set<String>, retention: Duration, retentionBytes: Int64, logger: Logger, metrics: any MetricsFactory
    ) throws {
        let topics = try database.ensureTopics(names, partitions: Int32(partitions), compacted: compacted, keptByAge: keptByAge)
        let consumers = ConsumerRegistry()
        let housekeep: @Sendable () -> Void = {
            EmbeddedRecordLog.housekeep(database, retention: retention, retentionBytes: retentionBytes, logger: logger)
        }
        let housekeeping: (interval: Duration, run: @Sendable () -> Void)? = owner ? (.seconds(60), housekeep) : nil
        self.directory = directory
        self.database = database
        self.topics = topics
        self.lock = lock
        self.isOwner = owner
        self.consumers = consumers
        self.logger = logger
        self.metrics = metrics
        self.appender = EmbeddedAppender(
            database: database, topics: topics, logger: logger, metrics: metrics, housekeeping: housekeeping,
            onAppend: { appended in
                for consumer in consumers.all where !consumer.subscribedTopics.isDisjoint(with: appended) { consumer.notify() }
            })
    }

    public var producer: any RecordProducer {
        get throws(RecordLogError) { appender }
    }

    public func consumer(_ options: ConsumerOptions) throws(RecordLogError) -> any RecordConsumer {
        guard isOwner else {
            throw RecordLogError(
                code: .configuration, reason: "only the process that owns \(directory) consumes from it (tools read and append)", isRetriable: false)
        }
        let consumer: EmbeddedConsumer
        do {
            consumer = try EmbeddedConsumer(options: options, database: database, topics: topics, logger: logger, metrics: metrics)
        } catch let error as RecordLogError {
            throw error
        } catch {
            throw RecordLogError(code: .other, reason: "cannot read the embedded log's consumer offsets: \(error)", isRetriable: true)
        }
        consumers.add(consumer)
        return consumer
    }

    public func snapshot(of topic: String) throws(RecordLogError) -> any TopicSnapshot {
        try read(topic, from: [:], follow: false)
    }

    public func read(_ topic: String, from offsets: [Int32: Int64], follow: Bool) throws(RecordLogError) -> any TopicSnapshot {
        let stored = try self.topic(topic)
        do {
            let ends = try database.ends(of: stored).map { end in
                var end = end
                end.startOffset = max(end.startOffset, offsets[end.partition] ?? end.startOffset)
                return end
            }
            return EmbeddedSnapshot(database: database, topic: stored, ends: ends, follow: follow)
        } catch {
            throw RecordLogError(code: .other, reason: "cannot read \(topic): \(error)", isRetriable: true)
        }
    }

    public func partitionEnds(of topic: String) throws(RecordLogError) -> [PartitionEnd] {
        let stored = try self.topic(topic)
        do {
            return try database.ends(of: stored)
        } catch {
            throw RecordLogError(code: .other, reason: "cannot read \(topic): \(error)", isRetriable: true)
        }
    }

    public func committedOffsets(group: String, topic: String) throws(RecordLogError) -> [Int32: Int64] {
        let stored = try self.topic(topic)
        do {
            return try database.groupOffsets(group, topic: stored)
        } catch {
            throw RecordLogError(code: .other, reason: "cannot read group \(group)'s offsets: \(error)", isRetriable: true)
        }
    }

    private func topic(_ name: String) throws(RecordLogError) -> LogDatabase.Topic {
        guard let stored = topics[name] ?? (try? database.topics())?[name] else {
            throw RecordLogError(code: .configuration, reason: "the embedded log in \(directory) has no topic \(name)", isRetriable: false)
        }
        return stored
    }

    /// Always: the log is on this machine's disk.
    public var isAvailable: Bool { true }

    /// Answers the appends in flight, stops the writer and, for the owner, releases the data directory.
    public func close() async {
        await appender.close()
        lock?.release()
    }

    /// Each topic's partitions with their start and end offsets, by topic name.
    public func partitionEnds() throws -> [String: [PartitionEnd]] {
        var result: [String: [PartitionEnd]] = [:]
        for (name, topic) in try database.topics() { result[name] = try database.ends(of: topic) }
        return result
    }

    /// Every consumer group's next offset per partition.
    public func groupOffsets() throws -> [(group: String, topic: String, partition: Int32, next: Int64)] {
        try database.groups()
    }

    /// Runs the owner's retention and compaction now (tests; the owner runs them once a minute).
    public func runHousekeeping(retention: Duration, retentionBytes: Int64, now: Int64 = wallClockMilliseconds()) {
        Self.housekeep(database, retention: retention, retentionBytes: retentionBytes, now: now, logger: logger)
    }

    static func housekeep(_ database: LogDatabase, retention: Duration, retentionBytes: Int64, now: Int64 = wallClockMilliseconds(), logger: Logger) {
        do {
            try database.pool.write { db in
                let cutoff = now - retention.wholeMilliseconds
                for topic in try LogDatabase.topics(db).values {
                    if topic.compacted {
                        try db.execute(
                            sql: """
                                DELETE FROM record WHERE topic_id = ? AND key IS NOT NULL AND id NOT IN (
                                    SELECT MAX(id) FROM record WHERE topic_id = ? AND key IS NOT NULL GROUP BY partition, key)
                                """, arguments: [topic.id, topic.id])
                    }
                    if !topic.keptByAge {
                        try db.execute(sql: "DELETE FROM record WHERE topic_id = ? AND timestamp < ?", arguments: [topic.id, cutoff])
                    }
                    for partition in 0..<topic.partitions {
                        var bytes = try Int64.fetchOne(
                            db, sql: "SELECT COALESCE(SUM(size), 0) FROM record WHERE topic_id = ? AND partition = ?", arguments: [topic.id, partition]) ?? 0
                        if bytes > retentionBytes {
                            // Oldest first until under the bound.
                            let rows = try Row.fetchAll(
                                db, sql: "SELECT offset, size FROM record WHERE topic_id = ? AND partition = ? ORDER BY offset",
                                arguments: [topic.id, partition])
                            var below: Int64?
                            for row in rows where bytes > retentionBytes {
                                bytes -= row["size"] as Int64
                                below = (row["offset"] as Int64) + 1
                            }
                            if let below {
                                try db.execute(
                                    sql: "DELETE FROM record WHERE topic_id = ? AND partition = ? AND offset < ?", arguments: [topic.id, partition, below])
                            }
                        }
                        try db.execute(
                            sql: "UPDATE partition_state SET bytes = ? WHERE topic_id = ? AND partition = ?", arguments: [bytes, topic.id, partition])
                    }
                }
            }
        } catch {
            logger.warning("embedded log retention failed; trying again later", metadata: [LogKey.error: "\(error)"])
        }
    }
}

/// The consumers of this process, woken when it appends to one of their topics.
final class ConsumerRegistry: Sendable {
    private let list = Mutex<[EmbeddedConsumer]>([])
    func add(_ consumer: EmbeddedConsumer) { list.withLock { $0.append(consumer) } }
    var all: [EmbeddedConsumer] { list.withLock { $0 } }
}

/// `owner.lock`, held with an exclusive `flock` for as long as the process lives (the kernel drops it when
/// the process ends, also on `kill -9`).
final class OwnerLock: Sendable {
    private let descriptor = Mutex<Int32>(-1)

    init(path: String, directory: String) throws {
        let descriptor = Glibc.open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else {
            throw RecordLogError(code: .configuration, reason: "cannot open \(path): \(String(cString: strerror(errno)))", isRetriable: false)
        }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            close(descriptor)
            throw EmbeddedRecordLog.AlreadyOwned(directory: directory)
        }
        self.descriptor.withLock { $0 = descriptor }
    }

    /// Unlocks and closes the lock file; once.
    func release() {
        descriptor.withLock { descriptor in
            guard descriptor >= 0 else { return }
            flock(descriptor, LOCK_UN)
            close(descriptor)
            descriptor = -1
        }
    }

    deinit {
        release()
    }
}

/// A topic from each partition's start (`ends[].startOffset`) to the end it had when the snapshot was
/// taken, read in batches; with `follow`, on past those ends without end, checking for appends every 200 ms.
struct EmbeddedSnapshot: TopicSnapshot {
    let database: LogDatabase
    let topic: LogDatabase.Topic
    let ends: [PartitionEnd]
    var follow = false

    var expectedCount: Int64 { ends.reduce(0) { $0 + max(0, $1.endOffset - $1.startOffset) } }

    var records: AsyncThrowingStream<ConsumedRecord, any Error> {
        struct Cursor {
            var remaining: ArraySlice<PartitionEnd>
            var buffer: [ConsumedRecord] = []
            var position: Int64
        }
        let database = database
        let topic = topic
        if follow { return followed() }
        let cursor = Mutex(Cursor(remaining: ends[...], position: ends.first?.startOffset ?? 0))
        return AsyncThrowingStream {
            while true {
                if let next = cursor.withLock({ $0.buffer.popLast() }) { return next }
                guard let (current, from) = cursor.withLock({ cursor in cursor.remaining.first.map { ($0, cursor.position) } }) else { return nil }
                let batch = try await database.pool.read { db in
                    try LogDatabase.records(db, topic: topic, partition: current.partition, from: from, below: current.endOffset, limit: 512)
                }
                cursor.withLock { cursor in
                    if let last = batch.last {
                        cursor.buffer = batch.reversed()
                        cursor.position = last.offset + 1
                    } else {
                        cursor.remaining = cursor.remaining.dropFirst()
                        cursor.position = cursor.remaining.first?.startOffset ?? 0
                    }
                }
            }
        }
    }

    /// Every partition in turn from its start position, sleeping when none has anything new.
    private func followed() -> AsyncThrowingStream<ConsumedRecord, any Error> {
        let database = database
        let topic = topic
        let positions = Mutex((positions: Dictionary(uniqueKeysWithValues: ends.map { ($0.partition, $0.startOffset) }), buffer: [ConsumedRecord]()))
        return AsyncThrowingStream {
            while true {
                if let next = positions.withLock({ $0.buffer.popLast() }) { return next }
                let from = positions.withLock { $0.positions }
                let batch = try await database.pool.read { db in
                    var batch: [ConsumedRecord] = []
                    for (partition, position) in from.sorted(by: { $0.key < $1.key }) {
                        batch += try LogDatabase.records(db, topic: topic, partition: partition, from: position, limit: 256)
                    }
                    return batch
                }
                if batch.isEmpty {
                    try await Task.sleep(for: .milliseconds(200))
                    continue
                }
                positions.withLock { state in
                    for record in batch { state.positions[record.partition] = max(state.positions[record.partition] ?? 0, record.offset + 1) }
                    state.buffer = batch.reversed()
                }
            }
        }
    }

    func close() async {}
}
