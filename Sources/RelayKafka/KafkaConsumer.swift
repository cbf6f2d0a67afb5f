public import CoreMetrics
public import Logging
public import RelayCore
internal import CRdKafka
import Synchronization
import Dispatch

/// A topic partition.
public struct TopicPartition: Sendable, Hashable, CustomStringConvertible {
    public var topic: String
    public var partition: Int32

    public init(topic: String, partition: Int32) {
        self.topic = topic
        self.partition = partition
    }

    public var description: String { "\(topic)[\(partition)]" }
}

/// A consumer-group member with at-least-once semantics (docs/architecture.md, Kafka client guarantees).
///
/// - Offsets are stored only when the caller marks a record done (`enable.auto.offset.store=false`),
///   in order per partition even when records finish out of order; librdkafka's auto commit then
///   commits what was stored.
/// - Cooperative-sticky assignment. A revoked partition keeps what was done (already stored, and
///   committed by librdkafka on unassign) and drops the rest: completions that arrive later for it
///   are ignored, and its new owner gets those records again.
/// - Back-pressure: once `maxInFlight` records are out and not done, the poll thread stops polling
///   (librdkafka keeps what it prefetched) until a quarter of them are done. After 10 s at the bound
///   it pauses the assigned partitions instead and polls on, so group membership holds; they resume
///   when half are done.
/// - Polling runs on a dedicated thread, never on Swift's cooperative pool. It starts when `records`
///   is first read or `consume(_:)` is called, and keeps the consumer alive and in its group: call
///   `close()` when done with it.
public final class KafkaConsumer: RecordConsumer, Sendable {
    private let stream: AsyncStream<ConsumedRecord>
    private let client: RDKafkaClient
    private let shared: ConsumerShared
    /// Started on first use, with where its records go.
    private let pollThread = Mutex<PollThread?>(nil)
    private let makePollThread: @Sendable (RecordSink) -> PollThread
    private let logger: Logger

    public init(
        configuration: KafkaConfiguration,
        consumer: KafkaConsumerConfiguration,
        logger: Logger,
        metrics: any MetricsFactory = MetricsSystem.factory
    ) throws(KafkaError) {
        var groupLogger = logger
        groupLogger[metadataKey: LogKey.logGroup] = "\(consumer.groupID)"
        let logger = groupLogger
        let config = RDKafkaConfig()
        try config.set("bootstrap.servers", configuration.bootstrapServers)
        try config.set("client.id", configuration.clientID)
        try config.set("group.id", consumer.groupID)
        try config.set("session.timeout.ms", String(consumer.sessionTimeout.wholeMilliseconds))
        try config.set("auto.offset.reset", consumer.startFromEarliest ? "earliest" : "latest")
        try config.set("auto.commit.interval.ms", String(consumer.commitInterval.wholeMilliseconds))
        try config.set("statistics.interval.ms", String(consumer.statisticsInterval.wholeMilliseconds))
        try config.set("partition.assignment.strategy", "cooperative-sticky")
        // The group's rebalance timeout: a member that dies during a rebalance holds every member's
        // partitions until it passes (librdkafka's default, 300 s, stalled a scale-out for minutes after a
        // SIGKILL). The poll thread polls at least every 100 ms, even while paused, so 60 s is never
        // reached by a live member. At least session.timeout.ms, as librdkafka requires; overridable.
        try config.set("max.poll.interval.ms", String(max(60_000, consumer.sessionTimeout.wholeMilliseconds)))
        try config.set(configuration.consumerProperties)
        // At-least-once depends on these; operators' properties cannot turn them off.
        try config.set("enable.auto.offset.store", "false")
        try config.set("enable.auto.commit", "true")

        let shared = ConsumerShared(maxInFlight: max(1, consumer.maxInFlight), logger: logger, metrics: metrics)
        let lagGauges = LagGauges(metrics: metrics)
        let events = RDKafkaEvents(
            logger: logger,
            onRebalance: { rk, error, partitions in shared.rebalance(rk, error, partitions) },
            onStatistics: { statistics in lagGauges.record(statistics.consumerLag) }
        )
        let client = try RDKafkaClient.make(kind: .consumer, config: config, events: events)
        // Serve logs, errors, statistics and rebalances from rd_kafka_consumer_poll on our thread.
        rd_kafka_poll_set_consumer(client.pointer)

        let list = rd_kafka_topic_partition_list_new(Int32(consumer.topics.count))
        defer { rd_kafka_topic_partition_list_destroy(list) }
        for topic in consumer.topics {
            rd_kafka_topic_partition_list_add(list, topic, RD_KAFKA_PARTITION_UA)
        }
        let subscribed = rd_kafka_subscribe(client.pointer, list)
        guard subscribed == RD_KAFKA_RESP_ERR_NO_ERROR else {
            throw KafkaError(subscribed, context: "could not subscribe to \(consumer.topics.joined(separator: ","))")
        }

        let (stream, continuation) = AsyncStream.makeStream(of: ConsumedRecord.self, bufferingPolicy: .unbounded)
        let consumed = LabeledCounters(label: "relay_kafka_consumed_total", factory: metrics)
        // Each subscribed topic shows from the start, at 0.
        for topic in consumer.topics { consumed.increment([("topic", topic)], by: 0) }
        let dueTime = consumer.dueTime
        let now = consumer.now
        self.stream = stream
        self.client = client
        self.shared = shared
        self.logger = logger
        self.makePollThread = { sink in
            PollThread(
                name: "kafka-consumer",
                body: {
                    // `consume(_:)` was cancelled: hand out nothing more until `close()`, but keep
                    // polling, with the partitions paused, so rebalances and statistics are served while
                    // the caller drains. A record fetched before the pause is dropped unhanded: its
                    // offset is never stored, and the partition's next owner reads it.
                    if sink.isStopped {
                        shared.pauseForStoppedIntake(client.pointer)
                        if let message = rd_kafka_consumer_poll(client.pointer, 100) { rd_kafka_message_destroy(message) }
                        return
                    }
                    // Back-pressure, first stage: stop polling (prefetched records stay queued in librdkafka)
                    // until completions make room; held records still come out when due.
                    if shared.waitForRoom(timeout: .milliseconds(100)) {
                        if dueTime != nil { sink.emit(shared.releaseDue(now: now(), client.pointer)) }
                        return
                    }
                    if let message = rd_kafka_consumer_poll(client.pointer, 100) {
                        if let record = shared.handOut(message) {
                            consumed.increment([("topic", record.topic)])
                            if let due = dueTime?(record), due > now() {
                                shared.hold(record, until: due, client.pointer)
                            } else {
                                sink.emit(record)
                            }
                        }
                        rd_kafka_message_destroy(message)
                    }
                    if dueTime != nil { sink.emit(shared.releaseDue(now: now(), client.pointer)) }
                    shared.applyBackPressure(client.pointer)
                },
                finish: {
                    // Commit what was stored, then leave the group: consumer_close runs the revoke
                    // callback here, on this thread, and librdkafka commits stored offsets on unassign.
                    let committed = rd_kafka_commit(client.pointer, nil, 0)
                    if committed != RD_KAFKA_RESP_ERR_NO_ERROR && committed != RD_KAFKA_RESP_ERR__NO_OFFSET {
                        logger.warning("final offset commit failed", metadata: [LogKey.error: "\(KafkaError(committed, context: "commit"))"])
                    }
                    let closed = rd_kafka_consumer_close(client.pointer)
                    if closed != RD_KAFKA_RESP_ERR_NO_ERROR {
                        logger.warning("consumer close failed", metadata: [LogKey.error: "\(KafkaError(closed, context: "close"))"])
                    }
                    continuation.finish()
                    sink.stop()
                }
            )
        }
        self.streamSink = RecordSink(continuation)
    }

