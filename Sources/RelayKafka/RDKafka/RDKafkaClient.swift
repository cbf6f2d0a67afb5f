internal import CRdKafka
import Foundation
import Logging
import RelayCore
import Synchronization

/// Receives what librdkafka reports from its threads. Lives as long as the `rd_kafka_t` it belongs to:
/// `RDKafkaClient` retains it for librdkafka (as the conf opaque) and releases it after `rd_kafka_destroy`.
final class RDKafkaEvents: Sendable {
    let logger: Logger
    /// Set once, before `rd_kafka_new`; called on the thread that serves the queue (our poll thread).
    let onRebalance: (@Sendable (OpaquePointer, rd_kafka_resp_err_t, UnsafeMutablePointer<rd_kafka_topic_partition_list_t>) -> Void)?
    let onStatistics: (@Sendable (RDKafkaStatistics) -> Void)?
    /// Whether any broker connection was up in the latest statistics report (false until the first).
    let brokersReachable = Atomic<Bool>(false)

    init(
        logger: Logger,
        onRebalance: (@Sendable (OpaquePointer, rd_kafka_resp_err_t, UnsafeMutablePointer<rd_kafka_topic_partition_list_t>) -> Void)? = nil,
        onStatistics: (@Sendable (RDKafkaStatistics) -> Void)? = nil
    ) {
        self.logger = logger
        self.onRebalance = onRebalance
        self.onStatistics = onStatistics
    }

    static func from(_ rk: OpaquePointer?) -> RDKafkaEvents? {
        guard let rk, let opaque = rd_kafka_opaque(rk) else { return nil }
        return Unmanaged<RDKafkaEvents>.fromOpaque(opaque).takeUnretainedValue()
    }
}

/// The part of librdkafka's statistics JSON revenue-relay uses.
struct RDKafkaStatistics: Sendable {
    /// Brokers whose connection state is `UP`.
    var brokersUp: Int
    /// Messages waiting in the producer's queue (librdkafka `msg_cnt`).
    var queuedMessages: Int
    /// Sum of `consumer_lag` per topic over the partitions where it is known.
    var consumerLag: [String: Int64]

    init?(json: UnsafeRawBufferPointer) {
        guard let root = try? JSON.parse(Array(json)), case .object = root else { return nil }
        brokersUp = (root["brokers"]?.objectValue ?? [:]).values.filter { $0["state"] == "UP" }.count
        queuedMessages = Int(root["msg_cnt"]?.int64Value ?? 0)
        var lag: [String: Int64] = [:]
        for (topic, value) in root["topics"]?.objectValue ?? [:] {
            var sum: Int64 = 0
            var known = false
            for (id, partition) in value["partitions"]?.objectValue ?? [:] where id != "-1" {
                if let partitionLag = partition["consumer_lag"]?.int64Value, partitionLag >= 0 {
                    sum += partitionLag
                    known = true
                }
            }
            if known { lag[topic] = sum }
        }
        consumerLag = lag
    }
}

/// Owns one `rd_kafka_t`. librdkafka handles are thread-safe, so the pointer may be used from any thread.
final class RDKafkaClient: @unchecked Sendable {
    enum Kind { case producer, consumer }

    let pointer: OpaquePointer
    let events: RDKafkaEvents
    private let eventsOpaque: Unmanaged<RDKafkaEvents>
    private let destroyAtDeinit = Atomic<Bool>(true)

    /// Leaves the handle to the process's end instead of destroying it: librdkafka 2.0.2 aborts destroying a
    /// cooperative-sticky consumer that joined its group but never received an assignment
    /// (`rd_kafka_sticky_assignor_state_destroy: Assertion 'assignor_state' failed`). Such a consumer is
    /// closed by then; a relay process makes one per role, so at most a handle or two is left at exit.
    func keepHandleAtDeinit() {
        destroyAtDeinit.store(false, ordering: .relaxed)
    }

    private init(pointer: OpaquePointer, events: RDKafkaEvents, eventsOpaque: Unmanaged<RDKafkaEvents>) {
        self.pointer = pointer
        self.events = events
        self.eventsOpaque = eventsOpaque
    }

    deinit {
        // A kept handle's threads may still call back: its events object stays retained with it.
        guard destroyAtDeinit.load(ordering: .relaxed) else { return }
        rd_kafka_destroy(pointer)
        // Only now can no librdkafka thread call back into the events object.
        eventsOpaque.release()
    }

    /// Creates the handle. `config` is consumed on success (rd_kafka_new takes the conf only then).
    static func make(
        kind: Kind, config: RDKafkaConfig, events: RDKafkaEvents, deliveryReports: Bool = false
    ) throws(KafkaError) -> RDKafkaClient {
        guard let conf = config.pointer else { throw .configuration("configuration already used") }
        let opaque = Unmanaged.passRetained(events)
        rd_kafka_conf_set_opaque(conf, opaque.toOpaque())
        rd_kafka_conf_set_log_cb(conf, relayKafkaLog)
        rd_kafka_conf_set_error_cb(conf, relayKafkaError)
        rd_kafka_conf_set_stats_cb(conf, relayKafkaStatistics)
        if deliveryReports { rd_kafka_conf_set_dr_msg_cb(conf, relayKafkaDeliveryReport) }
        if events.onRebalance != nil { rd_kafka_conf_set_rebalance_cb(conf, relayKafkaRebalance) }

        var errorBuffer = [CChar](repeating: 0, count: 512)
        guard
            let handle = rd_kafka_new(
                kind == .producer ? RD_KAFKA_PRODUCER : RD_KAFKA_CONSUMER, conf, &errorBuffer, errorBuffer.count)
        else {
            opaque.release()
            let detail = String(decoding: errorBuffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            throw .configuration("could not create the Kafka client: \(detail)")
        }
        _ = config.release()  // now owned by the handle
        return RDKafkaClient(pointer: handle, events: events, eventsOpaque: opaque)
    }
}

struct RecordPositionValue: Sendable {
    var topic: String
    var partition: Int32
    var offset: Int64
}

/// Carries one record's completion through librdkafka as the message opaque.
final class DeliveryBox: Sendable {
    private let completion: @Sendable (Result<RecordPositionValue, KafkaError>) -> Void

    init(_ completion: @escaping @Sendable (Result<RecordPositionValue, KafkaError>) -> Void) {
        self.completion = completion
    }

    func complete(_ result: Result<RecordPositionValue, KafkaError>) {
        completion(result)
    }
}
