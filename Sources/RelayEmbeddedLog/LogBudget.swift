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
/// notifications, written by anyone on the internet) the log instead refuses appends to a partition with
/// `full` once it holds `limit` (`log.retentionBytes`) unprocessed bytes, until it is back under 90%
/// (`reopening`); the ingest answers 503 and the stores retry later. Other topics are written by the
/// relay's own stages and are only measured.
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
        /// Partitions of budgeted topics that are full: at the limit, until back under `reopening`.
        var full: Set<Slot> = []
        var lastMeasured: ContinuousClock.Instant?
        /// The last count failed (logged once until one succeeds).
        var failing = false
    }

    static let refreshInterval: Duration = .milliseconds(250)
    /// Topics without a budget are only measured (the gauge): every this often.
    static let measureInterval: Duration = .seconds(5)

    let limit: Int64
    /// A full partition takes appends again under this (90% of the limit), so a worker that processes
    /// about as fast as a flood arrives does not flip the state (and its log lines) four times a second.
    let reopening: Int64
    private let counted: [String: Counted]
    private let byID: [Int64: Counted]
    private let state = Mutex(State())
    private let logger: Logger
    private let gauges: [Slot: Gauge]
    private let fullGauges: [Int64: Gauge]

    init(limit: Int64, counted: [Counted], logger: Logger, metrics: any MetricsFactory) {
        self.limit = limit
        self.reopening = limit / 10 * 9
        self.counted = Dictionary(counted.map { ($0.topic.name, $0) }, uniquingKeysWith: { first, _ in first })
        self.byID = Dictionary(counted.map { ($0.topic.id, $0) }, uniquingKeysWith: { first, _ in first })
        self.logger = logger
        var gauges: [Slot: Gauge] = [:]
        var fullGauges: [Int64: Gauge] = [:]
        for entry in counted {
            for partition in 0..<entry.topic.partitions {
                gauges[Slot(topic: entry.topic.id, partition: partition)] = Gauge(
                    label: "relay_log_unprocessed_bytes", dimensions: [("topic", entry.topic.name), ("partition", String(partition))],
                    factory: metrics)
            }
            if entry.budgeted {
                let gauge = Gauge(label: "relay_log_budget_full", dimensions: [("topic", entry.topic.name)], factory: metrics)
                gauge.record(0)
                fullGauges[entry.topic.id] = gauge
            }
        }
        Gauge(label: "relay_log_budget_bytes", dimensions: [], factory: metrics).record(limit)
        self.gauges = gauges
        self.fullGauges = fullGauges
    }

    /// Whether an append to `partition` of `topic` may go ahead now (nil: any partition, so none may be
    /// full); false for a full partition of a budgeted topic.
    func admits(_ topic: String, partition: @autoclosure () -> Int32?) -> Bool {
        guard let entry = counted[topic], entry.budgeted else { return true }
        let partition = partition()
        return state.withLock { state in
            if let partition { return !state.full.contains(Slot(topic: entry.topic.id, partition: partition)) }
            return !state.full.contains { $0.topic == entry.topic.id }
        }
    }

    /// Budgeted topics with a full partition now.
    var fullTopics: Set<String> {
        let slots = state.withLock { $0.full }
        return Set(slots.compactMap { byID[$0.topic]?.topic.name })
    }

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
        let changes = state.withLock { state in
            for (slot, bytes) in growth where byID[slot.topic] != nil { state.unprocessed[slot, default: 0] += bytes }
            return update(&state, slots: growth.keys)
        }
        report(changes)
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
            let first = state.withLock { state in
                defer { state.failing = true }
                return !state.failing
            }
            if first {
                logger.warning("cannot count the embedded log's unprocessed records; keeping the last count", metadata: [LogKey.error: "\(error)"])
            }
            return
        }
        let changes = state.withLock { state in
            state.failing = false
            state.unprocessed.merge(counts) { _, new in new }
            if measure { state.lastMeasured = now }
            return update(&state, slots: counts.keys)
        }
        for (slot, bytes) in counts { gauges[slot]?.record(bytes) }
        report(changes)
    }

    private struct Change {
        var slot: Slot
        var full: Bool
        var bytes: Int64
    }

    /// Marks the budgeted `slots` full at the limit and open again under `reopening`.
    private func update(_ state: inout State, slots: some Sequence<Slot>) -> [Change] {
        var changes: [Change] = []
        for slot in slots {
            guard byID[slot.topic]?.budgeted == true else { continue }
            let bytes = state.unprocessed[slot] ?? 0
            if bytes >= limit, state.full.insert(slot).inserted {
                changes.append(Change(slot: slot, full: true, bytes: bytes))
            } else if bytes < reopening, state.full.remove(slot) != nil {
                changes.append(Change(slot: slot, full: false, bytes: bytes))
            }
        }
        for change in changes {
            fullGauges[change.slot.topic]?.record(state.full.contains { $0.topic == change.slot.topic } ? 1 : 0)
        }
        return changes
    }

    private func report(_ changes: [Change]) {
        for change in changes {
            guard let entry = byID[change.slot.topic] else { continue }
            let groups = entry.groups.joined(separator: ", ")
            let metadata: Logger.Metadata = [
                "topic": "\(entry.topic.name)", "partition": "\(change.slot.partition)", "unprocessed_bytes": "\(change.bytes)",
                "budget_bytes": "\(limit)", "groups": "\(groups)",
            ]
            if change.full {
                logger.error(
                    "the embedded log's budget for unprocessed records is full (log.retentionBytes per partition): notifications of this partition get 503 until its consumers (\(groups)) have processed a tenth of it",
                    metadata: metadata)
            } else {
                logger.notice("the embedded log's budget for unprocessed records has room again: notifications of this partition are accepted", metadata: metadata)
            }
        }
    }
}
