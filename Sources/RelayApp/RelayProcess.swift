import CoreMetrics
public import Logging
public import Prometheus
public import RelayConfig
public import RelayCore
public import RelayIngest
import RelayKafka
import RelayAppStoreAPI
import RelayEmbeddedLog
public import RelayBackend
import RelayLocalBackend
import RelayGooglePlay
import RelayNormalization
import RelayStripe
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
    /// The metrics server's bound port (`metrics.listen`), published once it listens.
    private let metricsListening: Eventual<Int>
    /// Where the backend is: the configured URL, or the local backend of this process once it listens.
    public let backendAddress: BackendAddress
    /// The worker's backend client (subscription state, product mappings), aimed at `backendAddress`.
    public let backendClient: BackendClient
    /// The record log the roles run on (`log.kind`).
    public let log: any RecordLog

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
        } catch let error as RecordLogError {
            throw .log(error)
        } catch let error as EmbeddedRecordLog.AlreadyOwned {
            throw .log(RecordLogError(code: .configuration, reason: "\(error)", isRetriable: false))
        } catch let error as ConfigurationError {
            throw .configuration(error)
        } catch {
            // Not dressed as any one dependency's error: say what it was.
            throw .other("\(type(of: error)): \(error)")
        }
    }

    private init(
        uncheckedConfiguration configuration: RelayConfiguration, roles: [Role], bootstrapServers: String?, logger: Logger,
        installSignalHandlers: Bool
    ) throws {
        // A second process on the same embedded log: say that (69), not that its ports are taken (78).
        if configuration.log.kind == .embedded, EmbeddedRecordLog.isOwned(directory: configuration.log.path) {
            throw EmbeddedRecordLog.AlreadyOwned(directory: configuration.log.path)
        }
        // Taken addresses fail here, before anything opens, naming the key to change.
        try ListenCheck.requireFree(configuration.ingest.listen, key: "ingest.listen")
        if roles.contains(.backend) { try ListenCheck.requireFree(configuration.backend.listen, key: "backend.listen") }
        if let metricsListen = configuration.metrics.listen { try ListenCheck.requireFree(metricsListen, key: "metrics.listen") }
        // Deliveries in flight, connections and the log's files all take descriptors; the common soft
        // limit of 1,024 is below what the defaults can use.
        FileDescriptorLimit.raiseSoftLimitToHard()
        // Until the servers start (after this returns), the probes get an answer on the same addresses: opening
        // the log and the backend's database can take minutes (the events store's move) or wait for a lock.
        // The probes' own address first (metrics.listen when set): it is served first whenever connections wait.
        var probed = configuration.metrics.listen.map { [$0] } ?? []
        probed.append(configuration.ingest.listen)
        if roles.contains(.backend) { probed.append(configuration.backend.listen) }
        let startupProbes = StartupProbeResponder.start(probed, logger: logger)
        defer { startupProbes?.stop() }
        let registry = PrometheusCollectorRegistry()
        let metrics = PrometheusMetricsFactory(registry: registry)
        let health = HealthState()
        let listening = Eventual<Int>()
        let metricsListening = Eventual<Int>()
        // Every role uses the log: the backend consumes relay.events into its events store.
        let log = try Self.makeLog(configuration: configuration, roles: roles, bootstrapServers: bootstrapServers, logger: logger, metrics: metrics)

        // Start order; shutdown runs backwards through this list.
        var services: [any Service] = []
        let backendAddress = BackendAddress(roles.contains(.backend) ? nil : configuration.backend.url)
        let backendClient = BackendClient(configuration: configuration.backend, address: backendAddress, logger: logger, metrics: metrics)
        var stateStore: any SubscriptionStateStore = BackendStateStore(client: backendClient)
        var eventStore: EventStore?
        var deliveryLog: DeliveryLog?
        if roles.contains(.backend) {
            // First to start, last to stop: the worker uses it until it has stopped.
            let database: SubscriptionDatabase
            do {
                database = try SubscriptionDatabase(
                    path: configuration.backend.database, commitInterval: configuration.backend.commitInterval, metrics: metrics)
            } catch {
                throw ConfigurationError(key: "backend.database", message: "cannot open \(configuration.backend.database): \(error)")
            }
            let backend = try LocalBackend(
                configuration: configuration, database: database, appTransactions: try Self.appTransactionGrants(configuration, log: log),
                appPurchases: try Self.appPurchases(configuration, log: log, storeAPIs: try StoreAPIs.configured(configuration, logger: logger)),
                deliveryActions: try Self.deliveryActions(configuration, log: log),
                rejectedNotifications: Self.rejectedNotifications(configuration, log: log), metrics: metrics)
            // A worker in this process reads and writes the same database directly.
            stateStore = LocalStateStore(backend: backend, database: database)
            eventStore = backend.events
            deliveryLog = backend.deliveryLog
            let host = configuration.backend.listen.host
            let reachableHost = host == "0.0.0.0" || host == "::" ? "127.0.0.1" : host
            services.append(
                backend.application(logger: logger) { port in
                    backendAddress.set("http://\(ListenAddress(host: reachableHost, port: port))")
                })
            // Promotional grants end on time, whatever else happens.
            services.append(GrantExpiry(backend: backend, logger: logger))
        }
        // The log's one producer serves the ingest, the worker and the deliverer; the log starts before them
        // and so closes after them.
        services.append(RecordLogService(log: log))
        // A process that only serves the backend stays ready without the log: SDKs' entitlement reads
        // must not fail because Kafka does; its events recorder catches up (relay-backend's lag).
        if Set(roles) != [.backend] {
            health.addReadinessCheck(configuration.log.kind == .kafka ? "kafka_unreachable" : "log_unavailable") { log.isAvailable }
        }
        if let eventStore {
            let (group, topics) = configuration.consumerGroups[2]
            // Reads the embedded log at most every 50 ms while events keep coming (the recorder gathers for as
            // long again): recording is read by people, not on the webhooks' path.
            let consumer = try log.consumer(ConsumerOptions(groupID: group, topics: topics, maxInFlight: 2_048, readInterval: .milliseconds(50)))
            services.append(
                EventRecorder(
                    consumer: consumer, store: eventStore, deliveryLog: deliveryLog.map { ($0, configuration.topics.attempts) }, logger: logger,
                    metrics: metrics))
        }
        var ingestRoutes: RelayHTTPServer.IngestRoutes?
        if roles.contains(.ingest) {
            ingestRoutes = try RelayHTTPServer.IngestRoutes(configuration, log: log)
            if let embedded = log as? EmbeddedRecordLog {
                // The notifications' budget is full: the ingest answers 503 (with Retry-After) until the worker
                // catches up. A warning, not unreadiness: the process serves the rest (the local backend's
                // routes), and the ingest's own 503 tells the stores when to come back.
                let topic = configuration.topics.notifications
                health.addWarning("log_budget_full") { embedded.isFull(topic) }
            }
        }
        if roles.contains(.worker) {
            if !roles.contains(.backend) {
                // A worker whose backend is unreachable (or refuses its key) retries each notification and
                // finishes none. With the ingest in the same process this takes the ingest out of rotation
                // too: split the roles (as deploy/kubernetes does) to keep it taking notifications then.
                health.addReadinessCheck("backend_unreachable") { backendClient.isReachable }
                health.addReadinessCheck("backend_unauthorized") { backendClient.isAuthorized }
            }
            for warning in configuration.warnings {
                logger.warning("configuration loses data", metadata: ["config.key": "\(warning.key)", "detail": "\(warning.message)"])
            }
            let (group, topics) = configuration.consumerGroups[0]
            // Reads the embedded log at most every 4 ms while notifications keep coming, so that a steady stream
            // is verified, written and produced in batches (docs/architecture.md, latency against batching).
            let consumer = try log.consumer(
                ConsumerOptions(groupID: group, topics: topics, maxInFlight: configuration.worker.maxInFlight, readInterval: .milliseconds(4)))
            // Verification reads the roots and key files now, so a bad one stops startup with its key.
            let verifier = try NotificationVerifier(configuration: configuration, logger: logger)
            // The exchange rates and Play API keys are read now too.
            let normalizer = try SubscriptionUpdater(
                configuration: configuration, stateStore: stateStore, storeAPIs: try StoreAPIs.configured(configuration, logger: logger),
                logger: logger, metrics: metrics)
            // CONSUMPTION_REQUEST answers, only for the apps that configure apple.consumption; the key files are read now.
            let consumptionSenders = try AppStoreConsumptionSender.senders(for: configuration, logger: logger)
            let consumption = consumptionSenders.isEmpty
                ? nil
                : ConsumptionResponder(apps: configuration.apps, senders: consumptionSenders, stateStore: stateStore, logger: logger, metrics: metrics)
            let handler = NotificationHandler(
                configuration: configuration, verifier: verifier, normalizer: normalizer, producer: try log.producer, logger: logger,
                metrics: metrics, consumption: consumption)
            services.append(WorkerService(consumer: consumer, handler: handler, logger: logger, metrics: metrics))
        }
        if roles.contains(.deliverer) {
            let consumer = try log.consumer(Deliverer.consumerOptions(for: configuration))
            let producer = try log.producer
            do {
                // With the local backend in this process, the attempts go to its delivery log directly, not through
                // topics.attempts (which its recorder still reads, for deliverers in other processes).
                let direct = deliveryLog.map { InProcessDeliveryLog(log: $0, metrics: metrics) }
                services.append(
                    try Deliverer(configuration: configuration, consumer: consumer, producer: producer, deliveryLog: direct, logger: logger, metrics: metrics))
            } catch {
                throw ConfigurationError(key: error.key, message: error.message)
            }
        }
        let server = RelayHTTPServer(
            listen: configuration.ingest.listen, metricsListen: configuration.metrics.listen, limits: .init(configuration.ingest),
            health: health, registry: registry,
            ingest: ingestRoutes, logger: logger)
        services.append(server.makeService(onListening: { port in listening.set(port) }))
        if let metricsServer = server.makeMetricsService(onListening: { port in metricsListening.set(port) }) {
            services.append(metricsServer)
        }
        services.append(ReadinessService(health: health))

        let running = RunningServices()
        services = services.map { TrackedService($0, registry: running) }
        var groupConfiguration = ServiceGroupConfiguration(services: services, logger: logger)
        groupConfiguration.maximumGracefulShutdownDuration = configuration.shutdownTimeout
        if installSignalHandlers {
            groupConfiguration.gracefulShutdownSignals = [.sigterm, .sigint]
            // A process of its own: the watchdog bounds the shutdown and exits 75 naming what it
            // abandons, so the group's cancellation bound (a fatal error, SIGILL) is never reached.
            groupConfiguration.services.append(
                .init(service: ShutdownWatchdog(shutdownTimeout: configuration.shutdownTimeout, registry: running, logger: logger)))
            groupConfiguration.maximumCancellationDuration = nil
        } else {
            // In a test's process: no exit; the group's own bound applies.
            groupConfiguration.maximumCancellationDuration = .seconds(5)
        }
        self.group = ServiceGroup(configuration: groupConfiguration)
        self.health = health
        self.registry = registry
        self.listening = listening
        self.metricsListening = metricsListening
        self.backendAddress = backendAddress
        self.backendClient = backendClient
        self.log = log
    }

    /// Each app's Apple verifier (its rules), by app key, and a lookup that refuses an app without one.
    private static func appleVerifiers(_ configuration: RelayConfiguration) throws -> @Sendable (String) -> Result<AppleVerifier, Rejection> {
        var verifiers: [String: AppleVerifier] = [:]
        for (index, app) in configuration.apps.enumerated() {
            guard let apple = app.apple else { continue }
            verifiers[app.key] = try AppleVerifier(app: app.key, configuration: apple, configurationKey: "apps[\(index)].apple")
        }
        let byApp = verifiers
        return { app in byApp[app].map { .success($0) } ?? .failure(Rejection(.unknownApp, "app \"\(app)\" has no apple section")) }
    }

    /// The app-transaction route's verification (each app's Apple rules) and its append to
    /// `relay.notifications` through the log this process opened.
    static func appTransactionGrants(_ configuration: RelayConfiguration, log: any RecordLog) throws -> AppTransactionGrants {
        let verifier = try appleVerifiers(configuration)
        let producer = try log.producer
        return AppTransactionGrants(
            topic: configuration.topics.notifications,
            verify: { app, text in verifier(app).flatMap { verifier in Result { () throws(Rejection) in try verifier.verify(appTransaction: text) } } },
            append: { record in _ = try await producer.produce(record) })
    }

    /// The purchases and grants routes' verification (each app's Apple rules), the stores' APIs they read,
    /// and their append to `relay.notifications` through the log this process opened.
    static func appPurchases(_ configuration: RelayConfiguration, log: any RecordLog, storeAPIs: StoreAPIs) throws -> AppPurchases {
        let verifier = try appleVerifiers(configuration)
        let producer = try log.producer
        return AppPurchases(
            topic: configuration.topics.notifications, storeAPIs: storeAPIs,
            verifyApple: { app, text in
                verifier(app).flatMap { verifier in Result { () throws(Rejection) in try verifier.verify(signedTransaction: text) } }
            },
            append: { record in _ = try await producer.produce(record) })
    }

    /// The delivery action routes' access to the log: resends and control records go to the deliveries topic.
    static func deliveryActions(_ configuration: RelayConfiguration, log: any RecordLog) throws -> DeliveryActions {
        let producer = try log.producer
        let topic = configuration.topics.deliveries
        return DeliveryActions(
            topic: topic,
            partitions: {
                // Kafka answers over the network: off Swift's cooperative pool.
                try await withCheckedThrowingContinuation { continuation in
                    startDedicatedThread(named: "relay-partitions") {
                        continuation.resume(with: Result { () throws(RecordLogError) in try log.partitionEnds(of: topic).count })
                    }
                }
            },
            append: { records in _ = try await producer.produce(records) })
    }

    /// The console's rejected page: the newest records of the rejected topic, read from each partition's end.
    static func rejectedNotifications(_ configuration: RelayConfiguration, log: any RecordLog) -> RejectedNotifications {
        let topic = configuration.topics.rejected
        return RejectedNotifications { limit in
            // Kafka answers over the network: the ends and the reader are made off Swift's cooperative pool.
            let snapshot: any TopicSnapshot = try await withCheckedThrowingContinuation { continuation in
                startDedicatedThread(named: "relay-rejected") {
                    continuation.resume(
                        with: Result { () throws(RecordLogError) in
                            let ends = try log.partitionEnds(of: topic)
                            let each = Int64(max(1, limit / max(1, ends.count)))
                            let offsets = Dictionary(uniqueKeysWithValues: ends.map { ($0.partition, max($0.startOffset, $0.endOffset - each)) })
                            return try log.read(topic, from: offsets, follow: false)
                        })
                }
            }
            var found: [RejectedNotification] = []
            do {
                for try await record in snapshot.records {
                    if let notification = RejectedNotification(record) { found.append(notification) }
                }
            } catch {
                await snapshot.close()
                throw error
            }
            await snapshot.close()
            return found
        }
    }

    /// The log `log.kind` names: Kafka at `bootstrapServers` (else `kafka.bootstrapServers`), or the
    /// embedded log at `log.path`.
    /// - Parameter roles: on the embedded log, retention waits for the worker and the deliverer (whichever
    ///   roles run now: they process what piles up once they run) and for the backend's events recorder only
    ///   when it runs here (a remote backend does not read this log).
    static func makeLog(
        configuration: RelayConfiguration, roles: [Role] = Role.allCases, bootstrapServers: String?, logger: Logger, metrics: any MetricsFactory
    ) throws -> any RecordLog {
        switch configuration.log.kind {
        case .kafka:
            let kafka = KafkaConfiguration(
                bootstrapServers: bootstrapServers ?? configuration.kafka.bootstrapServers, properties: configuration.kafka.properties)
            return KafkaRecordLog(
                configuration: kafka, producer: KafkaProducerConfiguration(deliveryTimeout: configuration.ingest.ackTimeout), logger: logger,
                metrics: metrics)
        case .embedded:
            let groups = configuration.consumerGroups.filter { $0.group != "relay-backend" || roles.contains(.backend) }
            return try EmbeddedRecordLog.open(configuration: configuration, consumerGroups: groups, logger: logger, metrics: metrics)
        }
    }

    /// Runs until shutdown.
    public func run() async throws {
        try await group.run()
    }

    /// The HTTP port once the server listens (the configured one, or the one chosen for port 0).
    public func waitForHTTPPort() async -> Int {
        await listening.value()
    }

    /// The HTTP port once the server listens, or nil when the waiting task is cancelled first (the
    /// process ended without listening).
    public func httpPort() async -> Int? {
        await listening.valueUnlessCancelled()
    }

    /// The port of the `metrics.listen` server once it listens (only when `metrics.listen` is set).
    public func waitForMetricsPort() async -> Int {
        await metricsListening.value()
    }

    public func triggerGracefulShutdown() async {
        await group.triggerGracefulShutdown()
    }
}
