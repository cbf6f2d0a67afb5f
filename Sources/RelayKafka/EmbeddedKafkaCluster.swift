public import Logging
internal import CRdKafka

/// An in-process Kafka-protocol broker cluster: librdkafka's mock cluster, serving real TCP on
/// 127.0.0.1. For `revenue-relay dev` and tests only: it keeps everything in memory, at most about
/// 5 MiB or 100,000 message sets per partition (the oldest are dropped), and loses it all on exit.
public final class EmbeddedKafkaCluster: @unchecked Sendable {
    // Mock-cluster calls are thread-safe: they post operations to the cluster's own thread.
    private let owner: RDKafkaClient
    private let cluster: OpaquePointer
    public let brokerCount: Int
    /// `127.0.0.1:PORT,...`: give this to any Kafka client (kcat, the relay's own clients).
    public let bootstrapServers: String

    public init(brokers: Int = 3, logger: Logger) throws(KafkaError) {
        guard brokers >= 1 else { throw .configuration("an embedded cluster needs at least one broker") }
        let config = RDKafkaConfig()
        // The handle only hosts the cluster's threads; it never connects anywhere.
        try config.set("bootstrap.servers", "")
        try config.set("log_level", "4")
        let owner = try RDKafkaClient.make(kind: .producer, config: config, events: RDKafkaEvents(logger: logger))
        guard let cluster = rd_kafka_mock_cluster_new(owner.pointer, Int32(brokers)) else {
            throw KafkaError(code: .mockCluster, reason: "librdkafka could not start the embedded cluster", isRetriable: false)
        }
        self.owner = owner
        self.cluster = cluster
        self.brokerCount = brokers
        self.bootstrapServers = String(cString: rd_kafka_mock_cluster_bootstraps(cluster))
    }

    deinit {
        rd_kafka_mock_cluster_destroy(cluster)
        // `owner` is destroyed after this, when its last reference goes.
    }

    /// Creates a topic. Replication is min(3, brokers) so a single broker going down loses nothing.
    public func createTopic(_ name: String, partitions: Int) throws(KafkaError) {
        let replication = Int32(min(3, brokerCount))
        let result = rd_kafka_mock_topic_create(cluster, name, Int32(partitions), replication)
        guard result == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(result, context: "could not create topic \(name)") }
    }

    /// Disconnects a broker (1-based id) and refuses new connections; nil takes every broker down.
    public func takeDown(broker: Int32? = nil) throws(KafkaError) {
        let result = rd_kafka_mock_broker_set_down(cluster, broker ?? -1)
        guard result == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(result, context: "could not take the broker down") }
    }

    /// Delays every answer of a broker (1-based id; nil: every broker) by `milliseconds`: a broker that
    /// stops answering while connections stay open (tests of shutdowns and timeouts).
    public func setRoundTripTime(_ milliseconds: Int, broker: Int32? = nil) throws(KafkaError) {
        let brokers: [Int32] = broker.map { [$0] } ?? Array(1...Int32(brokerCount))
        for id in brokers {
            let result = rd_kafka_mock_broker_set_rtt(cluster, id, Int32(milliseconds))
            guard result == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(result, context: "could not set the broker's round-trip time") }
        }
    }

    /// Accepts connections again on a broker (1-based id); nil brings every broker up.
    public func bringUp(broker: Int32? = nil) throws(KafkaError) {
        let result = rd_kafka_mock_broker_set_up(cluster, broker ?? -1)
        guard result == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(result, context: "could not bring the broker up") }
    }
}
