import Foundation
import Prometheus
import RelayConfig
import RelayCore
import RelayEmbeddedLog
import RelayIngest
import RelayTestSupport
import ServiceLifecycle

/// The ingest's HTTP server alone on 127.0.0.1 (port 0), on the in-memory record log: the module's own
/// behaviour without the rest of the relay.
final class IngestServer: Sendable {
    let port: Int
    let log: EmbeddedRecordLog
    private let group: ServiceGroup
    private let task: Task<Void, any Error>

    let registry = PrometheusCollectorRegistry()

    /// - Parameters:
    ///   - ingest: more `ingest` keys, as YAML flow-mapping entries (`idleTimeout: 1s, ...`).
    ///   - apps: the `apps` list (YAML); default: `demo`, receiving Stripe.
    ///   - clock: monotonic nanoseconds for the per-client request limit.
    ///   - processedOffsets: replaces reading the worker group's offsets from the log.
    init(
        ingest: String = "", apps: String = #"[{ key: demo, projectId: 1, applicationId: 1, stripe: { signingSecrets: ["whsec_test"] } }]"#,
        clock: (@Sendable () -> UInt64)? = nil, processedOffsets: (@Sendable () throws -> [Int32: Int64])? = nil
    ) async throws {
        let yaml = """
            ingest: { listen: "127.0.0.1:0"\(ingest.isEmpty ? "" : ", " + ingest) }
            apps: \(apps)
            """
        let configuration = try RelayConfiguration.parse(yaml: yaml, baseDirectory: "/", environment: [:])
        log = try EmbeddedRecordLog.inMemory(topics: [configuration.topics.notifications], partitions: 1, logger: testLogger())
        var routes = try RelayHTTPServer.IngestRoutes(configuration, log: log)
        routes.clock = clock
        if let processedOffsets { routes.processedOffsets = processedOffsets }
        let server = RelayHTTPServer(
            listen: configuration.ingest.listen, limits: .init(configuration.ingest), health: HealthState(), registry: registry,
            ingest: routes, logger: testLogger())
        let ports = AsyncStream.makeStream(of: Int.self)
        let service = server.makeService { port in ports.continuation.yield(port) }
        group = ServiceGroup(configuration: .init(services: [service], logger: testLogger()))
        let group = self.group
        task = Task { try await group.run() }
        var iterator = ports.stream.makeAsyncIterator()
        port = await iterator.next() ?? 0
    }

    func stop() async throws {
        await group.triggerGracefulShutdown()
        try await task.value
    }
}
