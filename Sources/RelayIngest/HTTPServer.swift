public import CoreMetrics
import HTTPTypes
public import Hummingbird
public import Logging
import NIOCore
public import Prometheus
public import RelayConfig
public import RelayCore

/// The inbound HTTP server of one process. Every role serves `/health/live`, `/health/ready` and
/// `/metrics`; the ingest role adds the store notification routes (DESIGN section 3).
public struct RelayHTTPServer: Sendable {
    public struct IngestRoutes: Sendable {
        public var configuration: RelayConfiguration
        public var producer: any RecordProducer

        public init(configuration: RelayConfiguration, producer: any RecordProducer) {
            self.configuration = configuration
            self.producer = producer
        }
    }

    public var listen: ListenAddress
    public var health: HealthState
    public var registry: PrometheusCollectorRegistry
    public var ingest: IngestRoutes?
    public var logger: Logger

    public init(listen: ListenAddress, health: HealthState, registry: PrometheusCollectorRegistry, ingest: IngestRoutes?, logger: Logger) {
        self.listen = listen
        self.health = health
        self.registry = registry
        self.ingest = ingest
        self.logger = logger
    }

    /// The server as a `Service`. `onListening` receives the bound port (useful with port 0).
    public func makeService(onListening: @escaping @Sendable (Int) async -> Void = { _ in }) -> some ApplicationProtocol {
        let router = Router()
        router.add(middleware: MethodNotAllowed(ingest: ingest != nil))
        addOperationalRoutes(router)
        if let ingest {
            let handler = NotificationIngest(
                configuration: ingest.configuration, producer: ingest.producer, health: health,
                metrics: IngestMetrics(factory: PrometheusMetricsFactory(registry: registry)), logger: logger)
            handler.addRoutes(to: router)
        }
        let listen = self.listen
        return Application(
            router: router,
            configuration: .init(address: .hostname(listen.host, port: listen.port), serverName: nil),
            onServerRunning: { channel in await onListening(channel.localAddress?.port ?? listen.port) },
            logger: logger
        )
    }

    private func addOperationalRoutes(_ router: Router<BasicRequestContext>) {
        let health = self.health
        let registry = self.registry
        router.get("/health/live") { _, _ in
            jsonResponse(.ok, ["status": "live"])
        }
        router.get("/health/ready") { _, _ in
            let reasons = health.notReadyReasons()
            if reasons.isEmpty { return jsonResponse(.ok, ["status": "ready"]) }
            return jsonResponse(.serviceUnavailable, ["status": "not_ready", "reasons": .array(reasons.map(JSON.string))])
        }
        router.get("/metrics") { _, _ in
            var buffer: [UInt8] = []
            buffer.reserveCapacity(16 * 1024)
            registry.emit(into: &buffer)
            return Response(
                status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(bytes: buffer)))
        }
    }
}

/// A JSON response with the given body.
func jsonResponse(_ status: HTTPResponse.Status, _ body: JSON) -> Response {
    Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: body.serialized())))
}

/// A route that exists but not for this method answers 405 with `Allow` (RFC 9110), not 404: a client
/// that sends GET where POST belongs learns what to fix.
struct MethodNotAllowed: RouterMiddleware {
    typealias Context = BasicRequestContext
    let ingest: Bool

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
        case "/health/live", "/health/ready", "/metrics": return [.get]
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
