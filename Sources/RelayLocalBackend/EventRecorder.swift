public import CoreMetrics
public import Logging
public import RelayCore
public import ServiceLifecycle
import GRDB
import Synchronization

/// Records every event of `relay.events` in the events store, and every attempt of the delivery log's topic
/// in the delivery log (consumer group `relay-backend`), with
/// at-least-once semantics: a record is marked done once its row is committed, and recording is
/// idempotent on the event id, so a record read twice is one row.
///
/// Records are written in batches (one transaction and one fsync for whatever arrived while the last
/// batch committed, up to 512), so recording keeps up with the worker without a commit per event. Below
/// a full batch the writer first gathers for `gather` (50 ms): under a steady load every record had a
/// commit of its own otherwise, and the events route is read by people, not by the webhooks' path. A
/// failing write (the disk) is retried with backoff, holding back only the recorder. A record that is
/// not a standardized event is logged, counted and marked done: it can never be recorded.
public final class EventRecorder: Service {
    private let consumer: any RecordConsumer
    private let store: EventStore
    private let logger: Logger
    private let recorded: Counter
    private let invalid: Counter
    private let attemptsRecorded: Counter
    private let attemptsInvalid: Counter
    private let retryBackoff: (initial: Duration, maximum: Duration)
    private let gather: Duration
    /// A batch's most records; at this many pending the writer does not gather.
    static let batchLimit = 512
    /// The delivery log and its topic (`topics.attempts`); nil: the consumer reads events only.
    private let deliveryLog: (log: DeliveryLog, topic: String)?

    public init(
        consumer: any RecordConsumer, store: EventStore, deliveryLog: (log: DeliveryLog, topic: String)? = nil, logger: Logger,
        metrics: any MetricsFactory, retryBackoff: (initial: Duration, maximum: Duration) = (.milliseconds(100), .seconds(30)),
        gather: Duration = .milliseconds(50)
    ) {
        self.consumer = consumer
        self.store = store
        self.deliveryLog = deliveryLog
        self.logger = logger
        self.recorded = Counter(label: "relay_events_recorded_total", dimensions: [], factory: metrics)
        self.invalid = Counter(label: "relay_events_record_invalid_total", dimensions: [], factory: metrics)
        self.attemptsRecorded = Counter(label: "relay_delivery_log_recorded_total", dimensions: [], factory: metrics)
        self.attemptsInvalid = Counter(label: "relay_delivery_log_invalid_total", dimensions: [], factory: metrics)
        self.retryBackoff = retryBackoff
        self.gather = gather
    }

    public func run() async throws {
        let pending = Pending()
        // Rung after each record; the writer takes everything pending at each ring (rings coalesce).
        let (doorbell, ring) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
        await withDiscardingTaskGroup { group in
            group.addTask { [self] in
                for await _ in doorbell {
                    // Not cancelled at a graceful shutdown: the last batch waits out its gather like any other.
                    if gather > .zero, pending.count < Self.batchLimit { try? await Task.sleep(for: gather) }
                    while true {
                        let batch = pending.take(upTo: Self.batchLimit)
                        guard !batch.isEmpty else { break }
                        // Cancelled (shutdown past its bound): what is not recorded stays not done and is read again.
                        guard await write(batch) else { return }
                    }
                }
            }
            for await record in consumer.records.cancelOnGracefulShutdown() {
                pending.append(record)
                ring.yield()
            }
            // Intake stopped: the writer records what is pending, then ends.
            ring.finish()
        }
        await consumer.close()
        logger.info("event recorder stopped")
    }

    /// What the delivery log's part of a batch's transaction recorded.
    private final class AttemptsRecorded: Sendable {
        let result = Mutex<(inserted: Int, invalid: [Int])?>(nil)
    }

    /// Records read and not yet written.
    private final class Pending: Sendable {
        private let records = Mutex<[ConsumedRecord]>([])

        func append(_ record: ConsumedRecord) { records.withLock { $0.append(record) } }

        var count: Int { records.withLock { $0.count } }

        func take(upTo limit: Int) -> [ConsumedRecord] {
            records.withLock { records in
                let batch = Array(records.prefix(limit))
                records.removeFirst(batch.count)
                return batch
            }
        }
    }

    /// Records `all` (events in the events store, attempts in the delivery log, in one transaction of their
    /// database: one commit a batch, which the worker's state writes no longer wait behind, as they did when
    /// both were one file) and marks its records done; false when cancelled before it could.
    private func write(_ all: [ConsumedRecord]) async -> Bool {
        let attemptRecords = deliveryLog.map { log in all.filter { $0.topic == log.topic } } ?? []
        let batch = deliveryLog.map { log in all.filter { $0.topic != log.topic } } ?? all
        let bodies = attemptRecords.map(\.value)
        let logged = AttemptsRecorded()
        var alongside: (@Sendable (Database) throws -> Void)?
        if let log = deliveryLog?.log, !bodies.isEmpty {
            alongside = { db in
                let result = try log.record(bodies, in: db)
                logged.result.withLock { $0 = result }
            }
        }
        if !batch.isEmpty || alongside != nil {
            let entries = batch.map { record in
                EventStore.Entry(
                    app: record.headers.first(named: RelayHeaderName.app)?.stringValue ?? "",
                    body: record.value,
                    historical: record.headers.first(named: RelayHeaderName.historical)?.stringValue == "true")
            }
            guard let result = await persisting("recording events", { try await store.record(entries, alongside: alongside) }) else { return false }
            if let attempts = logged.result.withLock({ $0 }) {
                attemptsRecorded.increment(by: attempts.inserted)
                for index in attempts.invalid {
                    attemptsInvalid.increment()
                    logger.warning("a delivery log record is not an attempt; not recorded", metadata: [LogKey.logOffset: "\(attemptRecords[index].offset)"])
                }
            }
            recorded.increment(by: result.inserted)
            for (index, error) in result.invalid {
                invalid.increment()
                let record = batch[index]
                logger.warning(
                    "a relay.events record is not a standardized event; not recorded",
                    metadata: [
                        LogKey.logTopic: "\(record.topic)", LogKey.logPartition: "\(record.partition)", LogKey.logOffset: "\(record.offset)",
                        LogKey.error: "\(error)",
                    ])
            }
        }
        for record in all { consumer.markDone(record) }
        return true
    }

    /// `body`, tried again with backoff while it fails (the disk); nil when cancelled first.
    private func persisting<Value>(_ what: String, _ body: () async throws -> Value) async -> Value? {
        var backoff = Backoff(initial: retryBackoff.initial, maximum: retryBackoff.maximum)
        while true {
            do {
                return try await body()
            } catch {
                if Task.isCancelled { return nil }
                logger.warning("\(what) failed; retrying", metadata: [LogKey.error: "\(error)"])
                do { try await Task.sleep(for: backoff.next()) } catch { return nil }
            }
        }
    }
}
