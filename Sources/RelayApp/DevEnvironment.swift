import Foundation
public import Logging
public import RelayConfig
public import RelayKafka

/// `revenue-relay dev`: every role in one process on loopback, with the local backend.
///
/// By default on the embedded durable log in a data directory (`.revenue-relay/dev`), which also holds the
/// backend's database: stopping and starting `dev` keeps every topic, offset, subscription state and dead
/// letter. With `kafka: true` on an embedded Kafka-protocol broker instead (librdkafka's mock cluster, in
/// memory, real TCP on loopback), for trying Kafka tools; nothing is kept.
public final class DevEnvironment: Sendable {
    /// The in-memory broker, with `--kafka`.
    public let cluster: EmbeddedKafkaCluster?
    /// The embedded log's data directory, without `--kafka`.
    public let dataDirectory: String?
    /// The Kafka-protocol broker's addresses, on Kafka.
    private let bootstrapServers: String?
    public let process: RelayProcess

    /// Partitions per topic in dev. Default: 6.
    public static let partitions = 6
    /// Where `dev` keeps its data when `--data` is not given (relative to the working directory).
    public static let defaultDataDirectory = ".revenue-relay/dev"

    public init(
        configuration: RelayConfiguration, dataDirectory: String? = nil, kafka: Bool = false, logger: Logger, installSignalHandlers: Bool = true
    ) throws(RelaySetupError) {
        if kafka {
            let cluster: EmbeddedKafkaCluster
            do {
                cluster = try Self.makeCluster(for: configuration, logger: logger)
            } catch {
                throw .kafka(error)
            }
            self.cluster = cluster
            self.dataDirectory = nil
            bootstrapServers = cluster.bootstrapServers
            self.process = try RelayProcess(
                configuration: Self.onKafka(configuration), roles: Role.defaultRoles + [.backend], bootstrapServers: cluster.bootstrapServers,
                logger: logger, installSignalHandlers: installSignalHandlers)
        } else {
            var configuration = configuration
            let directory = URL(fileURLWithPath: dataDirectory ?? Self.defaultDataDirectory).standardizedFileURL.path
            configuration.log.kind = .embedded
            configuration.log.path = directory
            configuration.log.partitions = Self.partitions
            configuration.backend.database = directory + "/backend.sqlite"
            self.cluster = nil
            self.dataDirectory = directory
            bootstrapServers = nil
            self.process = try RelayProcess(
                configuration: configuration, roles: Role.defaultRoles + [.backend], logger: logger, installSignalHandlers: installSignalHandlers)
        }
    }

    /// `dev --kafka`'s relay on a cluster that runs elsewhere (`makeCluster`'s, in another process: the
    /// benchmark's, so that the relay's CPU and memory are its own, as beside a deployment's Kafka).
    public init(configuration: RelayConfiguration, bootstrapServers: String, logger: Logger, installSignalHandlers: Bool = true) throws(RelaySetupError) {
        cluster = nil
        dataDirectory = nil
        self.bootstrapServers = bootstrapServers
        process = try RelayProcess(
            configuration: Self.onKafka(configuration), roles: Role.defaultRoles + [.backend], bootstrapServers: bootstrapServers, logger: logger,
            installSignalHandlers: installSignalHandlers)
    }

    /// `dev --kafka`'s broker: librdkafka's mock cluster of three brokers, each of the configuration's topics
    /// with `partitions` partitions.
    public static func makeCluster(for configuration: RelayConfiguration, logger: Logger) throws(KafkaError) -> EmbeddedKafkaCluster {
        let cluster = try EmbeddedKafkaCluster(brokers: 3, logger: logger)
        for topic in configuration.topics.all(retrySteps: configuration.delivery.retrySchedule.count) {
            try cluster.createTopic(topic, partitions: partitions)
        }
        return cluster
    }

    /// The configuration on the Kafka protocol, with `dev --kafka`'s fetch wait.
    private static func onKafka(_ configuration: RelayConfiguration) -> RelayConfiguration {
        var configuration = configuration
        configuration.log.kind = .kafka
        // librdkafka's mock broker holds every fetch for fetch.wait.max.ms (500 ms by default) even when
        // records are waiting, once at the worker and once at the deliverer: 5 ms keeps dev's latency
        // low. A real broker answers a fetch as soon as records are there (fetch.min.bytes: 1).
        if configuration.kafka.properties["fetch.wait.max.ms"] == nil { configuration.kafka.properties["fetch.wait.max.ms"] = "5" }
        return configuration
    }

    /// The line `dev` prints for its log: `log: embedded DIR` or `kafka: 127.0.0.1:PORT,...`.
    public var logLine: String {
        if let bootstrapServers { return "kafka: \(bootstrapServers)" }
        return "log: embedded \(dataDirectory ?? "")"
    }
}
