public import CoreMetrics
public import Logging
public import RelayCore
public import ServiceLifecycle

/// Consumes raw notifications (`relay.notifications`, group `relay-worker`) and runs the processor
/// on each, with at-least-once semantics:
///
/// - Records of one partition are processed one at a time, in order, so one subscription's
///   notifications never race (the record key keeps a subscription on one partition). Partitions
///   proceed independently.
/// - A record is marked done only after the processor returned; a failing processor is retried with
///   backoff, never skipped.
/// - Graceful shutdown: stop taking new records, finish the ones already dispatched, then close the
///   consumer (store, commit, leave the group).
public final class WorkerService: Service {
    private let consumer: any RecordConsumer
    private let processor: any NotificationProcessor
    private let logger: Logger
    private let metrics: any MetricsFactory
    /// Backoff between attempts of a failing record. Default: 100 ms doubling to 30 s.
    private let retryBackoff: (initial: Duration, maximum: Duration)

    public init(
        consumer: any RecordConsumer, processor: any NotificationProcessor, logger: Logger, metrics: any MetricsFactory,
        retryBackoff: (initial: Duration, maximum: Duration) = (.milliseconds(100), .seconds(30))
    ) {
        self.consumer = consumer
        self.processor = processor
        self.logger = logger
        self.metrics = metrics
        self.retryBackoff = retryBackoff
    }

    public func run() async throws {
        await withTaskGroup(of: Void.self) { group in
            var lanes: [PartitionKey: AsyncStream<ConsumedRecord>.Continuation] = [:]
            for await record in consumer.records.cancelOnGracefulShutdown() {
                let key = PartitionKey(topic: record.topic, partition: record.partition)
                if let lane = lanes[key] {
                    lane.yield(record)
                    continue
                }
                let (stream, continuation) = AsyncStream.makeStream(of: ConsumedRecord.self)
                lanes[key] = continuation
                continuation.yield(record)
                group.addTask { [self] in
                    for await record in stream { await handle(record) }
                }
            }
            // Intake stopped (shutdown or the consumer closed): let every lane finish what it has.
            for lane in lanes.values { lane.finish() }
            await group.waitForAll()
        }
        await consumer.close()
        logger.info("worker stopped")
    }

    private func handle(_ record: ConsumedRecord) async {
        var delay = retryBackoff.initial
        var attempt = 1
        while true {
            // Records read before a rebalance took the partition away belong to its new owner now.
            guard consumer.isAssigned(record) else { return }
            do {
                try await processor.process(record)
                consumer.markDone(record)
                return
            } catch {
                // On cancellation (shutdown past its bound) the record stays not done: it is redelivered.
                if Task.isCancelled { return }
                Counter(label: "relay_worker_retries_total", dimensions: [], factory: metrics).increment()
                logger.warning(
                    "processing failed; retrying",
                    metadata: [
                        LogKey.logTopic: "\(record.topic)", LogKey.logPartition: "\(record.partition)",
                        LogKey.logOffset: "\(record.offset)", LogKey.error: "\(error)", "attempt": "\(attempt)",
                    ])
                do { try await Task.sleep(for: delay) } catch { return }
                delay = min(delay * 2, retryBackoff.maximum)
                attempt += 1
            }
        }
    }

    private struct PartitionKey: Hashable {
        var topic: String
        var partition: Int32
    }
}
