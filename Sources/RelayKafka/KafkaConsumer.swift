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

/// A consumer-group member with at-least-once semantics (the README's Kafka client guarantees).
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

/// Where the poll thread puts the records it hands out: the `records` stream, or a `consume(_:)`
/// handler called on the poll thread. Stopping a handler waits for a call in progress, so none runs
/// once `stop()` returned.
final class RecordSink: Sendable {
    private enum Target {
        case stream(AsyncStream<ConsumedRecord>.Continuation)
        case handler(@Sendable (ConsumedRecord) -> Void)
    }

    private struct State {
        var stopped = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let target: Target
    private let state = Mutex(State())
    private let stoppedFlag = Atomic<Bool>(false)

    init(_ continuation: AsyncStream<ConsumedRecord>.Continuation) { target = .stream(continuation) }
    init(_ handler: @escaping @Sendable (ConsumedRecord) -> Void) { target = .handler(handler) }

    var isStopped: Bool { stoppedFlag.load(ordering: .acquiring) }

    func emit(_ record: ConsumedRecord) {
        switch target {
        case .stream(let continuation):
            continuation.yield(record)
        case .handler(let handler):
            // Under the lock: `stop()` cannot return while a record is being handled.
            state.withLock { state in
                if !state.stopped { handler(record) }
            }
        }
    }

    func emit(_ records: [ConsumedRecord]) {
        for record in records { emit(record) }
    }

    /// No record is handed to the handler any more; `untilStopped()` returns.
    func stop() {
        let waiters = state.withLock { state in
            state.stopped = true
            defer { state.waiters = [] }
            return state.waiters
        }
        stoppedFlag.store(true, ordering: .releasing)
        for waiter in waiters { waiter.resume() }
    }

    func untilStopped() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let stopped = state.withLock { state in
                if !state.stopped { state.waiters.append(continuation) }
                return state.stopped
            }
            if stopped { continuation.resume() }
        }
    }
}

/// Per-partition tracking shared by the poll thread, the rebalance callback and `markDone` callers: the
/// `ConsumerBookkeeping` state machine behind a mutex, whose actions this performs with librdkafka.
final class ConsumerShared: Sendable {
    private let state: Mutex<ConsumerBookkeeping>
    /// The group has assigned this member partitions (or an empty set) at least once.
    let everAssigned = Atomic<Bool>(false)
    private let room = DispatchSemaphore(value: 0)
    private let logger: Logger
    private let inFlightGauge: Gauge

    init(maxInFlight: Int, logger: Logger, metrics: any MetricsFactory) {
        self.state = Mutex(ConsumerBookkeeping(maxInFlight: maxInFlight))
        self.logger = logger
        self.inFlightGauge = Gauge(label: "relay_kafka_consumer_in_flight", dimensions: [], factory: metrics)
    }

    var inFlightCount: Int { state.withLock { $0.inFlight } }

    /// Turns a polled message into a record, tracking its offset. Nil for errors and events, and for an
    /// offset already handed out in this assignment.
    func handOut(_ message: UnsafeMutablePointer<rd_kafka_message_t>) -> ConsumedRecord? {
        let value = message.pointee
        guard value.err == RD_KAFKA_RESP_ERR_NO_ERROR else {
            if value.err != RD_KAFKA_RESP_ERR__PARTITION_EOF {
                logger.warning("kafka consume error", metadata: [LogKey.error: "\(KafkaError(value.err, context: "consume"))"])
            }
            return nil
        }
        let topic = String(cString: rd_kafka_topic_name(value.rkt))
        let key = TopicPartition(topic: topic, partition: value.partition)
        let decision = state.withLock { state in
            let decision = state.handOut(key, offset: value.offset)
            if case .deliver = decision { inFlightGauge.record(state.inFlight) }
            return decision
        }
        guard case .deliver(let generation) = decision else { return nil }
        return ConsumedRecord(
            topic: topic, partition: value.partition, offset: value.offset,
            key: value.key.map { Array(UnsafeRawBufferPointer(start: $0, count: value.key_len)) },
            value: value.payload.map { Array(UnsafeRawBufferPointer(start: $0, count: value.len)) } ?? [],
            headers: Self.headers(of: message), timestampMilliseconds: Self.timestamp(of: message),
            assignmentGeneration: generation)
    }

