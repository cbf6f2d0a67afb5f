import CoreMetrics
public import Logging
public import Prometheus
public import RelayConfig
public import RelayCore
public import RelayIngest
public import RelayKafka
public import RelayBackend
import RelayLocalBackend
import RelayNormalization
import RelayVerification
import RelayWorker
import RelayDelivery
public import ServiceLifecycle

/// One revenue-relay process: the chosen roles as services in one `ServiceGroup`.
///
/// Graceful shutdown (SIGTERM/SIGINT, or `triggerGracefulShutdown`) runs in reverse order of start:
/// readiness flips to not-ready; the HTTP server stops accepting and finishes in-flight requests;
/// the deliverer stops taking records, lets running transfers finish and closes its consumer; the
/// worker stops taking records, finishes the dispatched ones and closes its consumer (stores,
/// commits, leaves the group); the producer flushes. All within `shutdownTimeout`, after which
/// what is left is cancelled (and redelivered later, never lost).
public final class RelayProcess: Sendable {
    public let group: ServiceGroup
    public let health: HealthState
    public let registry: PrometheusCollectorRegistry
    /// The HTTP server's bound port, published once it listens.
    private let listening: Eventual<Int>
    /// Where the backend is: the configured URL, or the local backend of this process once it listens.
    public let backendAddress: BackendAddress
    /// The worker's backend client (subscription state, product mappings), aimed at `backendAddress`.
    public let backendClient: BackendClient

    /// - Parameters:
    ///   - bootstrapServers: overrides `kafka.bootstrapServers` (the `--bootstrap-servers` option, and dev).
    ///   - installSignalHandlers: false in tests, which trigger shutdown themselves.
    public convenience init(
        configuration: RelayConfiguration, roles: [Role], bootstrapServers: String? = nil, logger: Logger,
        installSignalHandlers: Bool = true
    ) throws(RelaySetupError) {
        do {
            try self.init(
                uncheckedConfiguration: configuration, roles: roles, bootstrapServers: bootstrapServers, logger: logger,
                installSignalHandlers: installSignalHandlers)
        } catch let error as KafkaError {
            throw .kafka(error)
        } catch let error as ConfigurationError {
            throw .configuration(error)
        } catch {
            throw .kafka(KafkaError(code: "SETUP", reason: "\(error)", isRetriable: false))
        }
    }

