import Foundation
import RelayApp
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayTestSupport
import Synchronization
import Testing

/// Every metric the Grafana dashboard and the alert rules in `deploy/` query is one the process emits
/// after a known workload: a renamed metric would otherwise leave an empty panel or an alert that never
/// fires, and nobody would notice until the incident.
@Suite struct MetricsCoverageTests {
    /// The `relay_*` series names the dashboard and the alerts use.
    static func queriedMetrics() throws -> Set<String> {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        var names = Set<String>()
        for path in ["deploy/grafana/revenue-relay-dashboard.json", "deploy/prometheus/alerts.yaml"] {
            let text = try String(contentsOfFile: root.appendingPathComponent(path).path, encoding: .utf8)
            let pattern = try NSRegularExpression(pattern: #"\brelay_[a-z0-9_]*[a-z0-9]\b"#)
            for match in pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
                names.insert(String(text[Range(match.range, in: text)!]))
            }
        }
        return names
    }

    /// The series names in a Prometheus text exposition.
    static func emitted(_ exposition: String) -> Set<String> {
        Set(exposition.split(separator: "\n").compactMap { line -> String? in
            guard !line.hasPrefix("#"), let end = line.firstIndex(where: { $0 == "{" || $0 == " " }) else { return nil }
            return String(line[..<end])
        })
    }

    @Test func everyMetricTheDashboardAndAlertsQueryIsEmittedAfterAKnownWorkload() async throws {
        let queried = try Self.queriedMetrics()
        #expect(queried.count > 20, "\(queried)")
        let emitted = try await Self.pipelineOnKafka().union(try await Self.workerAgainstAnUnreachableBackend())
        // A histogram's family name (named in prose) counts when its series are there.
        let missing = queried.filter { !emitted.contains($0) && !emitted.contains($0 + "_bucket") }.sorted()
        #expect(missing.isEmpty, "queried by deploy/ but not emitted: \(missing)")
    }

