internal import CRdKafka
import Foundation
import Logging
import RelayCore

// librdkafka's C callbacks: file-scope functions with no captures, which find their Swift owner through
// rd_kafka_opaque (the `RDKafkaEvents` the client retains) or the message's opaque (a `DeliveryBox`).

func relayKafkaLog(_ rk: OpaquePointer?, _ level: Int32, _ facility: UnsafePointer<CChar>?, _ message: UnsafePointer<CChar>?) {
    guard let events = RDKafkaEvents.from(rk) else { return }
    let logLevel: Logger.Level =
        switch level {
        case 0...2: .critical
        case 3: .error
        case 4: .warning
        case 5, 6: .info
        default: .debug
        }
    let facilityText = facility.map { String(cString: $0) } ?? "-"
    let text = message.map { String(cString: $0) } ?? ""
    events.logger.log(level: logLevel, "librdkafka", metadata: ["librdkafka.facility": "\(facilityText)", "librdkafka.message": "\(text)"])
}

func relayKafkaError(_ rk: OpaquePointer?, _ error: Int32, _ reason: UnsafePointer<CChar>?, _ opaque: UnsafeMutableRawPointer?) {
    guard let events = RDKafkaEvents.from(rk) else { return }
    let code = rd_kafka_resp_err_t(error)
    if code == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN { events.brokersReachable.store(false, ordering: .relaxed) }
    let name = String(cString: rd_kafka_err2name(code))
    let text = reason.map { String(cString: $0) } ?? ""
    let isFatal = code == RD_KAFKA_RESP_ERR__FATAL
    events.logger.log(level: isFatal ? .critical : .warning, "kafka client error", metadata: ["kafka.error": "\(name)", "kafka.reason": "\(text)"])
}

func relayKafkaStatistics(_ rk: OpaquePointer?, _ json: UnsafeMutablePointer<CChar>?, _ length: Int, _ opaque: UnsafeMutableRawPointer?) -> Int32 {
    guard let events = RDKafkaEvents.from(rk), let json else { return 0 }
    if let statistics = RDKafkaStatistics(json: UnsafeRawBufferPointer(start: json, count: length)) {
        events.brokersReachable.store(statistics.brokersUp > 0, ordering: .relaxed)
        events.onStatistics?(statistics)
    }
    return 0  // librdkafka frees the JSON
}

func relayKafkaRebalance(
    _ rk: OpaquePointer?, _ error: rd_kafka_resp_err_t, _ partitions: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?,
    _ opaque: UnsafeMutableRawPointer?
) {
    guard let rk, let partitions, let events = RDKafkaEvents.from(rk), let handler = events.onRebalance else { return }
    handler(rk, error, partitions)
}

func relayKafkaDeliveryReport(_ rk: OpaquePointer?, _ message: UnsafePointer<rd_kafka_message_t>?, _ opaque: UnsafeMutableRawPointer?) {
    guard let message, let pending = relay_rd_kafka_message_opaque(message) else { return }
    // Balances the passRetained in KafkaProducer.send: each record gets exactly one report.
    let box = Unmanaged<DeliveryBox>.fromOpaque(pending).takeRetainedValue()
    let report = message.pointee
    if report.err == RD_KAFKA_RESP_ERR_NO_ERROR {
        let topic = String(cString: rd_kafka_topic_name(report.rkt))
        box.complete(.success(RecordPositionValue(topic: topic, partition: report.partition, offset: report.offset)))
    } else {
        box.complete(.failure(KafkaError(report.err, context: "the broker did not acknowledge the record")))
    }
}
