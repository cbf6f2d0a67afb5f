import CoreMetrics
import Dispatch
import Foundation
import GRDB
import RelaySQLite
import Logging
import RelayCore
import Synchronization

/// Appends records to the embedded log, group-committed: every append waiting when the writer thread gets
/// to it goes into one transaction, and each caller is answered once that transaction is on disk. Many
/// concurrent callers therefore share one fsync instead of paying one each.
///
/// A record's partition is its key's hash (FNV-1a) modulo the topic's partitions, so one key always goes to
/// one partition, in order; a record without a key goes round-robin. Offsets are assigned inside the write
/// transaction from the partition's stored end, so appends from another process (a `replay`) interleave
/// correctly.
final class EmbeddedAppender: RecordProducer, Sendable {
    /// The largest record (key, value and headers) accepted.
    static let maximumRecordBytes = 8 * 1024 * 1024
    /// At most this many records, or bytes, per transaction.
    static let batchRecords = 2048
    static let batchBytes = 32 * 1024 * 1024

    private struct Pending {
        var record: OutgoingRecord
        var size: Int
        var waiter: AckWaiter
        var deadline: ContinuousClock.Instant?
        /// The `produce` call it came with: one call's records are committed in one transaction.
        var call: UInt64
    }

    /// A caller waiting for its acknowledgement, answered once: by the writer, or by its time bound.
    final class AckWaiter: Sendable {
        private let completion = Mutex<(@Sendable (Result<RecordPosition, any Error>) -> Void)?>(nil)
        init(_ completion: @escaping @Sendable (Result<RecordPosition, any Error>) -> Void) { self.completion.withLock { $0 = completion } }
        func resume(with result: Result<RecordPosition, any Error>) {
            completion.withLock { completion in
                defer { completion = nil }
                return completion
            }?(result)
        }
    }

    private struct State {
        var pending: [Pending] = []
        var closed = false
        var roundRobin: [String: UInt32] = [:]
        var nextCall: UInt64 = 0
    }

