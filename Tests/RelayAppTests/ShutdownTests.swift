import Foundation
import Glibc
import RelayCore
import RelayHTTPClient
import RelayTestSupport
import Testing

/// SIGTERM while a webhook is in flight to an endpoint that never answers. The process used to wait for
/// the transfer (up to `delivery.timeout`), overrun `shutdownTimeout`, and die with SIGILL
/// ("Cancellation took longer than allowed"). It must exit 0 within `shutdownTimeout`, and the
/// deliveries it aborted must go out after the restart.
@Suite struct ShutdownTests {
    static let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

    private func writeConfiguration(_ file: URL, endpoint: String) throws {
        try Data(
            """
            ingest: { listen: "127.0.0.1:0" }
            backend: { apiKey: "test-backend-key", database: backend.sqlite, listen: "127.0.0.1:0" }
            apps:
              - key: demo
                projectId: 1
                applicationId: 1
                stripe: { signingSecrets: ["whsec_test"] }
                products:
                  - { productId: price_pro, store: STRIPE, entitlements: [pro] }
            endpoints:
              - { id: hooks, app: demo, url: "\(endpoint)", secrets: ["\(Self.secret)"], events: ["*"] }
            delivery: { timeout: 60s, allowPrivateNetworks: true }
            shutdownTimeout: 8s
            """.utf8
        ).write(to: file)
    }

    @Test func sigtermWithAWebhookInFlightToASlowEndpointExitsZeroInTimeAndRedeliversAfterRestart() async throws {
        let executable: URL = try #require(CommandLineTests.executable, "the revenue-relay executable was not built next to the tests")
        // Accepts and never answers; keeps the connections open.
        let held = LockedBox<[Int32]>([])
        let silent = try LoopbackListener { fd in held.withLock { $0.append(fd) } }
        defer {
            silent.close()
            for fd in held.value { close(fd) }
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("relay-shutdown"))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let file = directory.appendingPathComponent("relay.yaml")
        let data = directory.appendingPathComponent("data").path
        try writeConfiguration(file, endpoint: "http://127.0.0.1:\(silent.port)/hooks")

        let first = try startChildProcess(executable, ["dev", "--config", file.path, "--data", data])
        // A failed step never leaves a child running (it would hold the data directory's lock).
        defer { first.killIfRunning() }
        guard let ingestLine = await first.line(startingWith: "ingest: ", within: .seconds(60)) else {
            first.killIfRunning()
            Issue.record("dev did not start: \(await first.result().stderr)")
            return
        }
        let ingest = String(ingestLine.dropFirst("ingest: ".count))
        let http = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(30))
        #expect(try await postSignedStripeSubscription(to: ingest, http: http) == 200)
        try await waitUntil("the webhook transfer reached the endpoint", timeout: .seconds(60)) { silent.connections.load(ordering: .relaxed) > 0 }

        let signalled = ContinuousClock.now
        first.signal(SIGTERM)
        let ended = await first.result()
        let took = ContinuousClock.now - signalled
        #expect(ended.status == 0, "\(ended.stderr.suffix(2000))")
        #expect(took < .seconds(8), "shutdown took \(took)")
        #expect(ended.stderr.contains("aborting webhook transfers still running"))

        // Restarted with an endpoint that answers: both events of the aborted deliveries go out.
        let receiver = try await TestHTTPServer { _ in TestHTTPResponse(status: 200) }
        try writeConfiguration(file, endpoint: "\(receiver.baseURL)/hooks")
        let second = try startChildProcess(executable, ["dev", "--config", file.path, "--data", data])
        defer { second.killIfRunning() }
        let restarted = await second.line(startingWith: "ingest: ", within: .seconds(60))
        try #require(restarted != nil, "dev did not restart")
        let ids: Set<String> = ["stripe:evt_shutdown:initial_purchase", "stripe:evt_shutdown:subscription_status_did_change"]
        try await waitUntil("both webhooks delivered after the restart", timeout: .seconds(60)) {
            Set(receiver.requests.compactMap { $0.headers["webhook-id"] }).isSuperset(of: ids)
        }
        #expect(receiver.requests.allSatisfy { StandardWebhooksReceiver.verify($0, secret: Self.secret) })
        second.signal(SIGTERM)
        #expect(await second.result().status == 0)
        await receiver.stop()
    }

    static func stripeEvent(now: Int64) -> String {
        let subscription: JSON = [
            "id": "sub_shutdown", "object": "subscription", "customer": "cus_1", "status": "active", "start_date": .integer(now),
            "current_period_end": .integer(now + 2_592_000), "cancel_at_period_end": false, "livemode": false,
            "metadata": ["app_user_id": "user-shutdown"],
            "items": ["data": [["quantity": 1, "price": ["id": "price_pro", "product": "prod_pro", "unit_amount": 999, "currency": "usd"]]]],
        ]
        let event: JSON = [
            "id": "evt_shutdown", "object": "event", "type": "customer.subscription.created", "created": .integer(now), "livemode": false,
            "data": ["object": subscription],
        ]
        return event.text
    }
}
