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
    public let process: RelayProcess

    /// Partitions per topic in dev. Default: 6.
    public static let partitions = 6
    /// Where `dev` keeps its data when `--data` is not given (relative to the working directory).
    public static let defaultDataDirectory = ".revenue-relay/dev"

    public init(
        configuration: RelayConfiguration, dataDirectory: String? = nil, kafka: Bool = false, logger: Logger, installSignalHandlers: Bool = true
    ) throws(RelaySetupError) {
        var configuration = configuration
        if kafka {
            let cluster: EmbeddedKafkaCluster
            do {
                cluster = try EmbeddedKafkaCluster(brokers: 3, logger: logger)
                for topic in configuration.topics.all(retrySteps: configuration.delivery.retrySchedule.count) {
                    try cluster.createTopic(topic, partitions: Self.partitions)
                }
            } catch {
                throw .kafka(error)
            }
            configuration.log.kind = .kafka
            // librdkafka's mock broker holds every fetch for fetch.wait.max.ms (500 ms by default) even when
            // records are waiting, once at the worker and once at the deliverer: 5 ms keeps dev's latency
            // low. A real broker answers a fetch as soon as records are there (fetch.min.bytes: 1).
            if configuration.kafka.properties["fetch.wait.max.ms"] == nil { configuration.kafka.properties["fetch.wait.max.ms"] = "5" }
            self.cluster = cluster
            self.dataDirectory = nil
            self.process = try RelayProcess(
                configuration: configuration, roles: Role.defaultRoles + [.backend], bootstrapServers: cluster.bootstrapServers, logger: logger,
                installSignalHandlers: installSignalHandlers)
        } else {
            let directory = URL(fileURLWithPath: dataDirectory ?? Self.defaultDataDirectory).standardizedFileURL.path
            configuration.log.kind = .embedded
            configuration.log.path = directory
            configuration.log.partitions = Self.partitions
            configuration.backend.database = directory + "/backend.sqlite"
            self.cluster = nil
            self.dataDirectory = directory
            self.process = try RelayProcess(
                configuration: configuration, roles: Role.defaultRoles + [.backend], logger: logger, installSignalHandlers: installSignalHandlers)
        }
    }

    /// The line `dev` prints for its log: `log: embedded DIR` or `kafka: 127.0.0.1:PORT,...`.
    public var logLine: String {
        if let cluster { return "kafka: \(cluster.bootstrapServers)" }
        return "log: embedded \(dataDirectory ?? "")"
    }
}
