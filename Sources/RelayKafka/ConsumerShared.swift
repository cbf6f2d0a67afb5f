import CoreMetrics
import Logging
import RelayCore
internal import CRdKafka
import Dispatch
import Synchronization

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
