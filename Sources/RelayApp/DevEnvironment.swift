public import Logging
public import RelayConfig
public import RelayKafka

/// `revenue-relay dev`: an embedded Kafka-protocol broker (librdkafka's mock cluster, in memory, real
/// TCP on loopback) with every topic the pipeline uses, and the same roles production runs.
public final class DevEnvironment: Sendable {
    public let cluster: EmbeddedKafkaCluster
    public let process: RelayProcess

    /// Partitions per topic in dev. Default: 6.
    public static let partitions = 6

    public init(configuration: RelayConfiguration, logger: Logger, installSignalHandlers: Bool = true) throws(RelaySetupError) {
        let cluster: EmbeddedKafkaCluster
        do {
            cluster = try EmbeddedKafkaCluster(brokers: 3, logger: logger)
            for topic in configuration.kafka.topics.all(retrySteps: configuration.delivery.retrySchedule.count) {
                try cluster.createTopic(topic, partitions: Self.partitions)
            }
        } catch {
            throw .kafka(error)
        }
        self.cluster = cluster
        self.process = try RelayProcess(
            configuration: configuration, roles: Role.defaultRoles + [.backend],
            bootstrapServers: cluster.bootstrapServers, logger: logger, installSignalHandlers: installSignalHandlers)
    }
}
