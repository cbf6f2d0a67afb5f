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

/// Per-partition tracking shared by the poll thread, the rebalance callback and `markDone` callers.
final class ConsumerShared: Sendable {
    struct Assigned {
        var generation: UInt64
        var tracker = OffsetTracker()
    }

    struct State {
        var partitions: [TopicPartition: Assigned] = [:]
        var nextGeneration: UInt64 = 1
        var inFlight = 0
        /// Back-pressure is on: every assigned partition that has started delivering is to be paused.
        var paused = false
        /// The partitions currently paused by us for back-pressure.
        var pausedPartitions: Set<TopicPartition> = []
        /// The poll thread is waiting for completions to make room.
        var waitingForRoom = false
        /// Since when `maxInFlight` records have been out without a pause.
        var overLimitSince: ContinuousClock.Instant?
        /// Records not yet due, per partition (paused at them), in log order, with their due times.
        var held: [TopicPartition: [(record: ConsumedRecord, due: Int64)]] = [:]
        /// `consume(_:)` was cancelled: every partition stays paused until close.
        var intakeStopped = false
    }

    private let state = Mutex(State())
    /// The group has assigned this member partitions (or an empty set) at least once.
    let everAssigned = Atomic<Bool>(false)
    private let maxInFlight: Int
    private let room = DispatchSemaphore(value: 0)
    /// Polling resumes below this many records out.
    private var resumeMark: Int { max(1, maxInFlight * 3 / 4) }
    /// How long the poll thread may wait for room before it pauses the partitions and polls on.
    static let pauseAfter: Duration = .seconds(10)
    private let logger: Logger
    private let inFlightGauge: Gauge

    init(maxInFlight: Int, logger: Logger, metrics: any MetricsFactory) {
        self.maxInFlight = maxInFlight
        self.logger = logger
        self.inFlightGauge = Gauge(label: "relay_kafka_consumer_in_flight", dimensions: [], factory: metrics)
    }

    var inFlightCount: Int { state.withLock { $0.inFlight } }

