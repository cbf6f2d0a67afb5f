import CoreMetrics
import HTTPTypes
import HummingbirdCore
import NIOHTTPTypes
public import Hummingbird
public import Logging
import NIOCore
public import Prometheus
public import RelayConfig
public import RelayCore

/// The inbound HTTP server of one process. Every role serves `/health/live`, `/health/ready` and
/// `/metrics`; the ingest role adds the store notification routes (docs/contracts.md).
///
/// Hardened against clients that hold connections: one with no request activity for
/// `ingest.idleTimeout` is closed (kept alive between requests, or still sending its headers), a
/// request whose body has not arrived within `ingest.requestTimeout` is closed, and at
/// `ingest.maxConnections` open connections new ones wait in the listen backlog. Without these, a
/// thousand idle connections used up the descriptors and the health routes stopped answering.
public struct RelayHTTPServer: Sendable {
    /// What the store routes need: the `ingest` section, the apps (which stores each receives), the
    /// notifications topic, and the producer that writes it.
    public struct IngestRoutes: Sendable {
        public var ingest: RelayConfiguration.Ingest
        public var apps: [RelayConfiguration.App]
        public var topic: String
        public var producer: any RecordProducer
        /// The worker group's next offset per partition of `topic` (a blocking read), for the per-client
        /// bound on unprocessed bytes; nil: no bound.
        public var processedOffsets: (@Sendable () throws -> [Int32: Int64])?
        /// Monotonic nanoseconds for the per-client request limit (tests step it). Nil: the system's clock.
        public var clock: (@Sendable () -> UInt64)?

        public init(
            ingest: RelayConfiguration.Ingest, apps: [RelayConfiguration.App], topic: String, producer: any RecordProducer,
            processedOffsets: (@Sendable () throws -> [Int32: Int64])? = nil, clock: (@Sendable () -> UInt64)? = nil
        ) {
            self.ingest = ingest
            self.apps = apps
            self.topic = topic
            self.producer = producer
            self.processedOffsets = processedOffsets
            self.clock = clock
        }

        /// The routes of `configuration`'s `ingest` section, apps and notifications topic on `log`: the
        /// per-client bound follows the progress of the worker's group (`relay-worker`).
        public init(_ configuration: RelayConfiguration, log: any RecordLog) throws(RecordLogError) {
            let topic = configuration.topics.notifications
            let group = configuration.consumerGroups[0].group
            self.init(
                ingest: configuration.ingest, apps: configuration.apps, topic: topic, producer: try log.producer,
                processedOffsets: { try log.committedOffsets(group: group, topic: topic) })
        }
    }

    /// Connection limits (the `ingest` section's `idleTimeout`, `requestTimeout`, `maxConnections`).
    public struct Limits: Sendable {
        public var idleTimeout: Duration
        public var requestTimeout: Duration
        public var maxConnections: Int

        public init(idleTimeout: Duration, requestTimeout: Duration, maxConnections: Int) {
            self.idleTimeout = idleTimeout
            self.requestTimeout = requestTimeout
            self.maxConnections = maxConnections
        }

        public init(_ ingest: RelayConfiguration.Ingest) {
            self.init(idleTimeout: ingest.idleTimeout, requestTimeout: ingest.requestTimeout, maxConnections: ingest.maxConnections)
        }
    }

    public var listen: ListenAddress
    /// Where `/metrics` is served instead of `listen` (`metrics.listen`); nil serves it on `listen`.
    public var metricsListen: ListenAddress?
    public var limits: Limits
    public var health: HealthState
    public var registry: PrometheusCollectorRegistry
    public var ingest: IngestRoutes?
    public var logger: Logger

    public init(
        listen: ListenAddress, metricsListen: ListenAddress? = nil, limits: Limits = Limits(RelayConfiguration.Ingest()), health: HealthState,
        registry: PrometheusCollectorRegistry, ingest: IngestRoutes?, logger: Logger
    ) {
        self.listen = listen
        self.metricsListen = metricsListen
        self.limits = limits
        self.health = health
        self.registry = registry
        self.ingest = ingest
        self.logger = logger
    }

    /// The server as a `Service`. `onListening` receives the bound port (useful with port 0).
    public func makeService(onListening: @escaping @Sendable (Int) async -> Void = { _ in }) -> some ApplicationProtocol {
        let router = Router(context: RelayRequestContext.self)
        router.add(middleware: MethodNotAllowed(ingest: ingest != nil, metrics: metricsListen == nil))
        addHealthRoutes(router)
        if metricsListen == nil { addMetricsRoute(router) }
        if let ingest {
            let handler = NotificationIngest(
                routes: ingest, health: health, metrics: IngestMetrics(factory: PrometheusMetricsFactory(registry: registry)), logger: logger)
            handler.addRoutes(to: router)
        }
        return application(router, at: listen, onListening: onListening)
    }

    /// The metrics server at `metricsListen` (health and `/metrics`), or nil when `/metrics` is on the main server.
    public func makeMetricsService(onListening: @escaping @Sendable (Int) async -> Void = { _ in }) -> (some ApplicationProtocol)? {
        guard let metricsListen else { return nil as Application<RouterResponder<RelayRequestContext>>? }
        let router = Router(context: RelayRequestContext.self)
        router.add(middleware: MethodNotAllowed(ingest: false, metrics: true))
        addHealthRoutes(router)
        addMetricsRoute(router)
        return application(router, at: metricsListen, onListening: onListening)
    }