    private let streamSink: RecordSink

    deinit {
        // librdkafka 2.0.2 aborts destroying a cooperative-sticky member that never received an assignment.
        if !shared.everAssigned.load(ordering: .relaxed) { client.keepHandleAtDeinit() }
    }

    /// The records, in log order per partition; reading it starts the consumer. Ends when the consumer closes.
    public var records: AsyncStream<ConsumedRecord> {
        _ = start(streamSink)
        return stream
    }

    /// Runs `handler` on the consumer's poll thread for every record as it is read, in log order per
    /// partition, until the task is cancelled or the consumer closes: no hop to a task per record.
    /// `handler` must be short and never block. After cancellation no record is handed out any more,
    /// and none is being handled when this returns. Use either this or `records`.
    public func consume(_ handler: @escaping @Sendable (ConsumedRecord) -> Void) async {
        let sink = RecordSink(handler)
        guard start(sink) else {
            // Already reading into `records`.
            for await record in stream { handler(record) }
            return
        }
        await withTaskCancellationHandler {
            await sink.untilStopped()
        } onCancel: {
            sink.stop()
        }
    }

    /// Starts the poll thread with `sink` unless it runs already; whether it started now.
    @discardableResult
    private func start(_ sink: RecordSink) -> Bool {
        pollThread.withLock { thread in
            guard thread == nil else { return false }
            thread = makePollThread(sink)
            return true
        }
    }

    public func markDone(_ record: ConsumedRecord) {
        shared.markDone(record, client.pointer)
    }

    public func isAssigned(_ record: ConsumedRecord) -> Bool {
        shared.isAssigned(record)
    }

    /// Records handed out and not yet marked done, over all partitions this member still owns
    /// (records held back until they are due included).
    public var inFlightCount: Int { shared.inFlightCount }

    /// Records held back because they are not yet due (`KafkaConsumerConfiguration.dueTime`).
    public var heldCount: Int { shared.heldCount }

    /// The partitions currently assigned to this member.
    public var assignment: Set<TopicPartition> {
        var list: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?
        guard rd_kafka_assignment(client.pointer, &list) == RD_KAFKA_RESP_ERR_NO_ERROR, let list else { return [] }
        defer { rd_kafka_topic_partition_list_destroy(list) }
        return Set(list.elements.map { TopicPartition(topic: String(cString: $0.topic), partition: $0.partition) })
    }

    /// Whether a broker connection was up at the last statistics report.
    public var isConnected: Bool { client.events.brokersReachable.load(ordering: .relaxed) }

    /// Stops fetching, commits the stored offsets and leaves the group. Records handed out and not
    /// done by now are redelivered to whoever owns their partition next. The `records` stream ends.
    public func close() async {
        // Never started: a thread that polls nothing, for the commit and group leave on close.
        let closing = RecordSink { _ in }
        closing.stop()
        start(closing)
        await pollThread.withLock { $0 }?.stop()
        logger.debug("kafka consumer closed")
    }
}

final class LagGauges: Sendable {
    private let metrics: any MetricsFactory
    init(metrics: any MetricsFactory) { self.metrics = metrics }
    func record(_ lag: [String: Int64]) {
        for (topic, value) in lag {
            Gauge(label: "relay_kafka_consumer_lag", dimensions: [("topic", topic)], factory: metrics).record(value)
        }
    }
}
