public import RelayCore
internal import CRdKafka

/// An error reported by librdkafka or by this client, with librdkafka's code name when there is one.
public struct KafkaError: Error, Sendable, CustomStringConvertible {
    /// librdkafka's error name (`_MSG_TIMED_OUT`, `UNKNOWN_TOPIC_OR_PART`, ...) or this client's own
    /// (`CONFIGURATION`, `CLOSED`). Bounded: safe as a metric label.
    public var code: String
    /// What happened and, where we know, what to do. Never contains record contents or secrets.
    public var reason: String
    public var isRetriable: Bool

    public init(code: String, reason: String, isRetriable: Bool) {
        self.code = code
        self.reason = reason
        self.isRetriable = isRetriable
    }

    public var description: String { "kafka \(code): \(reason)" }

    static func configuration(_ reason: String) -> KafkaError {
        KafkaError(code: "CONFIGURATION", reason: reason, isRetriable: false)
    }

    static let closed = KafkaError(code: "CLOSED", reason: "the Kafka client is closed", isRetriable: false)

    init(_ error: rd_kafka_resp_err_t, context: String) {
        let name = String(cString: rd_kafka_err2name(error))
        let text = String(cString: rd_kafka_err2str(error))
        self.init(code: name, reason: "\(context): \(text)", isRetriable: Self.retriable(error))
    }

    static func retriable(_ error: rd_kafka_resp_err_t) -> Bool {
        switch error {
        case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, RD_KAFKA_RESP_ERR__QUEUE_FULL, RD_KAFKA_RESP_ERR__TRANSPORT,
            RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN, RD_KAFKA_RESP_ERR__TIMED_OUT, RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION:
            true
        default:
            false
        }
    }

    /// The record-log view of this error, for stages that do not know Kafka.
    public var recordLogError: RecordLogError {
        let logCode: RecordLogError.Code =
            switch code {
            case "_MSG_TIMED_OUT", "_TIMED_OUT", "REQUEST_TIMED_OUT": .timedOut
            case "_QUEUE_FULL": .queueFull
            case "CLOSED": .closed
            case "MSG_SIZE_TOO_LARGE", "_MSG_SIZE_TOO_LARGE": .recordTooLarge
            case "CONFIGURATION": .configuration
            default: .other
            }
        return RecordLogError(code: logCode, reason: reason, isRetriable: isRetriable)
    }
}