    private func application(
        _ router: Router<RelayRequestContext>, at address: ListenAddress, onListening: @escaping @Sendable (Int) async -> Void
    ) -> Application<RouterResponder<RelayRequestContext>> {
        let limits = self.limits
        let channel = HTTP1Channel.Configuration(
            additionalChannelHandlers: [RequestDeadlineHandler(timeout: TimeAmount(limits.requestTimeout))],
            idleTimeout: TimeAmount(limits.idleTimeout))
        return Application(
            router: router,
            server: .http1(configuration: channel),
            configuration: .init(
                address: .hostname(address.host, port: address.port), serverName: nil,
                availableConnectionsDelegate: MaximumAvailableConnections(limits.maxConnections, logger: logger)),
            onServerRunning: { channel in await onListening(channel.localAddress?.port ?? address.port) },
            logger: logger
        )
    }

    private func addHealthRoutes(_ router: Router<RelayRequestContext>) {
        let health = self.health
        router.get("/health/live") { _, _ in
            jsonResponse(.ok, HealthBodies.live)
        }
        router.get("/health/ready") { _, _ in
            let reasons = health.notReadyReasons()
            return jsonResponse(reasons.isEmpty ? .ok : .serviceUnavailable, HealthBodies.ready(reasons: reasons, warnings: health.currentWarnings()))
        }
    }

    private func addMetricsRoute(_ router: Router<RelayRequestContext>) {
        let registry = self.registry
        let health = self.health
        // What /health/ready answers, as a metric: alerts need no probe of their own.
        let ready = Gauge(label: "relay_ready", dimensions: [], factory: PrometheusMetricsFactory(registry: registry))
        router.get("/metrics") { _, _ in
            ready.record(health.notReadyReasons().isEmpty ? 1 : 0)
            var buffer: [UInt8] = []
            buffer.reserveCapacity(16 * 1024)
            registry.emit(into: &buffer)
            return Response(
                status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(bytes: buffer)))
        }
    }
}

/// Closes a connection whose request body has not fully arrived within `timeout` of its headers: a
/// client that trickles a byte at a time keeps resetting the idle timer, but not this one.
final class RequestDeadlineHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart

    private let timeout: TimeAmount
    private var deadline: Scheduled<Void>?

    init(timeout: TimeAmount) {
        self.timeout = timeout
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head:
            deadline?.cancel()
            let loopBound = NIOLoopBound(context, eventLoop: context.eventLoop)
            deadline = context.eventLoop.scheduleTask(in: timeout) { loopBound.value.close(promise: nil) }
        case .end:
            deadline?.cancel()
            deadline = nil
        case .body:
            break
        }
        context.fireChannelRead(data)
    }

    func channelInactive(context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = nil
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = nil
    }
}


/// The context of a request to the relay's HTTP server: Hummingbird's storage and the TCP peer's
/// address (the ingest's per-client limits start from it).
public struct RelayRequestContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    /// The TCP peer's IP address; nil when unknown.
    public let peerAddress: String?

    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        peerAddress = source.channel.remoteAddress?.ipAddress
    }
}

/// The health routes' bodies (docs/contracts.md), for the servers and for the process's answers while it starts.
public enum HealthBodies {
    public static let live: JSON = ["status": "live"]

    /// `{"status": "ready"}`, or `not_ready` with its `reasons`; either with the `warnings` that hold.
    public static func ready(reasons: [String], warnings: [String] = []) -> JSON {
        var body: [String: JSON] = reasons.isEmpty ? ["status": "ready"] : ["status": "not_ready", "reasons": .array(reasons.map(JSON.string))]
        if !warnings.isEmpty { body["warnings"] = .array(warnings.map(JSON.string)) }
        return .object(body)
    }
}

/// A JSON response with the given body.
func jsonResponse(_ status: HTTPResponse.Status, _ body: JSON) -> Response {
    Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: body.serialized())))
}

/// A route that exists but not for this method answers 405 with `Allow` (RFC 9110), not 404: a client
/// that sends GET where POST belongs learns what to fix.
struct MethodNotAllowed: RouterMiddleware {
    typealias Context = RelayRequestContext
    let ingest: Bool
    let metrics: Bool

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch let error as HTTPError where error.status == .notFound {
            guard let allowed = allowedMethods(path: request.uri.path), !allowed.contains(request.method) else { throw error }
            let allow = allowed.map(\.rawValue).joined(separator: ", ")
            var response = jsonResponse(
                .methodNotAllowed, ["error": "method_not_allowed", "detail": .string("\(request.uri.path) takes \(allow)")])
            response.headers[.allow] = allow
            return response
        }
    }

    /// The methods the route at `path` takes, or nil when no route is there.
    private func allowedMethods(path: String) -> [HTTPRequest.Method]? {
        switch path {
        case "/health/live", "/health/ready": return [.get]
        case "/metrics" where metrics: return [.get]
        default:
            let segments = path.split(separator: "/", omittingEmptySubsequences: false)
            // "/v1/notifications/{store}/{app}" splits into "", "v1", "notifications", store, app.
            if ingest, segments.count == 5, segments[1] == "v1", segments[2] == "notifications", !segments[3].isEmpty, !segments[4].isEmpty {
                return [.post]
            }
            return nil
        }
    }
}
