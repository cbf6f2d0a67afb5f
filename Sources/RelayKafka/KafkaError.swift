public import RelayCore
internal import CRdKafka

/// An error reported by librdkafka or by this client, with librdkafka's code name when there is one.
public struct KafkaError: Error, Sendable, CustomStringConvertible {
    /// What failed: one of librdkafka's errors, or one of this client's own.
    public enum Code: Sendable, Hashable, CustomStringConvertible {
        /// librdkafka's error, by its name (`_MSG_TIMED_OUT`, `UNKNOWN_TOPIC_OR_PART`, ...).
        case librdkafka(String)
        /// A setting librdkafka refused, or a client that cannot be built from the configuration.
        case configuration
        /// The client was closed.
        case closed
        /// librdkafka could not allocate a list or headers.
        case allocation
        /// A topic handle could not be opened.
        case topic
        /// The embedded (mock) cluster could not start.
        case mockCluster
        /// Setting up a process failed for another reason.
        case setup
        /// A failure with no librdkafka code.
        case unknown

        /// The name used in logs and as the `outcome` metric label: librdkafka's, or the client's own in capitals.
        public var name: String {
            switch self {
            case .librdkafka(let name): name
            case .configuration: "CONFIGURATION"
            case .closed: "CLOSED"
            case .allocation: "ALLOCATION"
            case .topic: "TOPIC"
            case .mockCluster: "MOCK_CLUSTER"
            case .setup: "SETUP"
            case .unknown: "UNKNOWN"
            }
        }

        public var description: String { name }
    }

    /// Bounded: `code.name` is safe as a metric label.
    public var code: Code
    /// What happened and, where we know, what to do. Never contains record contents or secrets.
    public var reason: String
    public var isRetriable: Bool

    public init(code: Code, reason: String, isRetriable: Bool) {
        self.code = code
        self.reason = reason
        self.isRetriable = isRetriable
    }

    public var description: String { "kafka \(code): \(reason)" }

    static func configuration(_ reason: String) -> KafkaError {
        KafkaError(code: .configuration, reason: reason, isRetriable: false)
    }

    static let closed = KafkaError(code: .closed, reason: "the Kafka client is closed", isRetriable: false)

    init(_ error: rd_kafka_resp_err_t, context: String) {
        let name = String(cString: rd_kafka_err2name(error))
        let text = String(cString: rd_kafka_err2str(error))
        self.init(code: .librdkafka(name), reason: "\(context): \(text)", isRetriable: Self.retriable(error))
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
            case .librdkafka("_MSG_TIMED_OUT"), .librdkafka("_TIMED_OUT"), .librdkafka("REQUEST_TIMED_OUT"): .timedOut
            case .librdkafka("_QUEUE_FULL"): .queueFull
            case .closed: .closed
            case .librdkafka("MSG_SIZE_TOO_LARGE"), .librdkafka("_MSG_SIZE_TOO_LARGE"): .recordTooLarge
            case .configuration: .configuration
            default: .other
            }
        return RecordLogError(code: logCode, reason: reason, isRetriable: isRetriable)
    }
}