    /// Turns a polled message into a record, tracking its offset. Nil for errors and events.
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
        let generation = state.withLock { state -> UInt64? in
            if state.partitions[key] == nil {
                state.partitions[key] = Assigned(generation: state.nextGeneration)
                state.nextGeneration += 1
            }
            // A refetched offset is already done or still in flight: handing it out again could let
            // its copy store an offset past the unfinished original.
            guard state.partitions[key]!.tracker.handOut(value.offset) else { return nil }
            state.inFlight += 1
            inFlightGauge.record(state.inFlight)
            return state.partitions[key]!.generation
        }
        guard let generation else { return nil }
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
        let key = TopicPartition(topic: record.topic, partition: record.partition)
        let pause = state.withLock { state -> Bool in
            // Only records of this assignment: a revoked partition's record is dropped (its next owner reads it).
            guard state.partitions[key]?.generation == record.assignmentGeneration else { return false }
            let first = state.held[key] == nil
            state.held[key, default: []].append((record, due))
            return first
        }
        if pause { Self.withList([key]) { _ = rd_kafka_pause_partitions(rk, $0) } }
    }

    /// The held records that are due now, in log order per partition; resumes the partitions that hold
    /// nothing any more (unless back-pressure keeps them paused). Poll thread only.
    func releaseDue(now: Int64, _ rk: OpaquePointer) -> [ConsumedRecord] {
        let (released, toResume) = state.withLock { state -> ([ConsumedRecord], [TopicPartition]) in
            guard !state.held.isEmpty else { return ([], []) }
            var released: [ConsumedRecord] = []
            var toResume: [TopicPartition] = []
            for (key, queue) in state.held {
                var remaining = queue[...]
                while let first = remaining.first, first.due <= now {
                    released.append(first.record)
                    remaining = remaining.dropFirst()
                }
                guard remaining.count != queue.count else { continue }
                if remaining.isEmpty {
                    state.held[key] = nil
                    if state.paused { state.pausedPartitions.insert(key) } else { toResume.append(key) }
                } else {
                    state.held[key] = Array(remaining)
                }
            }
            return (released, toResume)
        }
        if !toResume.isEmpty { Self.withList(toResume) { _ = rd_kafka_resume_partitions(rk, $0) } }
        return released
    }

    /// Records held back because they are not yet due.
    var heldCount: Int { state.withLock { $0.held.values.reduce(0) { $0 + $1.count } } }

    func isAssigned(_ record: ConsumedRecord) -> Bool {
        let key = TopicPartition(topic: record.topic, partition: record.partition)
        return state.withLock { $0.partitions[key]?.generation == record.assignmentGeneration }
    }

    func markDone(_ record: ConsumedRecord, _ rk: OpaquePointer) {
        let key = TopicPartition(topic: record.topic, partition: record.partition)
        let wake = state.withLock { state -> Bool in
            // A record from a partition since revoked (or revoked and assigned again) is not ours to store.
            guard var assigned = state.partitions[key], assigned.generation == record.assignmentGeneration else { return false }
            let (store, wasPending) = assigned.tracker.markDone(record.offset)
            state.partitions[key] = assigned
            if wasPending {
                state.inFlight -= 1
                inFlightGauge.record(state.inFlight)
            }
            // Stored under the lock so that two completions can never store out of order.
            if let store { Self.storeOffset(rk, key, store, logger: logger) }
            guard state.waitingForRoom, state.inFlight < resumeMark else { return false }
            state.waitingForRoom = false
            return true
        }
        if wake { room.signal() }
    }

    /// Whether the poll thread should not poll now because `maxInFlight` records are out; if so, waits
    /// up to `timeout` for completions to make room (below three quarters of it) and returns true.
    /// After `pauseAfter` of waiting it returns false, so polling goes on (group membership, rebalances)
    /// and `applyBackPressure` pauses the partitions instead.
    func waitForRoom(timeout: Duration) -> Bool {
        let wait = state.withLock { state -> Bool in
            // Hysteresis: polling stops at maxInFlight and starts again below three quarters of it.
            let limit = state.overLimitSince == nil ? maxInFlight : resumeMark
            guard state.inFlight >= limit, !state.paused else {
                state.overLimitSince = nil
                return false
            }
            let now = ContinuousClock.now
            let since = state.overLimitSince ?? now
            state.overLimitSince = since
            guard now - since < Self.pauseAfter else { return false }
            state.waitingForRoom = true
            return true
        }
        guard wait else { return false }
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
            let paused = state.withLock { state -> Bool in
                for key in keys {
                    state.inFlight -= state.partitions[key]?.tracker.undoneCount ?? 0
                    state.held[key] = nil
                    state.partitions[key] = Assigned(generation: state.nextGeneration)
                    state.nextGeneration += 1
                    if state.paused { state.pausedPartitions.insert(key) } else { state.pausedPartitions.remove(key) }
                }
                return state.paused
            }
            if cooperative {
                if let failure = rd_kafka_incremental_assign(rk, partitions) { logAndDestroy(failure, "incremental assign") }
            } else {
                _ = rd_kafka_assign(rk, partitions)
            }
            // librdkafka keeps an application pause on a partition across unassign and reassign, so
            // set the state we want explicitly (fetching has not started yet, so either is safe).
            if paused {
                _ = rd_kafka_pause_partitions(rk, partitions)
            } else {
                _ = rd_kafka_resume_partitions(rk, partitions)
            }
            logger.info("partitions assigned", metadata: ["kafka.partitions": "\(description)"])
        case RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS:
            let lost = rd_kafka_assignment_lost(rk) != 0
            let paused = dropTracking(keys)
            // Leave no application pause behind on a partition that may come back to us later.
            if paused { _ = rd_kafka_resume_partitions(rk, partitions) }
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

    /// Forgets revoked partitions: what was done is stored already; what was not is dropped and will be
    /// redelivered to the partition's next owner. Returns whether any of them was paused by us.
    private func dropTracking(_ keys: [TopicPartition]) -> Bool {
        state.withLock { state in
            var anyPaused = false
            for key in keys {
                if let assigned = state.partitions.removeValue(forKey: key) { state.inFlight -= assigned.tracker.undoneCount }
                if state.pausedPartitions.remove(key) != nil { anyPaused = true }
                if state.held.removeValue(forKey: key) != nil { anyPaused = true }
            }
            inFlightGauge.record(state.inFlight)
            return anyPaused
        }
    }

    private func logAndDestroy(_ failure: OpaquePointer, _ what: String) {
        let text = String(cString: rd_kafka_error_string(failure))
        rd_kafka_error_destroy(failure)
        logger.error("rebalance step failed", metadata: ["kafka.step": "\(what)", LogKey.error: "\(text)"])
    }

    /// Second stage of back-pressure, when `maxInFlight` records stayed out for `pauseAfter` (an
    /// endpoint or the log is stuck): pauses the assigned partitions so polling can go on without
    /// handing out more, and resumes them at half of it. Pausing drops librdkafka's prefetched records
    /// (they are fetched again on resume), which is why it is not the first stage.
    ///
    /// Only partitions that delivered a record in this assignment are paused: pausing makes
    /// librdkafka's consumed position the resume point, and before the first record that position may
    /// still be one from an earlier ownership of the partition. Partitions that start delivering while
    /// back-pressure is on are paused on the next poll, so the overshoot is at most a fetch each.
    /// Pauses every assigned partition, and (through `paused`) every one assigned later, once the
    /// intake stopped (poll thread only).
    func pauseForStoppedIntake(_ rk: OpaquePointer) {
        let keys = state.withLock { state -> [TopicPartition] in
            guard !state.intakeStopped else { return [] }
            state.intakeStopped = true
            state.paused = true
            state.pausedPartitions.formUnion(state.partitions.keys)
            return Array(state.partitions.keys)
        }
        if !keys.isEmpty { Self.withList(keys) { _ = rd_kafka_pause_partitions(rk, $0) } }
    }

    func applyBackPressure(_ rk: OpaquePointer) {
        let (toPause, toResume) = state.withLock { state -> ([TopicPartition], [TopicPartition]) in
            if !state.paused && state.inFlight >= maxInFlight
                && state.overLimitSince.map({ ContinuousClock.now - $0 >= Self.pauseAfter }) ?? false
            {
                state.paused = true
                logger.debug("consumer paused for back-pressure")
            } else if state.paused && state.inFlight <= maxInFlight / 2 {
                state.paused = false
                // A partition holding a record that is not yet due stays paused until it is.
                let resumed = Array(state.pausedPartitions.subtracting(state.held.keys))
                state.pausedPartitions = []
                logger.debug("consumer resumed")
                return ([], resumed)
            }
            guard state.paused else { return ([], []) }
            let started = state.partitions.filter { $0.value.tracker.hasHandedOut && !state.pausedPartitions.contains($0.key) }.map(\.key)
            state.pausedPartitions.formUnion(started)
            return (started, [])
        }
        if !toPause.isEmpty { Self.withList(toPause) { _ = rd_kafka_pause_partitions(rk, $0) } }
        if !toResume.isEmpty { Self.withList(toResume) { _ = rd_kafka_resume_partitions(rk, $0) } }
    }

    private static func withList(_ partitions: [TopicPartition], _ body: (UnsafeMutablePointer<rd_kafka_topic_partition_list_t>) -> Void) {
        guard let list = rd_kafka_topic_partition_list_new(Int32(partitions.count)) else { return }
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