    static func headers(of message: UnsafeMutablePointer<rd_kafka_message_t>) -> [RecordHeader] {
        var headers: OpaquePointer?
        guard rd_kafka_message_headers(message, &headers) == RD_KAFKA_RESP_ERR_NO_ERROR, let headers else { return [] }
        var result: [RecordHeader] = []
        result.reserveCapacity(rd_kafka_header_cnt(headers))
        var index = 0
        var name: UnsafePointer<CChar>?
        var value: UnsafeRawPointer?
        var size = 0
        while rd_kafka_header_get_all(headers, index, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR {
            if let name {
                let bytes = value.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) } ?? []
                result.append(RecordHeader(name: String(cString: name), value: bytes))
            }
            index += 1
        }
        return result
    }

    static func timestamp(of message: UnsafeMutablePointer<rd_kafka_message_t>) -> Int64? {
        var type = RD_KAFKA_TIMESTAMP_NOT_AVAILABLE
        let timestamp = rd_kafka_message_timestamp(message, &type)
        return type == RD_KAFKA_TIMESTAMP_NOT_AVAILABLE ? nil : timestamp
    }

    /// Holds back a record that is not yet due and pauses its partition at it (poll thread only).
    func hold(_ record: ConsumedRecord, until due: Int64, _ rk: OpaquePointer) {
        perform(state.withLock { $0.hold(record, until: due) }, rk)
    }

    /// The held records that are due now, in log order per partition; resumes the partitions that hold
    /// nothing any more (unless back-pressure keeps them paused). Poll thread only.
    func releaseDue(now: Int64, _ rk: OpaquePointer) -> [ConsumedRecord] {
        let release = state.withLock { $0.releaseDue(now: now) }
        perform(release.resume, rk)
        return release.records
    }

    /// Records held back because they are not yet due.
    var heldCount: Int { state.withLock { $0.heldCount } }

    func isAssigned(_ record: ConsumedRecord) -> Bool {
        let key = TopicPartition(topic: record.topic, partition: record.partition)
        return state.withLock { $0.isAssigned(key, generation: record.assignmentGeneration) }
    }

    func markDone(_ record: ConsumedRecord, _ rk: OpaquePointer) {
        let key = TopicPartition(topic: record.topic, partition: record.partition)
        let signalRoom = state.withLock { state -> Bool in
            let completion = state.markDone(key, offset: record.offset, generation: record.assignmentGeneration)
            if completion.inFlightChanged { inFlightGauge.record(state.inFlight) }
            // Stored under the lock so that two completions can never store out of order.
            if let offset = completion.storeOffset { Self.storeOffset(rk, key, offset, logger: logger) }
            return completion.signalRoom
        }
        if signalRoom { room.signal() }
    }

    /// Whether the poll thread should not poll now because `maxInFlight` records are out; if so, waits
    /// up to `timeout` for completions to make room (below three quarters of it) and returns true.
    /// After `ConsumerBookkeeping.pauseAfter` of waiting it returns false, so polling goes on (group
    /// membership, rebalances) and `applyBackPressure` pauses the partitions instead.
    func waitForRoom(timeout: Duration) -> Bool {
        let now = ContinuousClock.now
        guard state.withLock({ $0.checkRoom(now: now) }) == .waitForRoom else { return false }
        _ = room.wait(timeout: .now() + .milliseconds(Int(timeout.wholeMilliseconds)))
        return true
    }

    private static func storeOffset(_ rk: OpaquePointer, _ key: TopicPartition, _ offset: Int64, logger: Logger) {
        guard let list = rd_kafka_topic_partition_list_new(1) else { return }
        defer { rd_kafka_topic_partition_list_destroy(list) }
        rd_kafka_topic_partition_list_add(list, key.topic, key.partition).pointee.offset = offset
        let result = rd_kafka_offsets_store(rk, list)
        let partitionResult = list.elements.first?.err ?? RD_KAFKA_RESP_ERR_NO_ERROR
        if result != RD_KAFKA_RESP_ERR_NO_ERROR || partitionResult != RD_KAFKA_RESP_ERR_NO_ERROR {
            // _STATE: the partition was revoked meanwhile; its new owner redelivers the record.
            logger.debug(
                "offset not stored",
                metadata: [
                    LogKey.logTopic: "\(key.topic)", LogKey.logPartition: "\(key.partition)",
                    LogKey.error: "\(KafkaError(partitionResult != RD_KAFKA_RESP_ERR_NO_ERROR ? partitionResult : result, context: "store"))",
                ])
        }
    }

    /// Called on the poll thread (from rd_kafka_consumer_poll or rd_kafka_consumer_close).
    func rebalance(_ rk: OpaquePointer, _ error: rd_kafka_resp_err_t, _ partitions: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>) {
        let cooperative = String(cString: rd_kafka_rebalance_protocol(rk)) == "COOPERATIVE"
        let keys = partitions.elements.map { TopicPartition(topic: String(cString: $0.topic), partition: $0.partition) }
        let description = keys.map(\.description).sorted().joined(separator: ",")
        switch error {
        case RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS:
            everAssigned.store(true, ordering: .relaxed)
            let fetch = state.withLock { $0.assign(keys) }
            if cooperative {
                if let failure = rd_kafka_incremental_assign(rk, partitions) { logAndDestroy(failure, "incremental assign") }
            } else {
                _ = rd_kafka_assign(rk, partitions)
            }
            // librdkafka keeps an application pause on a partition across unassign and reassign, so
            // set the state we want explicitly (fetching has not started yet, so either is safe).
            perform(fetch, rk)
            logger.info("partitions assigned", metadata: ["kafka.partitions": "\(description)"])
        case RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS:
            let lost = rd_kafka_assignment_lost(rk) != 0
            // Leave no application pause behind on a partition that may come back to us later.
            perform(dropTracking(keys), rk)
            if cooperative {
                if let failure = rd_kafka_incremental_unassign(rk, partitions) { logAndDestroy(failure, "incremental unassign") }
            } else {
                _ = rd_kafka_assign(rk, nil)
            }
            logger.info("partitions revoked", metadata: ["kafka.partitions": "\(description)", "kafka.lost": "\(lost)"])
        default:
            logger.error("rebalance failed", metadata: [LogKey.error: "\(KafkaError(error, context: "rebalance"))"])
            _ = dropTracking(keys)
            if cooperative {
                if let failure = rd_kafka_incremental_unassign(rk, partitions) { logAndDestroy(failure, "incremental unassign") }
            } else {
                _ = rd_kafka_assign(rk, nil)
            }
        }
    }

    /// Forgets revoked partitions (`ConsumerBookkeeping.revoke`); what to resume of them.
    private func dropTracking(_ keys: [TopicPartition]) -> ConsumerBookkeeping.FetchAction {
        state.withLock { state in
            let fetch = state.revoke(keys)
            inFlightGauge.record(state.inFlight)
            return fetch
        }
    }

    private func logAndDestroy(_ failure: OpaquePointer, _ what: String) {
        let text = String(cString: rd_kafka_error_string(failure))
        rd_kafka_error_destroy(failure)
        logger.error("rebalance step failed", metadata: ["kafka.step": "\(what)", LogKey.error: "\(text)"])
    }

    /// Pauses every assigned partition, and (through the bookkeeping's `paused`) every one assigned
    /// later, once the intake stopped (poll thread only).
    func pauseForStoppedIntake(_ rk: OpaquePointer) {
        perform(state.withLock { $0.stopIntake() }, rk)
    }

    /// Second stage of back-pressure (`ConsumerBookkeeping.applyBackPressure`): pauses the partitions
    /// that delivered once `maxInFlight` records stayed out for `pauseAfter`, resumes them at half of it
    /// (poll thread only).
    func applyBackPressure(_ rk: OpaquePointer) {
        let now = ContinuousClock.now
        switch state.withLock({ $0.applyBackPressure(now: now) }) {
        case .none:
            break
        case .pause(let partitions, let turnedOn):
            if turnedOn { logger.debug("consumer paused for back-pressure") }
            Self.withList(partitions) { _ = rd_kafka_pause_partitions(rk, $0) }
        case .resume(let partitions):
            logger.debug("consumer resumed")
            Self.withList(partitions) { _ = rd_kafka_resume_partitions(rk, $0) }
        }
    }

    /// Pauses or resumes partitions in librdkafka.
    private func perform(_ action: ConsumerBookkeeping.FetchAction, _ rk: OpaquePointer) {
        switch action {
        case .none:
            break
        case .pause(let partitions):
            Self.withList(partitions) { _ = rd_kafka_pause_partitions(rk, $0) }
        case .resume(let partitions):
            Self.withList(partitions) { _ = rd_kafka_resume_partitions(rk, $0) }
        }
    }

    private static func withList(
        _ partitions: some Collection<TopicPartition>, _ body: (UnsafeMutablePointer<rd_kafka_topic_partition_list_t>) -> Void
    ) {
        guard !partitions.isEmpty, let list = rd_kafka_topic_partition_list_new(Int32(partitions.count)) else { return }
        defer { rd_kafka_topic_partition_list_destroy(list) }
        for partition in partitions { rd_kafka_topic_partition_list_add(list, partition.topic, partition.partition) }
        body(list)
    }
}

private final class LagGauges: Sendable {
    private let metrics: any MetricsFactory
    init(metrics: any MetricsFactory) { self.metrics = metrics }
    func record(_ lag: [String: Int64]) {
        for (topic, value) in lag {
            Gauge(label: "relay_kafka_consumer_lag", dimensions: [("topic", topic)], factory: metrics).record(value)
        }
    }
}
