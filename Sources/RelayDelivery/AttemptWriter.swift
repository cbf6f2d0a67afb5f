import CoreMetrics
import DequeModule
import Logging
import RelayCore
import Synchronization

/// Writes the delivery log's records (`DeliveryAttempt`) in batches, apart from the deliveries: a success's
/// record as the attempt finishes, a failure's once its retry or dead-letter record is written. They go to
/// the log's topic (`topics.attempts`), which the backend's recorder reads, or, when the delivery log is in
/// this process (`direct`), to it, one transaction a batch. No delivery waits for them or depends on them: a
/// record costs no produce of its own, and the topic or the delivery log failing (missing on Kafka, refused,
/// the disk) loses log records, never deliveries.
///
/// What is lost, and counted in `relay_delivery_log_dropped_total`: the batch being gathered when the
/// process crashes (milliseconds; up to `directGather` more for the delivery log in this process); the
/// oldest of more than `capacity` waiting while they cannot be written; a batch the log refuses for good (too
/// large, not authorized); and, at shutdown, what could not be written within the deliverer's bound.
final class AttemptWriter: Sendable {
    static let capacity = 100_000
    static let batch = 1_000
    /// How long records for the delivery log in this process gather before a batch below `batch` is written.
    static let directGather = Duration.milliseconds(20)

    /// What is queued: the values, serialized when their batch is written to the topic (on the writer's task,
    /// not on the HTTP engine's thread where attempts finish), handed over as they are to a delivery log in
    /// this process.
    private struct State {
        var pending = Deque<DeliveryLogEntry>()
        var finished = false
        var done = false
    }

    private let producer: any RecordProducer
    /// The delivery log's topic (`topics.attempts`).
    private let topic: String
    /// The delivery log in this process, written instead of the topic.
    private let direct: (any DeliveryLogRecorder)?
    private let logger: Logger
    private let state = Mutex(State())
    private let doorbell: AsyncStream<Void>
    private let ring: AsyncStream<Void>.Continuation
    private let dropped: Counter

    init(producer: any RecordProducer, topic: String, direct: (any DeliveryLogRecorder)? = nil, logger: Logger, metrics: any MetricsFactory) {
        self.producer = producer
        self.topic = topic
        self.direct = direct
        self.logger = logger
        (doorbell, ring) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        dropped = Counter(label: "relay_delivery_log_dropped_total", dimensions: [], factory: metrics)
    }

    /// Queues an attempt's or an endpoint's record for the next batch (never blocks; constant time).
    func append(_ entry: DeliveryLogEntry) {
        let overflow = state.withLock { state -> Int in
            guard !state.finished else { return 1 }
            state.pending.append(entry)
            guard state.pending.count > Self.capacity else { return 0 }
            state.pending.removeFirst()
            return 1
        }
        if overflow > 0 { dropped.increment(by: overflow) }
        ring.yield()
    }

    /// Writes batches until `finish`, then what is left once (what fails then is dropped and counted).
    func run() async {
        var backoff = Backoff(initial: .milliseconds(100), maximum: .seconds(10))
        for await _ in doorbell {
            // Each batch is a commit of the delivery log's database when it is in this process: below a full
            // batch, gather first, or a steady rate makes a commit (and an fsync) of every attempt or two. The
            // topic needs none: its appends share the log writer's commits, and its reader gathers.
            if direct != nil, state.withLock({ !$0.finished && $0.pending.count < Self.batch }) {
                try? await Task.sleep(for: Self.directGather)
            }
            while let batch = take() {
                guard let (error, retriable) = await write(batch) else {
                    backoff = Backoff(initial: .milliseconds(100), maximum: .seconds(10))
                    continue
                }
                if !retriable || Task.isCancelled {
                    // Refused for good (too large, not authorized, the topic missing on a broker that will not
                    // create it, a read-only database): dropped, so the next records are not held behind it.
                    dropped.increment(by: batch.count)
                    logger.warning(
                        "the delivery log's records were refused; dropped (the deliveries are not affected)",
                        metadata: [LogKey.error: "\(error)", "records": "\(batch.count)"])
                    continue
                }
                // Back to the front, in order; tried again after a wait.
                let excess = state.withLock { state -> Int in
                    for record in batch.reversed() { state.pending.prepend(record) }
                    let excess = state.pending.count - Self.capacity
                    if excess > 0 { state.pending.removeFirst(excess) }
                    return max(0, excess)
                }
                if excess > 0 { dropped.increment(by: excess) }
                logger.warning("could not write the delivery log's records; retrying", metadata: [LogKey.error: "\(error)"])
                do { try await Task.sleep(for: backoff.next()) } catch { break }
            }
        }
        let left = state.withLock { state -> Int in
            state.done = true
            defer { state.pending.removeAll() }
            return state.pending.count
        }
        if left > 0 { dropped.increment(by: left) }
    }

    /// Writes one batch to the delivery log in this process or to its topic; nil when it was written, else
    /// the error and whether the same batch may be written later.
    private func write(_ batch: [DeliveryLogEntry]) async -> (error: any Error, retriable: Bool)? {
        if let direct {
            do throws(DeliveryLogWriteError) {
                try await direct.recordFromDeliverer(batch)
            } catch {
                return (error, error.isRetriable)
            }
        } else {
            do throws(RecordLogError) {
                _ = try await producer.produce(batch.map { $0.record(topic: topic) })
            } catch {
                return (error, error.isRetriable)
            }
        }
        return nil
    }

    private func take() -> [DeliveryLogEntry]? {
        state.withLock { state in
            guard !state.pending.isEmpty else { return nil }
            let count = min(Self.batch, state.pending.count)
            let batch = Array(state.pending.prefix(count))
            state.pending.removeFirst(count)
            return batch
        }
    }

    /// No more records: `run` writes what is pending and ends.
    func finish() {
        state.withLock { $0.finished = true }
        ring.finish()
    }

    /// Whether `run` has ended.
    var isDone: Bool { state.withLock { $0.done } }
}

extension DeliveryLogEntry {
    /// The record on the delivery log's topic.
    func record(topic: String) -> OutgoingRecord {
        switch self {
        case .attempt(let attempt): attempt.record(topic: topic)
        case .status(let status): status.record(topic: topic)
        }
    }
}
