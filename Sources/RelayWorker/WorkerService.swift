public import CoreMetrics
public import Logging
public import RelayCore
public import ServiceLifecycle
import DequeModule
import Synchronization

/// Consumes raw notifications (`relay.notifications`, group `relay-worker`) and runs the handler
/// on each, with at-least-once semantics:
///
/// - Records run concurrently by subscription: each record key (`{store}:{subject}`) is a lane whose
///   records are processed one at a time, in log order, so one subscription's notifications never race;
///   records of different keys proceed in parallel, within a partition too. Records without a key share
///   one lane per partition. How many records are handed out and not yet done is bounded by the
///   consumer (`ConsumerOptions.maxInFlight`), which stops reading when the bound is reached.
/// - A record is marked done only after the handler returned; the consumer stores offsets in order
///   as records finish out of order. A failing handler is retried with backoff, never skipped, and
///   holds back only its own lane.
/// - Graceful shutdown: stop taking new records, finish the ones already handed out, then close the
///   consumer (store, commit, leave the group).
public final class WorkerService: Service {
    private let consumer: any RecordConsumer
    private let handler: any WorkerRecordHandler
    private let logger: Logger
    private let retries: Counter
    /// Backoff between attempts of a failing record. Default: 100 ms doubling to 30 s.
    private let retryBackoff: (initial: Duration, maximum: Duration)
    /// The age of the oldest record handed out and not finished: how far behind the worker is in time.
    private let ages: InFlightAges

    public init(
        consumer: any RecordConsumer, handler: any WorkerRecordHandler, logger: Logger, metrics: any MetricsFactory,
        retryBackoff: (initial: Duration, maximum: Duration) = (.milliseconds(100), .seconds(30))
    ) {
        self.consumer = consumer
        self.handler = handler
        self.logger = logger
        self.retries = Counter(label: "relay_worker_retries_total", dimensions: [], factory: metrics)
        self.retryBackoff = retryBackoff
        self.ages = InFlightAges(gauge: Gauge(label: "relay_worker_oldest_record_age_seconds", dimensions: [], factory: metrics))
    }

    public func run() async throws {
        let lanes = Lanes()
        // Discarding: a finished lane's task is freed at once (a plain task group keeps every finished
        // child until it is awaited, which grew the heap by each record's task under a steady stream).
        await withDiscardingTaskGroup { group in
            for await record in consumer.records.cancelOnGracefulShutdown() {
                let key = LaneKey(record)
                ages.started(record)
                // A busy lane takes the record after the ones it has; an idle one starts a task with it.
                guard lanes.enqueueOrStart(record, key: key) else { continue }
                group.addTask { [self] in
                    var next: ConsumedRecord? = record
                    while let current = next {
                        await handle(current)
                        // Cancelled (shutdown past its bound): the record may not be done, so nothing behind it
                        // in its lane may run either; all of them are redelivered in order.
                        if Task.isCancelled { return }
                        next = lanes.next(after: key)
                    }
                }
            }
            // Intake stopped (shutdown or the consumer closed): the group ends once every lane finished what it has.
        }
        await consumer.close()
        logger.info("worker stopped")
    }

    /// The records waiting behind the running one, per key. A key is present while its lane runs.
    private final class Lanes: Sendable {
        private let waiting = Mutex<[LaneKey: Deque<ConsumedRecord>]>([:])

        /// Queues `record` behind its lane's running record, or (true) opens the lane for it to run now.
        func enqueueOrStart(_ record: ConsumedRecord, key: LaneKey) -> Bool {
            waiting.withLock { lanes in
                if lanes[key] != nil {
                    lanes[key]!.append(record)
                    return false
                }
                lanes[key] = []
                return true
            }
        }

        /// The lane's next record, or nil after closing the lane (nothing waits).
        func next(after key: LaneKey) -> ConsumedRecord? {
            waiting.withLock { lanes in
                guard let record = lanes[key]?.popFirst() else {
                    lanes[key] = nil
                    return nil
                }
                return record
            }
        }
    }

    /// One subscription's records: same topic, partition and key (records without a key: one lane per partition).
    private struct LaneKey: Hashable, Sendable {
        var topic: String
        var partition: Int32
        var key: [UInt8]?

        init(_ record: ConsumedRecord) {
            topic = record.topic
            partition = record.partition
            key = record.key
        }
    }

    private func handle(_ record: ConsumedRecord) async {
        defer { ages.finished(record) }
        var backoff = Backoff(initial: retryBackoff.initial, maximum: retryBackoff.maximum)
        var attempt = 1
        while true {
            // Records read before a rebalance took the partition away belong to its new owner now.
            guard consumer.isAssigned(record) else { return }
            do {
                try await handler.process(record)
                consumer.markDone(record)
                return
            } catch {
                // On cancellation (shutdown past its bound) the record stays not done: it is redelivered.
                if Task.isCancelled { return }
                retries.increment()
                ages.report()
                logger.warning(
                    "processing failed; retrying",
                    metadata: [
                        LogKey.logTopic: "\(record.topic)", LogKey.logPartition: "\(record.partition)",
                        LogKey.logOffset: "\(record.offset)", LogKey.error: "\(error)", "attempt": "\(attempt)",
                    ])
                do { try await Task.sleep(for: backoff.next()) } catch { return }
                attempt += 1
            }
        }
    }
}

/// When each record handed to the worker and not finished was appended, reported as the age of the
/// oldest (`relay_worker_oldest_record_age_seconds`, at most once a second, 0 when none is in flight). On
/// either log, this is how far behind the worker is in time: compared with the notifications topic's
/// retention, it says how close unprocessed notifications are to being removed (Kafka's `retention.ms`).
final class InFlightAges: Sendable {
    private struct Position: Hashable {
        var topic: String
        var partition: Int32
        var offset: Int64
    }

    private struct State {
        var appendedAt: [Position: Int64] = [:]
        var lastReport: ContinuousClock.Instant?
    }

    private let state = Mutex(State())
    private let gauge: Gauge

    init(gauge: Gauge) {
        self.gauge = gauge
    }

    func started(_ record: ConsumedRecord) {
        guard let timestamp = record.timestampMilliseconds else { return }
        state.withLock { $0.appendedAt[Position(topic: record.topic, partition: record.partition, offset: record.offset)] = timestamp }
        report(force: false)
    }

    func finished(_ record: ConsumedRecord) {
        let empty = state.withLock { state in
            state.appendedAt[Position(topic: record.topic, partition: record.partition, offset: record.offset)] = nil
            return state.appendedAt.isEmpty
        }
        if empty { gauge.record(0) } else { report(force: false) }
    }

    /// Reports now (a record is being retried: nothing else may move the gauge meanwhile).
    func report() { report(force: true) }

    private func report(force: Bool) {
        let now = ContinuousClock.now
        let oldest = state.withLock { state -> Int64?? in
            if !force, let last = state.lastReport, now - last < .seconds(1) { return .none }
            state.lastReport = now
            return .some(state.appendedAt.values.min())
        }
        guard case .some(let value) = oldest else { return }
        guard let value else { return gauge.record(0) }
        gauge.record(Double(max(0, wallClockMilliseconds() - value)) / 1000)
    }
}