    private let database: LogDatabase
    private let topics: Mutex<[String: LogDatabase.Topic]>
    private let state = Mutex(State())
    private let wake = DispatchSemaphore(value: 0)
    /// Signalled by `close`: ends a commit's pacing wait at once.
    private let closing = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)
    /// Called after each commit with the topics it appended to (consumers of this process wake up).
    private let onAppend: @Sendable (Set<String>) -> Void
    /// The owner's housekeeping (retention, compaction), run between batches at most every `interval`.
    private let housekeeping: (interval: Duration, run: @Sendable () -> Void)?
    private let logger: Logger
    private let appended: Counter
    /// `relay_log_commits_total`: transactions of appends (appended / commits: records per commit).
    private let commits: Counter
    /// How long a caller waits for its acknowledgement before it is told `timedOut` (the record may still be
    /// committed: a retry is then a duplicate, which the stages recognize by its ids). Nil: no bound.
    private let ackTimeout: Duration?
    /// The owner's count of unprocessed bytes: appends to a full budgeted topic are refused (`full`).
    private let budget: LogBudget?
    /// The shortest time from one commit's start to the next (`log.commitInterval`): see `CommitPacing`.
    private let pacing: CommitPacing

    init(
        database: LogDatabase, topics: [String: LogDatabase.Topic], ackTimeout: Duration?, commitInterval: Duration,
        logger: Logger, metrics: any MetricsFactory, budget: LogBudget? = nil, housekeeping: (interval: Duration, run: @Sendable () -> Void)?,
        onAppend: @escaping @Sendable (Set<String>) -> Void
    ) {
        self.pacing = CommitPacing(interval: commitInterval)
        self.ackTimeout = ackTimeout
        self.budget = budget
        self.database = database
        self.topics = Mutex(topics)
        self.logger = logger
        self.housekeeping = housekeeping
        self.onAppend = onAppend
        self.appended = Counter(label: "relay_log_appended_total", dimensions: [], factory: metrics)
        self.commits = Counter(label: "relay_log_commits_total", dimensions: [], factory: metrics)
        startDedicatedThread(named: "log-writer") { [self] in runWriter() }
        if ackTimeout != nil { startDedicatedThread(named: "log-ack-timer") { [self] in runExpiry() } }
    }

    func produce(_ record: OutgoingRecord) async throws(RecordLogError) -> RecordPosition {
        try await produce([record])[0]
    }

    /// Queues every record in order for the writer's next group commit and waits for all of them.
    func produce(_ records: [OutgoingRecord]) async throws(RecordLogError) -> [RecordPosition] {
        guard !records.isEmpty else { return [] }
        var sizes: [Int] = []
        sizes.reserveCapacity(records.count)
        for record in records {
            let size = (record.key?.count ?? 0) + record.value.count + record.headers.reduce(0) { $0 + $1.name.utf8.count + $1.value.count }
            guard size <= Self.maximumRecordBytes else {
                throw RecordLogError(
                    code: .recordTooLarge, reason: "a record of \(size) bytes is larger than the embedded log's \(Self.maximumRecordBytes)",
                    isRetriable: false)
            }
            sizes.append(size)
            if let budget, !budget.admits(record.topic, partition: keyedPartition(record)) {
                throw RecordLogError(
                    code: .full,
                    reason: "the embedded log holds log.retentionBytes (\(budget.limit) bytes) of \(record.topic) not yet processed in this record's"
                        + " partition; it takes more once its consumers catch up", isRetriable: true)
            }
        }
        do {
            return try await withCheckedThrowingContinuation { continuation in
                let batch = AcknowledgementBatch(count: records.count, continuation: continuation)
                let waiters = records.indices.map { index in AckWaiter { batch.complete(index, $0) } }
                let deadline = ackTimeout.map { ContinuousClock.now + $0 }
                let accepted = state.withLock { state -> Bool in
                    guard !state.closed else { return false }
                    state.nextCall += 1
                    for index in records.indices {
                        state.pending.append(
                            Pending(record: records[index], size: sizes[index], waiter: waiters[index], deadline: deadline, call: state.nextCall))
                    }
                    return true
                }
                guard accepted else {
                    for waiter in waiters {
                        waiter.resume(with: .failure(RecordLogError(code: .closed, reason: "the embedded log is closed", isRetriable: false)))
                    }
                    return
                }
                wake.signal()
            }
        } catch let error as RecordLogError {
            throw error
        } catch {
            throw RecordLogError(code: .other, reason: "\(error)", isRetriable: true)
        }
    }

    /// Answers what is waiting, then stops the writer.
    func close() async {
        let first = state.withLock { state -> Bool in
            defer { state.closed = true }
            return !state.closed
        }
        guard first else { return }
        closing.signal()
        wake.signal()
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            startDedicatedThread(named: "log-close") { [self] in
                finished.wait()
                finished.signal()
                continuation.resume()
            }
        }
    }

    /// Tells callers still waiting in the queue past their deadline `timedOut`, every 100 ms (a record being
    /// written when its deadline passes is answered by the write).
    private func runExpiry() {
        while true {
            Thread.sleep(forTimeInterval: 0.1)
            let now = ContinuousClock.now
            let (expired, closed) = state.withLock { state -> ([Pending], Bool) in
                let expired = state.pending.filter { ($0.deadline ?? now) < now }
                if !expired.isEmpty { state.pending.removeAll { ($0.deadline ?? now) < now } }
                return (expired, state.closed && state.pending.isEmpty)
            }
            for item in expired {
                item.waiter.resume(
                    with: .failure(RecordLogError(code: .timedOut, reason: "the embedded log did not commit the record in time", isRetriable: true)))
            }
            if closed { return }
        }
    }

    private func runWriter() {
        var lastHousekeeping = ContinuousClock.now
        var lastCount = ContinuousClock.now - LogBudget.refreshInterval
        budget?.refresh(database)
        var lastCommit: ContinuousClock.Instant?
        var boundHit = false
        while true {
            _ = wake.wait(timeout: .now() + .milliseconds(500))
            // Appends that come sooner than the interval after the last commit started wait for the rest of it,
            // with those that come meanwhile. Not when the last batch left records behind (a bound was hit) or a
            // batch's worth waits, nor on a wake with nothing waiting (one the last batch's appends left).
            if !boundHit, let wait = pacing.wait(after: lastCommit),
                state.withLock({ !$0.closed && !$0.pending.isEmpty && $0.pending.count < Self.batchRecords })
            {
                // `close` ends the wait; signalled again, so that a later one ends at once too.
                if closing.wait(timeout: .now() + .nanoseconds(Int(wait.wholeNanoseconds))) == .success { closing.signal() }
            }
            let (batch, closed, leftBehind) = state.withLock { state -> ([Pending], Bool, Bool) in
                var taken = 0
                var bytes = 0
                while taken < state.pending.count, taken < Self.batchRecords, bytes < Self.batchBytes {
                    bytes += state.pending[taken].size
                    taken += 1
                }
                // Never split one call's records over two transactions: if the first failed and the second
                // committed, a key's later records would be in the log without its earlier ones.
                while taken > 0, taken < state.pending.count, state.pending[taken].call == state.pending[taken - 1].call {
                    taken += 1
                }
                let batch = Array(state.pending.prefix(taken))
                state.pending.removeFirst(taken)
                return (batch, state.closed && state.pending.isEmpty, !state.pending.isEmpty)
            }
            boundHit = leftBehind
            if !batch.isEmpty {
                lastCommit = .now
                write(batch)
                // More may be waiting: go round again (at once when a batch bound left it, else paced).
                if state.withLock({ !$0.pending.isEmpty }) { wake.signal() }
            }
            if let housekeeping, ContinuousClock.now - lastHousekeeping >= housekeeping.interval {
                lastHousekeeping = .now
                housekeeping.run()
            }
            // Consumers store their offsets on their own: count what they processed at most 4 times a second.
            if let budget, ContinuousClock.now - lastCount >= LogBudget.refreshInterval {
                lastCount = .now
                budget.refresh(database, everything: false)
            }
            if closed {
                finished.signal()
                return
            }
        }
    }

    private func write(_ batch: [Pending]) {
        var known = topics.withLock { $0 }
        if batch.contains(where: { known[$0.record.topic] == nil }) {
            // A topic created since (by another process, or a configuration with more retry steps).
            known = (try? database.topics()) ?? known
            topics.withLock { $0 = known }
        }
        var results: [Result<RecordPosition, RecordLogError>] = []
        var touched = Set<String>()
        var grown: [LogBudget.Slot: Int64] = [:]
        do {
            try database.pool.write { db in
                results = []
                var ends: [String: (next: Int64, appended: Int64)] = [:]  // "<topic id>:<partition>" -> next offset, bytes appended
                var growth: [String: (topic: Int64, partition: Int32, bytes: Int)] = [:]
                let now = wallClockMilliseconds()
                // Cached statements: preparing the SQL anew for each record was a sixth of the pipeline's CPU. Run
                // with SQLite's C calls (DirectWrite): GRDB's arguments cost about 2 µs a record.
                let insert = DirectWrite(
                    try db.cachedStatement(
                        sql: """
                            INSERT INTO record (topic_id, partition, offset, timestamp, key, value, headers, size, end_bytes)
                            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                            """))
                for item in batch {
                    let record = item.record
                    guard let topic = known[record.topic] else {
                        results.append(.failure(RecordLogError(
                            code: .configuration, reason: "the embedded log has no topic \(record.topic)", isRetriable: false)))
                        continue
                    }
                    if let chosen = record.partition, !(0..<topic.partitions).contains(chosen) {
                        results.append(.failure(RecordLogError(
                            code: .configuration, reason: "\(record.topic) has no partition \(chosen)", isRetriable: false)))
                        continue
                    }
                    let partition = record.partition ?? self.partition(for: record.key, topic: topic)
                    let slot = "\(topic.id):\(partition)"
                    var end: (next: Int64, appended: Int64)
                    if let known = ends[slot] {
                        end = known
                    } else {
                        let row = try Row.fetchOne(
                            db.cachedStatement(sql: "SELECT next_offset, appended_bytes FROM partition_state WHERE topic_id = ? AND partition = ?"),
                            arguments: [topic.id, partition])
                        end = (row?[0] ?? 0, row?[1] ?? 0)
                    }
                    end.appended += Int64(item.size)
                    try insert.execute { parameters in
                        parameters.int64(topic.id)
                        parameters.int64(Int64(partition))
                        parameters.int64(end.next)
                        parameters.int64(now)
                        parameters.blob(record.key)
                        parameters.blob(record.value)
                        parameters.blob(HeaderCoding.encode(record.headers))
                        parameters.int64(Int64(item.size))
                        parameters.int64(end.appended)
                    }
                    results.append(.success(RecordPosition(topic: record.topic, partition: partition, offset: end.next)))
                    end.next += 1
                    ends[slot] = end
                    growth[slot, default: (topic.id, partition, 0)].bytes += item.size
                    touched.insert(record.topic)
                }
                grown = [:]
                for (slot, added) in growth {
                    grown[LogBudget.Slot(topic: added.topic, partition: added.partition), default: 0] += Int64(added.bytes)
                    try db.cachedStatement(
                        sql: "UPDATE partition_state SET next_offset = ?, appended_bytes = ?, bytes = bytes + ? WHERE topic_id = ? AND partition = ?"
                    ).execute(arguments: [ends[slot]!.next, ends[slot]!.appended, added.bytes, added.topic, added.partition])
                }
            }
        } catch {
            logger.error("embedded log append failed", metadata: [LogKey.error: "\(error)"])
            let failure = RecordLogError(code: .other, reason: "the embedded log could not write: \(error)", isRetriable: true)
            for item in batch { item.waiter.resume(with: .failure(failure)) }
            return
        }
        // Counted before anyone is answered: an append that follows an acknowledgement sees the budget it used,
        // and the counters already hold this commit.
        if let budget, !grown.isEmpty { budget.appended(grown) }
        commits.increment()
        appended.increment(by: results.count)
        for (item, result) in zip(batch, results) { item.waiter.resume(with: result.mapError { $0 as any Error }) }
        if !touched.isEmpty { onAppend(touched) }
    }

    /// The partition a keyed record goes to (nil without a key: round-robin, decided by the writer).
    private func keyedPartition(_ record: OutgoingRecord) -> Int32? {
        if let partition = record.partition { return partition }
        guard let key = record.key, let topic = topics.withLock({ $0[record.topic] }) else { return nil }
        return Self.partition(ofKey: key, partitions: topic.partitions)
    }

    private static func partition(ofKey key: [UInt8], partitions: Int32) -> Int32 {
        Int32(Int(fnv1a(key)) % Int(partitions))
    }

    private func partition(for key: [UInt8]?, topic: LogDatabase.Topic) -> Int32 {
        guard let key else {
            return state.withLock { state in
                let next = state.roundRobin[topic.name, default: 0]
                state.roundRobin[topic.name] = next &+ 1
                return Int32(next % UInt32(topic.partitions))
            }
        }
        return Self.partition(ofKey: key, partitions: topic.partitions)
    }

    /// FNV-1a, 32 bits: stable across processes and versions (a key must keep its partition).
    static func fnv1a(_ bytes: [UInt8]) -> UInt32 {
        var hash: UInt32 = 2_166_136_261
        for byte in bytes {
            hash ^= UInt32(byte)
            hash = hash &* 16_777_619
        }
        return hash
    }
}
