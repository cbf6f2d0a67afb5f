import CoreMetrics
import Glibc
import RelayConfig
import Foundation
import RelayApp
import RelayBackend
import RelayCore
import RelayEmbeddedLog
import RelayHTTPClient
import RelayTestSupport
import RelayWorker
import ServiceLifecycle
import Synchronization
import Testing

/// The worker: consumes raw notifications, whoever produced them, with at-least-once semantics.
@Suite struct WorkerTests {
    @Test func rejectedNotificationsLandInTheRejectedTopicWithTheirReasonAndAcceptedOnesDoNot() async throws {
        let relay = try await TestRelay(configuration: try TestRelay.configuration())
        let body = #"{"id":"evt_ok","object":"event","type":"invoice.paid","data":{"object":{"id":"in_1","subscription":"sub_ok"}}}"#
        let now = Int64(Date().timeIntervalSince1970)
        let good = WebhookSigning.stripeHeader(body: Array(body.utf8), secret: "whsec_test", timestamp: now)
        #expect(try await relay.post("/v1/notifications/stripe/demo", body: body, headers: [("Stripe-Signature", good)]).status == 200)
        let forged = #"{"id":"evt_bad","object":"event","type":"invoice.paid","data":{"object":{"id":"in_2","subscription":"sub_bad"}}}"#
        #expect(try await relay.post("/v1/notifications/stripe/demo", body: forged, headers: [("Stripe-Signature", good)]).status == 200)

        // From another producer: one with the relay headers (any producer may write raw notifications),
        // one without them at all.
        let producer = try relay.environment.process.log.producer
        let paddle = RawNotification(
            store: .paddle, app: "demo", receivedAtMilliseconds: now * 1000, body: Array(#"{"event_id":"evt_p"}"#.utf8),
            requestHeaders: ["paddle-signature": "ts=\(now);h1=00"])
        _ = try await producer.produce(paddle.record(topic: "relay.notifications"))
        _ = try await producer.produce(OutgoingRecord(topic: "relay.notifications", key: Array("foreign".utf8), value: Array("{}".utf8), headers: []))

        try await waitUntil("the worker judged all four") {
            let metrics = try await relay.get("/metrics").bodyText
            return metrics.contains(#"relay_notifications_accepted_total{store="stripe",app="demo"} 1"#)
                && metrics.contains(#"relay_notifications_rejected_total{store="stripe",app="demo",reason="bad_signature"} 1"#)
                && metrics.contains(#"relay_notifications_rejected_total{store="paddle",app="demo",reason="bad_signature"} 1"#)
                && metrics.contains(#"relay_notifications_rejected_total{store="unknown",app="unknown",reason="malformed"} 1"#)
        }
        // Each rejected record is acknowledged before its counter moves, so the counters say exactly
        // what the topic holds: three rejects, and nothing for the accepted notification.
        let metrics = try await relay.get("/metrics").bodyText
        let rejectedTotal = metrics.split(separator: "\n").filter { $0.hasPrefix("relay_notifications_rejected_total{") }
            .compactMap { Int($0.split(separator: " ").last ?? "") }.reduce(0, +)
        #expect(rejectedTotal == 3)
        #expect(metrics.contains(#"relay_kafka_consumed_total{topic="relay.notifications"} 4"#))
        let (reader, collector) = try relay.reader(topic: "relay.notifications.rejected")
        let rejected = try await collector.waitFor(count: 3)
        #expect(Set(rejected.compactMap(\.keyString)) == ["stripe:sub_bad", "paddle:evt_p", "foreign"])
        let byKey = Dictionary(uniqueKeysWithValues: rejected.map { ($0.keyString ?? "", $0) })
        let stripe = try #require(byKey["stripe:sub_bad"])
        #expect(text(stripe.value) == forged)
        #expect(stripe.headers.first(named: "relay-reject-reason")?.stringValue == "bad_signature")
        #expect(stripe.headers.first(named: "relay-reject-detail")?.stringValue?.contains("stripe-signature") == true)
        #expect(stripe.headers.first(named: "stripe-signature")?.stringValue == good)
        #expect(stripe.headers.first(named: "relay-app")?.stringValue == "demo")
        #expect(byKey["foreign"]?.headers.first(named: "relay-reject-reason")?.stringValue == "malformed")
        #expect(byKey["paddle:evt_p"]?.headers.first(named: "relay-reject-reason")?.stringValue == "bad_signature")
        await reader.close()
        try await relay.stop()
    }
}

@Suite struct NormalizationFlowTests {
    @Test func aPostedNotificationYieldsEventsOnRelayEventsAndEntitlementsInTheBackend() async throws {
        let relay = try await TestRelay(configuration: try TestRelay.configuration())
        let now = Int64(Date().timeIntervalSince1970)
        let subscription: JSON = [
            "id": "sub_flow", "object": "subscription", "customer": "cus_1", "status": "active", "start_date": .integer(now),
            "current_period_end": .integer(now + 2_592_000), "cancel_at_period_end": false, "livemode": false,
            "metadata": ["app_user_id": "user-flow"],
            "items": ["data": [["quantity": 1, "price": ["id": "price_pro", "product": "prod_pro", "unit_amount": 999, "currency": "usd"]]]],
        ]
        let event: JSON = [
            "id": "evt_flow_1", "object": "event", "type": "customer.subscription.created", "created": .integer(now), "livemode": false,
            "data": ["object": subscription],
        ]
        let body = event.text
        let signature = WebhookSigning.stripeHeader(body: Array(body.utf8), secret: "whsec_test", timestamp: now)
        #expect(try await relay.post("/v1/notifications/stripe/demo", body: body, headers: [("Stripe-Signature", signature)]).status == 200)

        let (reader, collector) = try relay.reader(topic: "relay.events")
        let records = try await collector.waitFor(count: 2)
        #expect(records.map(\.keyString) == ["sub_flow", "sub_flow"])
        let payloads = records.compactMap { try? JSON.parse($0.value) }
        #expect(payloads.map { $0["type"]?.stringValue } == ["initial_purchase", "subscription_status_did_change"])
        #expect(payloads.first?["data"]?["id"] == "stripe:evt_flow_1:initial_purchase")
        #expect(payloads.first?["data"]?["price"] == 9.99)
        #expect(payloads.first?["data"]?["store"] == "STRIPE")
        #expect(payloads.first?["data"]?["originalAppUserId"] == "user-flow")
        #expect(records.first?.headers.first(named: "relay-event-id")?.stringValue == "stripe:evt_flow_1:initial_purchase")
        #expect(records.first?.headers.first(named: "relay-event-type")?.stringValue == "initial_purchase")

        // Fan-out: each event to the endpoint that takes every type (not to the renewals-only one),
        // keyed by endpoint and subject, produced before the notification's offset was stored.
        let (deliveryReader, deliveries) = try relay.reader(topic: "relay.deliveries")
        let delivered = try await deliveries.waitFor(count: 2)
        #expect(delivered.map(\.keyString) == ["hooks:sub_flow", "hooks:sub_flow"])
        #expect(delivered.map(\.value) == records.map(\.value))
        #expect(delivered.compactMap { $0.headers.first(named: "relay-endpoint")?.stringValue } == ["hooks", "hooks"])
        await deliveryReader.close()

        // The backend follows: the state is stored and the user has `pro`.
        let client = relay.environment.process.backendClient
        let stored = try #require(try await client.subscription(store: .stripe, originalTransactionId: "sub_flow"))
        #expect(stored.status == .active)
        #expect(stored.version == 1)
        let entitlements = try await client.entitlements(appUserId: "user-flow")
        #expect(entitlements?["entitlements"] == [["identifier": "pro", "type": "SERVICE_LEVEL"]])

        // Stripe sends the event again: the same events (same ids), and the state does not move.
        #expect(try await relay.post("/v1/notifications/stripe/demo", body: body, headers: [("Stripe-Signature", signature)]).status == 200)
        let again = try await collector.waitFor(count: 4)
        #expect(again.suffix(2).map(\.value) == records.map(\.value))
        #expect(try await client.subscription(store: .stripe, originalTransactionId: "sub_flow")?.version == 1)
        await reader.close()
        try await relay.stop()
    }
}

/// The process's local backend (dev runs it) serves the backend client at the address it publishes.
@Suite struct LocalBackendRoleTests {
    @Test func devRunsTheLocalBackendAndTheWorkersClientReadsAndUpdatesState() async throws {
        let relay = try await TestRelay(configuration: try TestRelay.configuration())
        let address = await relay.environment.process.backendAddress.value()
        #expect(address.hasPrefix("http://127.0.0.1:"))
        let client = relay.environment.process.backendClient
        let state = SubscriptionState(
            store: .stripe, originalTransactionId: "sub_1", applicationId: 1, originalAppUserId: "u1", productId: "price_1", status: .active,
            sourceTimestamp: 1)
        let outcome = try await client.update(store: .stripe, originalTransactionId: "sub_1") { _ in state }
        guard case .updated(nil, let stored) = outcome else { Issue.record("\(outcome)"); return }
        #expect(stored.version == 1)
        #expect(try await client.subscription(store: .stripe, originalTransactionId: "sub_1") == stored)
        try await relay.stop()
    }
}

/// A second process whose addresses are taken fails before opening anything, naming the key.
@Suite struct ListenAddressTests {
    @Test func takenIngestAndBackendAddressesAreConfigurationErrorsNamingTheirKeys() async throws {
        let holder = try LoopbackListener { Glibc.close($0) }
        defer { holder.close() }
        var configuration = try TestRelay.configuration()
        configuration.ingest.listen = ListenAddress(host: "127.0.0.1", port: holder.port)
        #expect(throws: RelaySetupError.self) {
            try RelayProcess(configuration: configuration, roles: [.ingest], logger: testLogger(), installSignalHandlers: false)
        }
        do {
            _ = try RelayProcess(configuration: configuration, roles: [.ingest], logger: testLogger(), installSignalHandlers: false)
        } catch .configuration(let error) {
            #expect(error.key == "ingest.listen")
            #expect(error.message.contains("127.0.0.1:\(holder.port)"))
        } catch {
            Issue.record("\(error)")
        }
        configuration.ingest.listen = ListenAddress(host: "127.0.0.1", port: 0)
        configuration.backend.listen = ListenAddress(host: "127.0.0.1", port: holder.port)
        do {
            _ = try RelayProcess(configuration: configuration, roles: [.backend], logger: testLogger(), installSignalHandlers: false)
            Issue.record("a taken backend.listen must fail")
        } catch .configuration(let error) {
            #expect(error.key == "backend.listen")
        } catch {
            Issue.record("\(error)")
        }
    }
}

/// A worker whose backend is elsewhere and unreachable (or refuses its key) cannot finish any
/// notification: readiness says so after `BackendClient.readinessGrace`, and says ready again once the
/// backend answers.
@Suite struct BackendReadinessTests {
    @Test func aWorkerWhoseBackendIsUnreachableIsNotReadyUntilItAnswersAgain() async throws {
        // The status every backend call gets: unavailable, then answering, then refusing the key.
        let status = Atomic<Int>(503)
        let backend = try await TestHTTPServer { _ in TestHTTPResponse(status: status.load(ordering: .relaxed)) }
        let relay = try await IngestAndWorker.start(backendURL: backend.baseURL)
        try await waitUntil("ready") { try await relay.get("/health/ready").status == 200 }
        #expect(try await postSignedStripeSubscription(to: relay.base, http: relay.http) == 200)
        try await waitUntil("not ready") { try await relay.get("/health/ready").status == 503 }
        let notReady = try await relay.get("/health/ready")
        #expect(notReady.bodyText.contains("backend_unreachable"), "\(notReady.bodyText)")

        status.store(404, ordering: .relaxed)
        try await waitUntil("ready again") { try await relay.get("/health/ready").status == 200 }
        // A refused API key (the notification is still retried, so calls go on): not ready, saying why.
        status.store(401, ordering: .relaxed)
        try await waitUntil("not ready: unauthorized") {
            try await relay.get("/health/ready").bodyText.contains("backend_unauthorized")
        }
        try await relay.stop()
        await backend.stop()
    }
}
