public import CoreMetrics
import Foundation
import GRDB
import RelaySQLite
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
///   go; the replay ledger is compacted to the newest record per key. Neither bound removes a record a
///   consumer group of its topic (`retainedFor`) has not processed yet.
/// - **Budget.** A budgeted topic (the notifications) refuses appends with `full` while one of its
///   partitions holds `log.retentionBytes` of records not yet processed (`LogBudget`), so a flood cannot
///   grow the disk without bound nor push out unprocessed work.
public final class EmbeddedRecordLog: RecordLog {
    public let directory: String
    private let database: LogDatabase
    private let topics: [String: LogDatabase.Topic]
    private let appender: EmbeddedAppender
    private let checkpointer: WALCheckpointer?
    private let consumers: ConsumerRegistry
    private let consumerPollInterval: Duration
    private let lock: OwnerLock?
    /// Consumes (holds the directory's lock, or is in memory).
    private let isOwner: Bool
    private let logger: Logger
    private let metrics: any MetricsFactory
    /// The owner's count of unprocessed bytes per topic (nil for tools).
    private let budget: LogBudget?
    /// The consumer groups retention waits for, by topic name.
    private let retainedFor: [String: [String]]
    /// `relay_log_removed_total{topic,reason}`: records retention removed, by age or by size.
    private let removals: LabeledCounters

    /// Why the data directory cannot be owned: another process owns it.
    public struct AlreadyOwned: Error, CustomStringConvertible {
        public var directory: String
        public init(directory: String) { self.directory = directory }
        public var description: String {
            "the embedded log in \(directory) is in use by another revenue-relay process (it holds \(directory)/owner.lock);"
                + " stop it, or give this one another directory (log.path, or dev --data)"
        }
    }

    /// Whether a process owns the log in `directory` now (holds its `owner.lock`).
    public static func isOwned(directory: String) -> Bool {
        let descriptor = Glibc.open(directory + "/owner.lock", O_RDWR | O_CLOEXEC)
        guard descriptor >= 0 else { return false }
        defer { Glibc.close(descriptor) }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else { return true }
        flock(descriptor, LOCK_UN)
        return false
    }

    /// Opens (creating if needed) the log at `log.path` with every topic the configuration uses.
    /// - Parameters:
    ///   - owner: take the directory's lock (a process that consumes); tools pass false.
    ///   - consumerGroups: the groups whose progress retention waits for, with their topics. Default: every
    ///     group of the configuration (`consumerGroups`).
    public static func open(
        configuration: RelayConfiguration, directory: String? = nil, owner: Bool = true,
        consumerGroups: [(group: String, topics: [String])]? = nil, logger: Logger, metrics: any MetricsFactory = MetricsSystem.factory
    ) throws -> EmbeddedRecordLog {
        let topics = configuration.topics
        var retainedFor: [String: [String]] = [:]
        for (group, names) in consumerGroups ?? configuration.consumerGroups {
            for name in names { retainedFor[name, default: []].append(group) }
        }
        return try EmbeddedRecordLog(
            directory: directory ?? configuration.log.path, topics: topics.all(retrySteps: configuration.delivery.retrySchedule.count),
            partitions: configuration.log.partitions, compacted: [topics.replayed], keptByAge: [topics.deadLetter, topics.replayed],
            retainedFor: retainedFor, budgeted: [topics.notifications], retention: configuration.log.retention,
            retentionBytes: configuration.log.retentionBytes, ackTimeout: configuration.ingest.ackTimeout,
            commitInterval: configuration.log.commitInterval, owner: owner, logger: logger, metrics: metrics)
    }

