import CoreMetrics
import Logging
import RelayCore
import Synchronization

/// Writes the delivery log's records of successful attempts (`DeliveryAttempt`) to its topic in batches,
/// so a success costs no produce of its own: whatever arrived while the last batch was written goes in
/// the next. A failed attempt's record is written with its retry or dead-letter record instead, in the
/// same produce, so it is never lost. A success's record may be: a crash loses the batch being gathered
/// (a few milliseconds), and a log unavailable for long keeps at most `capacity` (the oldest are dropped,
/// counted). The deliveries themselves never wait for it.
final class AttemptWriter: Sendable {
    static let capacity = 100_000
    static let batch = 1_000

    private let producer: any RecordProducer
    private let logger: Logger
    private let pending = Mutex<[OutgoingRecord]>([])
    private let doorbell: AsyncStream<Void>
    private let ring: AsyncStream<Void>.Continuation
    private let dropped: Counter

    init(producer: any RecordProducer, logger: Logger, metrics: any MetricsFactory) {
        self.producer = producer
        self.logger = logger
        (doorbell, ring) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        dropped = Counter(label: "relay_delivery_log_dropped_total", dimensions: [], factory: metrics)
    }

    /// Queues `record` for the next batch (never blocks).
    func append(_ record: OutgoingRecord) {
        let overflow = pending.withLock { pending -> Bool in
            if pending.count >= Self.capacity {
                pending.removeFirst()
                pending.append(record)
                return true
            }
            pending.append(record)
            return false
        }
        if overflow { dropped.increment() }
        ring.yield()
    }

    /// Writes batches until `finish`, then what is left (once; a failure then is logged and the rest dropped).
    func run() async {
        var backoff = Backoff(initial: .milliseconds(100), maximum: .seconds(10))
        for await _ in doorbell {
            while true {
                let batch = pending.withLock { pending -> [OutgoingRecord] in
                    let taken = Array(pending.prefix(Self.batch))
                    pending.removeFirst(taken.count)
                    return taken
                }
                guard !batch.isEmpty else { break }
                do {
                    _ = try await producer.produce(batch)
                    backoff = Backoff(initial: .milliseconds(100), maximum: .seconds(10))
                } catch {
                    // Back to the front, in order; tried again after a wait (the doorbell rings again).
                    pending.withLock { $0.insert(contentsOf: batch, at: 0) }
                    logger.warning("could not write the delivery log's records; retrying", metadata: [LogKey.error: "\(error)"])
                    do { try await Task.sleep(for: backoff.next()) } catch { return }
                }
            }
        }
    }

    /// No more records: `run` writes what is pending and ends.
    func finish() { ring.finish() }
}
