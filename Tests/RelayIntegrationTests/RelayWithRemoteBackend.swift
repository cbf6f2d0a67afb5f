import Foundation
import RelayApp
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayTestSupport

/// An ingest and a worker on the embedded log, in one process, whose backend is elsewhere (`backendURL`):
/// the worker's view of a backend it reaches over HTTP.
struct IngestAndWorker {
    let process: RelayProcess
    let run: Task<Void, any Error>
    let base: String
    let http = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(30))

    static func start(backendURL: String) async throws -> IngestAndWorker {
        var configuration = try TestRelay.configuration()
        configuration.log.kind = .embedded
        configuration.log.path = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("relay-log")).path
        configuration.backend.url = backendURL
        // A notification the backend never accepts is retried until shutdown stops it at this bound.
        configuration.shutdownTimeout = .seconds(2)
        let process = try RelayProcess(configuration: configuration, roles: [.ingest, .worker], logger: testLogger(), installSignalHandlers: false)
        let run = Task { try await process.run() }
        return IngestAndWorker(process: process, run: run, base: "http://127.0.0.1:\(await process.waitForHTTPPort())")
    }

    func get(_ path: String) async throws -> HTTPClientResponse {
        try await http.send("GET", base + path)
    }

    func stop() async throws {
        await process.triggerGracefulShutdown()
        try await run.value
    }
}

/// Posts a new Stripe subscription (`sub_shutdown` of `user-shutdown`, signed with `whsec_test`) to the
/// ingest at `ingest`; the HTTP status.
func postSignedStripeSubscription(to ingest: String, http: HTTPClient) async throws -> Int {
    let now = Int64(Date().timeIntervalSince1970)
    let body = ShutdownTests.stripeEvent(now: now)
    let signature = StripeTestEvent.signature(body, now: now)
    return try await http.send(
        "POST", ingest + "/v1/notifications/stripe/demo", headers: [("Content-Type", "application/json"), ("Stripe-Signature", signature)],
        body: Array(body.utf8)
    ).status
}