    private init(
        uncheckedConfiguration configuration: RelayConfiguration, roles: [Role], bootstrapServers: String?, logger: Logger,
        installSignalHandlers: Bool
    ) throws {
        let registry = PrometheusCollectorRegistry()
        let metrics = PrometheusMetricsFactory(registry: registry)
        let health = HealthState()
        let listening = Eventual<Int>()
        let kafka = KafkaConfiguration(
            bootstrapServers: bootstrapServers ?? configuration.kafka.bootstrapServers, properties: configuration.kafka.properties)

        // Start order; shutdown runs backwards through this list.
        var services: [any Service] = []
        let backendAddress = BackendAddress(roles.contains(.backend) ? nil : configuration.backend.url)
        let backendClient = BackendClient(configuration: configuration.backend, address: backendAddress, logger: logger, metrics: metrics)
        if roles.contains(.backend) {
            // First to start, last to stop: the worker uses it until it has stopped.
            let database: SubscriptionDatabase
            do {
                database = try SubscriptionDatabase(path: configuration.backend.database)
            } catch {
                throw ConfigurationError(key: "backend.database", message: "cannot open \(configuration.backend.database): \(error)")
            }
            let backend = try LocalBackend(configuration: configuration, database: database)
            let host = configuration.backend.listen.host
            let reachableHost = host == "0.0.0.0" || host == "::" ? "127.0.0.1" : host
            services.append(
                backend.application(logger: logger) { port in
                    backendAddress.set("http://\(ListenAddress(host: reachableHost, port: port))")
                })
        }
        // One producer for the ingest, the worker and the deliverer; it starts before them and so stops after them.
        var sharedProducer: KafkaProducer?
        func producer(deliveryTimeout: Duration) throws -> KafkaProducer {
            if let sharedProducer { return sharedProducer }
            let producer = try KafkaProducer(
                configuration: kafka, producer: KafkaProducerConfiguration(deliveryTimeout: deliveryTimeout), logger: logger, metrics: metrics)
            services.append(ProducerService(producer: producer))
            sharedProducer = producer
            return producer
        }
        var ingestProducer: KafkaProducer?
        if roles.contains(.ingest) {
            let producer = try producer(deliveryTimeout: configuration.ingest.ackTimeout)
            health.addReadinessCheck("kafka_unreachable") { producer.isConnected }
            ingestProducer = producer
        }
        if roles.contains(.worker) {
            var consumerConfiguration = KafkaConsumerConfiguration(groupID: "relay-worker", topics: [configuration.kafka.topics.notifications])
            consumerConfiguration.maxInFlight = 1000
            let consumer = try KafkaConsumer(configuration: kafka, consumer: consumerConfiguration, logger: logger, metrics: metrics)
            if ingestProducer == nil { health.addReadinessCheck("kafka_unreachable") { consumer.isConnected } }
            // Verification reads the roots and key files now, so a bad one stops startup with its key.
            let verifier = try NotificationVerifier(configuration: configuration, logger: logger)
            let workerProducer = try producer(deliveryTimeout: .seconds(30))
            // The exchange rates and Play API keys are read now too.
            let normalizer = try Normalizer(
                configuration: configuration, stateStore: BackendStateStore(client: backendClient), logger: logger, metrics: metrics)
            let pipeline = NotificationPipeline(
                configuration: configuration, verifier: verifier, normalizer: normalizer, producer: workerProducer, logger: logger,
                metrics: metrics)
            services.append(WorkerService(consumer: consumer, processor: pipeline, logger: logger, metrics: metrics))
        }
        if roles.contains(.deliverer) {
            let settings = Deliverer.consumerConfiguration(for: configuration)
            var consumerConfiguration = KafkaConsumerConfiguration(groupID: settings.groupID, topics: settings.topics)
            consumerConfiguration.maxInFlight = settings.maxInFlight
            consumerConfiguration.dueTime = { DeliveryRecord.dueTime(of: $0) }
            let consumer = try KafkaConsumer(configuration: kafka, consumer: consumerConfiguration, logger: logger, metrics: metrics)
            if ingestProducer == nil && !roles.contains(.worker) { health.addReadinessCheck("kafka_unreachable") { consumer.isConnected } }
            let delivererProducer = try producer(deliveryTimeout: .seconds(30))
            do {
                services.append(
                    try Deliverer(configuration: configuration, consumer: consumer, producer: delivererProducer, logger: logger, metrics: metrics))
            } catch {
                throw ConfigurationError(key: error.key, message: error.message)
            }
        }
        let server = RelayHTTPServer(
            listen: configuration.ingest.listen, health: health, registry: registry,
            ingest: ingestProducer.map { RelayHTTPServer.IngestRoutes(configuration: configuration, producer: $0) }, logger: logger)
        services.append(server.makeService(onListening: { port in listening.set(port) }))
        services.append(ReadinessService(health: health))

        var groupConfiguration = ServiceGroupConfiguration(services: services, logger: logger)
        if installSignalHandlers {
            groupConfiguration.gracefulShutdownSignals = [.sigterm, .sigint]
        }
        groupConfiguration.maximumGracefulShutdownDuration = configuration.shutdownTimeout
        groupConfiguration.maximumCancellationDuration = .seconds(5)
        self.group = ServiceGroup(configuration: groupConfiguration)
        self.health = health
        self.registry = registry
        self.listening = listening
        self.backendAddress = backendAddress
        self.backendClient = backendClient
    }

    /// Runs until shutdown.
    public func run() async throws {
        try await group.run()
    }

    /// The HTTP port once the server listens (the configured one, or the one chosen for port 0).
    public func waitForHTTPPort() async -> Int {
        await listening.value()
    }

    public func triggerGracefulShutdown() async {
        await group.triggerGracefulShutdown()
    }
}

/// Why a process could not be set up: the configuration (exit 78) or Kafka.
public enum RelaySetupError: Error, CustomStringConvertible {
    case configuration(ConfigurationError)
    case kafka(KafkaError)

    public var description: String {
        switch self {
        case .configuration(let error): "\(error)"
        case .kafka(let error): "\(error)"
        }
    }
}