    /// All roles on Kafka: accepted, forged, unmapped and unpriced notifications, failing webhooks, and
    /// store APIs that fail.
    static func pipelineOnKafka() async throws -> Set<String> {
        let endpoint = try await TestHTTPServer { _ in TestHTTPResponse(status: 500) }
        let storeAPIs = try await TestHTTPServer { request in
            if request.path.hasSuffix("/token") {
                return TestHTTPResponse(text: #"{"access_token": "play-token", "expires_in": 3600, "token_type": "Bearer"}"#)
            }
            return TestHTTPResponse(status: 403, text: #"{"error": {"code": 403, "message": "forbidden", "type": "invalid_request_error"}}"#)
        }
        let yaml = """
            ingest: { listen: "127.0.0.1:0" }
            backend: { apiKey: "test-backend-key", database: "\(FileManager.default.temporaryDirectory.path)/\(uniqueName("metrics"))/backend.sqlite", listen: "127.0.0.1:0" }
            apps:
              - key: demo
                projectId: 1
                applicationId: 1
                google:
                  packageName: com.example.app
                  pushAudience: "https://relay.example.com/v1/notifications/google/demo"
                  pushServiceAccount: "pubsub-push@example.iam.gserviceaccount.com"
                  jwks: google/jwks.json
                  playApi: { baseUrl: "\(storeAPIs.baseURL)", tokenUrl: "\(storeAPIs.baseURL)/token", serviceAccountKey: google/service-account.json }
                stripe: { signingSecrets: ["whsec_test"], api: { baseUrl: "\(storeAPIs.baseURL)/stripe", secretKey: "rk_test_metrics" } }
                paddle: { secretKeys: ["pdl_test"] }
                products:
                  - { productId: price_pro, store: STRIPE, entitlements: [pro] }
            endpoints:
              - { id: hooks, app: demo, url: "\(endpoint.baseURL)/hooks", secrets: ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"], events: ["*"] }
            delivery: { retrySchedule: [], allowPrivateNetworks: true }
            money: { exchangeRates: exchange-rates.json }
            shutdownTimeout: 2s
            """
        let configuration = try RelayConfiguration.parse(yaml: yaml, baseDirectory: Fixtures.directory.path, environment: [:])
        let relay = try await TestRelay(configuration: configuration, log: .kafka)
        let now = Int64(Date().timeIntervalSince1970)
        func stripe(_ event: JSON) async throws -> Int {
            let body = event.text
            let signature = WebhookSigning.stripeHeader(body: Array(body.utf8), secret: "whsec_test", timestamp: now)
            return try await relay.post("/v1/notifications/stripe/demo", body: body, headers: [("Stripe-Signature", signature)]).status
        }
        func subscription(_ id: String, currency: String) -> JSON {
            [
                "id": .string("evt_\(id)"), "object": "event", "type": "customer.subscription.created", "created": .integer(now), "livemode": false,
                "data": [
                    "object": [
                        "id": .string("sub_\(id)"), "object": "subscription", "customer": "cus_1", "status": "active", "start_date": .integer(now),
                        "current_period_end": .integer(now + 2_592_000), "cancel_at_period_end": false, "livemode": false,
                        "metadata": ["app_user_id": .string("user-\(id)")],
                        "items": ["data": [["quantity": 1, "price": ["id": "price_pro", "product": "prod_pro", "unit_amount": 999, "currency": .string(currency)]]]],
                    ]
                ],
            ]
        }
        // Accepted: events, and webhooks that fail once and are dead-lettered (retrySchedule: []).
        #expect(try await stripe(subscription("usd", currency: "usd")) == 200)
        // A currency without an exchange rate.
        #expect(try await stripe(subscription("xts", currency: "xts")) == 200)
        // Forged: rejected.
        let forged = #"{"id":"evt_forged","object":"event","type":"invoice.paid","data":{"object":{"id":"in_2","subscription":"sub_evil"}}}"#
        #expect(try await relay.post("/v1/notifications/stripe/demo", body: forged, headers: [("Stripe-Signature", "t=\(now),v1=00")]).status == 200)
        // Not even shaped like a Stripe event (no signature header): refused at the ingest, never written.
        #expect(try await relay.post("/v1/notifications/stripe/demo", body: forged).status == 400)
        // A refund: the Stripe API refuses (stripe api errors, worker retries).
        let refund: JSON = [
            "id": "evt_refund", "object": "event", "type": "charge.refunded", "created": .integer(now), "livemode": false,
            "data": ["object": ["id": "ch_1", "object": "charge", "customer": "cus_1", "amount_refunded": 999, "currency": "usd", "invoice": "in_1", "refunded": true]],
        ]
        #expect(try await stripe(refund) == 200)
        // A Paddle event of a type no table maps.
        let paddle = #"{"event_id":"evt_paddle_unmapped","event_type":"address.created","occurred_at":"2030-01-01T00:00:00Z","notification_id":"ntf_1","data":{"id":"add_1"}}"#
        let paddleSignature = WebhookSigning.paddleHeader(body: Array(paddle.utf8), secret: "pdl_test", timestamp: now)
        #expect(try await relay.post("/v1/notifications/paddle/demo", body: paddle, headers: [("Paddle-Signature", paddleSignature)]).status == 200)
        // A Google notification: the Play Developer API refuses (play api errors).
        let token = GooglePushSigner().token(GooglePushSigner.claims(issuedAt: now))
        let google = String(decoding: GooglePushSigner.envelope(GooglePushSigner.developerNotification()), as: UTF8.self)
        #expect(try await relay.post("/v1/notifications/google/demo", body: google, headers: [("Authorization", "Bearer \(token)")]).status == 200)

        let needed = [
            "relay_deliveries_dead_lettered_total", "relay_exchange_rate_missing_total", "relay_notifications_rejected_total",
            "relay_stripe_api_errors_total", "relay_play_api_errors_total", "relay_notifications_unmapped_total", "relay_kafka_consumer_lag",
        ]
        let names = LockedBox<Set<String>>([])
        try await waitUntil("the workload's metrics") {
            let now = emitted(try await relay.get("/metrics").bodyText)
            names.withLock { $0 = now }
            return needed.allSatisfy(now.contains)
        }
        try await relay.stop()
        await endpoint.stop()
        await storeAPIs.stop()
        return names.value
    }

    /// An ingest and a worker on the embedded log whose remote backend answers 503.
    static func workerAgainstAnUnreachableBackend() async throws -> Set<String> {
        let backend = try await TestHTTPServer { _ in TestHTTPResponse(status: 503) }
        let relay = try await IngestAndWorker.start(backendURL: backend.baseURL)
        #expect(try await postSignedStripeSubscription(to: relay.base, http: relay.http) == 200)
        let names = LockedBox<Set<String>>([])
        try await waitUntil("the worker's retry metrics") {
            let now = emitted(try await relay.get("/metrics").bodyText)
            names.withLock { $0 = now }
            return now.contains("relay_worker_retries_total") && now.contains("relay_backend_errors_total")
        }
        try await relay.stop()
        await backend.stop()
        return names.value
    }
}
