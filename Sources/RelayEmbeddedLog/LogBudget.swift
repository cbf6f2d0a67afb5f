import CoreMetrics
import GRDB
import Logging
import RelayCore
import Synchronization

/// How many bytes of a topic's records its consumer groups have not processed yet, per partition, and
/// whether appends to it must wait: the embedded log's disk budget for unprocessed work.
///
/// Retention never removes a record some group of its topic has not processed, so a flood of appends
/// while the consumers are stopped or behind would grow the log without bound. For a budgeted topic (the
/// notifications, written by anyone on the internet) the log instead refuses new appends with `full`
/// while one of its partitions holds `limit` (`log.retentionBytes`) unprocessed bytes; the ingest
/// answers 503 and the stores retry later. Other topics are written by the relay's own stages and are
/// only measured.
///
/// The count is exact at each `refresh` (a few indexed lookups per partition, on the log's writer thread
/// at most every `refreshInterval`) and grows with every append between refreshes, so a burst cannot
/// overshoot the budget by more than the appends already queued.
final class LogBudget: Sendable {
    /// A topic whose unprocessed bytes are counted: the groups that must process it.
    struct Counted: Sendable {
        var topic: LogDatabase.Topic
        var groups: [String]
        var budgeted: Bool
    }

    struct Slot: Hashable, Sendable {
        var topic: Int64
        var partition: Int32
    }

    private struct State {
        var unprocessed: [Slot: Int64] = [:]
        /// Budgeted topics (by name) with a partition at or over the limit.
        var full: Set<String> = []
        var lastMeasured: ContinuousClock.Instant?
    }

    static let refreshInterval: Duration = .milliseconds(250)
    /// Topics without a budget are only measured (the gauge): every this often.
    static let measureInterval: Duration = .seconds(5)

    let limit: Int64
    private let counted: [String: Counted]
    private let byID: [Int64: Counted]
    private let state = Mutex(State())
    private let logger: Logger
    private let gauges: [Slot: Gauge]

    init(limit: Int64, counted: [Counted], logger: Logger, metrics: any MetricsFactory) {
        self.limit = limit
        self.counted = Dictionary(counted.map { ($0.topic.name, $0) }, uniquingKeysWith: { first, _ in first })
        self.byID = Dictionary(counted.map { ($0.topic.id, $0) }, uniquingKeysWith: { first, _ in first })
        self.logger = logger
        var gauges: [Slot: Gauge] = [:]
        for entry in counted {
            for partition in 0..<entry.topic.partitions {
                gauges[Slot(topic: entry.topic.id, partition: partition)] = Gauge(
                    label: "relay_log_unprocessed_bytes", dimensions: [("topic", entry.topic.name), ("partition", String(partition))],
                    factory: metrics)
            }
        }
        self.gauges = gauges
    }

    /// Whether an append to `topic` may go ahead now (false: a budgeted topic that is full).
    func admits(_ topic: String) -> Bool {
        state.withLock { !$0.full.contains(topic) }
    }

    /// Budgeted topics that are full now.
    var fullTopics: Set<String> { state.withLock { $0.full } }

    /// The unprocessed bytes of each partition of `topic` as last counted.
    func unprocessedBytes(of topic: String) -> [Int32: Int64] {
        guard let entry = counted[topic] else { return [:] }
        return state.withLock { state in
            var result: [Int32: Int64] = [:]
            for partition in 0..<entry.topic.partitions {
                result[partition] = state.unprocessed[Slot(topic: entry.topic.id, partition: partition)] ?? 0
            }
            return result
        }
    }

    /// Counts a commit's appends (bytes per partition) until the next refresh.
    func appended(_ growth: [Slot: Int64]) {
        var changed: [(String, Bool, Slot, Int64)] = []
        state.withLock { state in
            for (slot, bytes) in growth {
                guard let entry = byID[slot.topic] else { continue }
                let total = state.unprocessed[slot, default: 0] + bytes
                state.unprocessed[slot] = total
                if entry.budgeted, total >= limit, state.full.insert(entry.topic.name).inserted {
                    changed.append((entry.topic.name, true, slot, total))
                }
            }
        }
        report(changed)
    }

    /// Counts the budgeted topics' unprocessed bytes anew from the database, and the other topics' too when
    /// `measureInterval` has passed since they were last (or with `everything`).
    func refresh(_ database: LogDatabase, everything: Bool = true) {
        let now = ContinuousClock.now
        let measure = everything || state.withLock { state in state.lastMeasured.map { now - $0 >= Self.measureInterval } ?? true }
        let entries = counted.values.filter { measure || $0.budgeted }
        var counts: [Slot: Int64] = [:]
        do {
            try database.pool.read { db in
                for entry in entries {
                    for partition in 0..<entry.topic.partitions {
                        let floor = try LogDatabase.processedFloor(db, topic: entry.topic.id, partition: partition, groups: entry.groups) ?? .max
                        counts[Slot(topic: entry.topic.id, partition: partition)] =
                            floor == .max ? 0 : try LogDatabase.bytes(db, topic: entry.topic.id, partition: partition, from: floor)
                    }
                }
            }
        } catch {
            logger.warning("cannot count the embedded log's unprocessed records; keeping the last count", metadata: [LogKey.error: "\(error)"])
            return
        }
        var changed: [(String, Bool, Slot, Int64)] = []
        state.withLock { state in
            state.unprocessed.merge(counts) { _, new in new }
            if measure { state.lastMeasured = now }
            for entry in counted.values where entry.budgeted {
                let fullest = counts.filter { $0.key.topic == entry.topic.id }.max { $0.value < $1.value }
                let isFull = (fullest?.value ?? 0) >= limit
                if isFull, state.full.insert(entry.topic.name).inserted, let fullest {
                    changed.append((entry.topic.name, true, fullest.key, fullest.value))
                } else if !isFull, state.full.remove(entry.topic.name) != nil {
                    changed.append((entry.topic.name, false, fullest?.key ?? Slot(topic: entry.topic.id, partition: 0), fullest?.value ?? 0))
                }
            }
        }
        for (slot, bytes) in counts { gauges[slot]?.record(bytes) }
        report(changed)
    }

    private func report(_ changes: [(topic: String, full: Bool, slot: Slot, bytes: Int64)]) {
        for change in changes {
            let groups = counted[change.topic]?.groups.joined(separator: ", ") ?? ""
            let metadata: Logger.Metadata = [
                "topic": "\(change.topic)", "partition": "\(change.slot.partition)", "unprocessed_bytes": "\(change.bytes)",
                "budget_bytes": "\(limit)", "groups": "\(groups)",
            ]
            if change.full {
                logger.error(
                    "the embedded log's budget for unprocessed records is full (log.retentionBytes per partition): new notifications get 503 until its consumers (\(groups)) have processed more",
                    metadata: metadata)
            } else {
                logger.notice("the embedded log's budget for unprocessed records has room again: notifications are accepted", metadata: metadata)
            }
        }
    }
}