    /// - Parameters:
    ///   - retainedFor: per topic, the consumer groups whose unprocessed records retention keeps.
    ///   - budgeted: topics whose appends are refused (`full`) while a partition holds `retentionBytes` unprocessed.
    ///   - ackTimeout: how long an append waits for its commit before `timedOut` (`ingest.ackTimeout`); nil: no bound.
    ///   - commitInterval: the shortest time from one group commit's start to the next (`log.commitInterval`).
    public convenience init(
        directory: String, topics names: [String], partitions: Int, compacted: Set<String> = [], keptByAge: Set<String> = [],
        retainedFor: [String: [String]] = [:], budgeted: Set<String> = [], retention: Duration = .seconds(7 * 86_400),
        retentionBytes: Int64 = 1 << 30, ackTimeout: Duration? = nil, commitInterval: Duration = CommitPacing.defaultInterval, owner: Bool = true,
        logger: Logger, metrics: any MetricsFactory = MetricsSystem.factory
    ) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let lock = owner ? try OwnerLock(path: directory + "/owner.lock", directory: directory) : nil
        try self.init(
            directory: directory, database: try LogDatabase(path: directory + "/log.sqlite"), lock: lock, owner: owner, topics: names,
            partitions: partitions, compacted: compacted, keptByAge: keptByAge, retainedFor: retainedFor, budgeted: budgeted,
            retention: retention, retentionBytes: retentionBytes, ackTimeout: ackTimeout, commitInterval: commitInterval, logger: logger,
            metrics: metrics)
    }

    /// The log in memory: the embedded log's code and semantics with nothing on disk, for tests of the stages
    /// (no broker, no directory). It lives as long as the instance; its commits are not paced (no fsync to share).
    /// - Parameter consumerPollInterval: how long a consumer sleeps when no append, start or `markDone`
    ///   wakes it (100 ms by default; a test of those wakes sets hours).
    public static func inMemory(
        topics names: [String], partitions: Int, compacted: Set<String> = [], consumerPollInterval: Duration = .milliseconds(100),
        logger: Logger, metrics: any MetricsFactory = MetricsSystem.factory
    ) throws -> EmbeddedRecordLog {
        let name = "relay-log-\(UInt64.random(in: 0...UInt64.max))"
        return try EmbeddedRecordLog(
            directory: ":memory:", database: try LogDatabase(inMemory: name), lock: nil, owner: true, topics: names, partitions: partitions,
            compacted: compacted, keptByAge: [], retainedFor: [:], budgeted: [], retention: .seconds(7 * 86_400), retentionBytes: 1 << 30,
            ackTimeout: nil, commitInterval: .zero, consumerPollInterval: consumerPollInterval, logger: logger, metrics: metrics)
    }

    private init(
        directory: String, database: LogDatabase, lock: OwnerLock?, owner: Bool, topics names: [String], partitions: Int, compacted: Set<String>,
        keptByAge: Set<String>, retainedFor: [String: [String]], budgeted: Set<String>, retention: Duration, retentionBytes: Int64,
        ackTimeout: Duration?, commitInterval: Duration, consumerPollInterval: Duration = EmbeddedConsumer.defaultPollInterval,
        logger: Logger, metrics: any MetricsFactory
    ) throws {
        self.consumerPollInterval = consumerPollInterval
        let topics = try database.ensureTopics(names, partitions: Int32(partitions), compacted: compacted, keptByAge: keptByAge)
        let consumers = ConsumerRegistry()
        let removals = LabeledCounters(label: "relay_log_removed_total", factory: metrics)
        self.removals = removals
        let housekeep: @Sendable () -> Void = {
            EmbeddedRecordLog.housekeep(
                database, retention: retention, retentionBytes: retentionBytes, retainedFor: retainedFor, removals: removals, logger: logger)
        }
        // Only the owner counts: its consumers are the only ones, and only its ingest appends notifications.
        let counted = retainedFor.compactMap { name, groups in
            topics[name].map { LogBudget.Counted(topic: $0, groups: groups, budgeted: budgeted.contains(name)) }
        }
        let budget = owner && !counted.isEmpty ? LogBudget(limit: retentionBytes, counted: counted, logger: logger, metrics: metrics) : nil
        self.budget = budget
        self.retainedFor = retainedFor
        let housekeeping: (interval: Duration, run: @Sendable () -> Void)? = owner ? (.seconds(60), housekeep) : nil
        // The owner checkpoints the WAL beside the appends (tools appending beside it do not need to).
        self.checkpointer = owner && directory != ":memory:" ? try WALCheckpointer(path: database.path, logger: logger) : nil
        self.directory = directory
        self.database = database
        self.topics = topics
        self.lock = lock
        self.isOwner = owner
        self.consumers = consumers
        self.logger = logger
        self.metrics = metrics
        self.appender = EmbeddedAppender(
            database: database, topics: topics, ackTimeout: ackTimeout, commitInterval: commitInterval, logger: logger, metrics: metrics,
            budget: budget, housekeeping: housekeeping,
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
            consumer = try EmbeddedConsumer(
                options: options, database: database, topics: topics, pollInterval: consumerPollInterval, logger: logger, metrics: metrics)
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

    /// Whether appends to `topic` are refused now because its budget of unprocessed records is full.
    public func isFull(_ topic: String) -> Bool {
        budget?.fullTopics.contains(topic) ?? false
    }

    /// The bytes of each partition of `topic` its consumer groups have not processed, as last counted (the
    /// owner counts a budgeted topic 4 times a second, the others every 5 s); empty for a topic no group is
    /// configured for, or in a tool.
    public func unprocessedBytes(of topic: String) -> [Int32: Int64] {
        budget?.unprocessedBytes(of: topic) ?? [:]
    }

    /// Counts the unprocessed records now (tests; the owner's writer does it 4 times a second).
    public func countUnprocessed() {
        budget?.refresh(database)
    }

    /// Whether a commit is synced to disk before it returns (`synchronous = FULL` on the writer connection).
    public func commitsAreSynced() throws -> Bool {
        try database.synchronousLevel() == 2
    }

    /// Closes its consumers (the stages closed theirs already), answers the appends in flight, stops the
    /// writer and, for the owner, releases the data directory.
    public func close() async {
        for consumer in consumers.removeAll() { await consumer.close() }
        await appender.close()
        await checkpointer?.stop()
        lock?.release()
    }

    /// Runs the owner's retention and compaction now (tests; the owner runs them once a minute).
    public func runHousekeeping(retention: Duration, retentionBytes: Int64, now: Int64 = wallClockMilliseconds()) {
        Self.housekeep(
            database, retention: retention, retentionBytes: retentionBytes, retainedFor: retainedFor, removals: removals, now: now, logger: logger)
        budget?.refresh(database)
    }
}

