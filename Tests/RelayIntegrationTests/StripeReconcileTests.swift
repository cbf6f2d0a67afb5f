import Foundation
import Logging
import RelayApp
import RelayConfig
import RelayCore
import RelayHistory
import RelayHTTPClient
import RelayTestSupport
import Testing

/// `reconcile stripe` on a whole relay (embedded log) against a fake Stripe API over real HTTP that serves
/// subscriptions and invoices (checking the key) and answers one read 429 with `Retry-After: 120`: a
/// cancellation, a renewal and an end the relay never heard of are corrected with their events (the
/// renewal with its money), once; a subscription in step is left alone.
@Suite(.serialized) struct StripeReconcileTests {
    static let stripeKey = "rk_test_reconcile_0123456789"

    final class FakeStripe: Sendable {
        let objects = LockedBox<[String: JSON]>([:])
        let throttled = LockedBox<Set<String>>([])

        func answer(_ request: TestHTTPRequest) -> TestHTTPResponse {
            guard request.headers["authorization"] == "Bearer \(StripeReconcileTests.stripeKey)" else { return TestHTTPResponse(status: 401, text: "{}") }
            guard request.method == "GET", request.path.hasPrefix("/v1/subscriptions/") || request.path.hasPrefix("/v1/invoices/") else {
                return TestHTTPResponse(status: 404, text: #"{"error": {"type": "invalid_request_error", "code": "resource_missing"}}"#)
            }
            let id = String(request.path.split(separator: "/").last ?? "")
            if throttled.withLock({ $0.remove(id) != nil }) {
                return TestHTTPResponse(status: 429, headers: [("Retry-After", "120")], text: #"{"error": {"type": "rate_limit_error"}}"#)
            }
            guard let object = objects.value[id] else {
                return TestHTTPResponse(status: 404, text: #"{"error": {"type": "invalid_request_error", "code": "resource_missing"}}"#)
            }
            return TestHTTPResponse(body: object.serialized())
        }
    }

    static func subscription(_ id: String, user: String, status: String = "active", periodEnd: Int64 = 4_000_000_000, invoice: String? = nil, cancelAtPeriodEnd: Bool = false)
        -> JSON
    {
        [
            "id": .string(id), "object": "subscription", "status": .string(status), "customer": "cus_Reconcile", "livemode": false,
            "start_date": 1_893_456_000, "current_period_start": 1_893_456_000, "current_period_end": .integer(periodEnd),
            "latest_invoice": .string(invoice ?? "in_\(id)"), "cancel_at_period_end": .bool(cancelAtPeriodEnd), "cancel_at": .null,
            "metadata": ["app_user_id": .string(user)],
            "items": ["object": "list", "data": [["id": "si_R", "quantity": 1, "price": [
                "id": "price_pro_monthly", "product": "prod_pro", "unit_amount": 999, "currency": "usd", "type": "recurring", "recurring": ["interval": "month"],
            ]]]],
        ]
    }

    static func invoice(_ id: String, subscription: String, user: String, paidAt: Int64, periodEnd: Int64) -> JSON {
        [
            "id": .string(id), "object": "invoice", "status": "paid", "subscription": .string(subscription), "billing_reason": "subscription_cycle",
            "amount_paid": 999, "currency": "usd", "livemode": false, "created": .integer(paidAt), "status_transitions": ["paid_at": .integer(paidAt)],
            "subscription_details": ["metadata": ["app_user_id": .string(user)]],
            "lines": ["data": [[
                "amount": 999, "proration": false, "period": ["start": .integer(periodEnd - 2_592_000), "end": .integer(periodEnd)],
                "price": ["id": "price_pro_monthly", "product": "prod_pro", "unit_amount": 999, "currency": "usd"],
            ]]],
        ]
    }

    @Test func missedChangesAreCorrectedOnceWithTheirEventsAndMoney() async throws {
        let stripe = FakeStripe()
        let api = try await TestHTTPServer { request in stripe.answer(request) }
        let now = Int64(Date().timeIntervalSince1970)
        let text = """
            ingest: { listen: "127.0.0.1:0", ackTimeout: 10s }
            backend: { apiKey: "test-backend-key", database: backend.sqlite, listen: "127.0.0.1:0" }
            apps:
              - key: demo
                projectId: 1
                applicationId: 1
                stripe: { signingSecrets: ["whsec_reconcile"], api: { secretKey: "\(Self.stripeKey)", baseUrl: "\(api.baseURL)" } }
                products:
                  - { productId: price_pro_monthly, store: STRIPE, entitlements: [pro] }
            money: { exchangeRates: \(Fixtures.path("exchange-rates.json")) }
            delivery: { allowPrivateNetworks: true }
            shutdownTimeout: 20s
            """
        let configuration = try AppleRelayConfiguration.parse(text, name: "stripe-reconcile")
        let relay = try await TestRelay(configuration: configuration, log: .embedded)
        let backendURL = await relay.environment.process.backendAddress.value()
        @Sendable func events(_ type: String) async throws -> [JSON] { try await relay.events(type) }
        @Sendable func distinct(_ type: String) async throws -> Int { try await relay.distinctEvents(type) }
        @Sendable func state(_ id: String) async throws -> SubscriptionState? { try await relay.state(.stripe, id) }
        // Four subscriptions reached the relay live.
        let ids = ["sub_RA", "sub_RB", "sub_RC", "sub_RD"]
        for (index, id) in ids.enumerated() {
            let body = StripeRecoverTests.event(
                "evt_Created\(index)", "customer.subscription.created", Self.subscription(id, user: "user-\(index)", periodEnd: now + 86_400), created: now - 7200
            ).serialized()
            let header = WebhookSigning.stripeHeader(body: body, secret: "whsec_reconcile", timestamp: now)
            #expect(try await relay.http.send(
                "POST", relay.baseURL + "/v1/notifications/stripe/demo", headers: [("Content-Type", "application/json"), ("Stripe-Signature", header)],
                body: body
            ).status == 200)
        }
        try await waitUntil("the purchases") { try await events("initial_purchase").count == 4 }
        // What happened at Stripe while its webhooks were lost: RA set to cancel at the period's end, RB renewed
        // (a paid invoice, a later period end), RC ended; RD is unchanged.
        let renewedEnd = now + 86_400 + 2_592_000
        stripe.objects.withLock {
            $0["sub_RA"] = Self.subscription("sub_RA", user: "user-0", periodEnd: now + 86_400, cancelAtPeriodEnd: true)
            $0["sub_RB"] = Self.subscription("sub_RB", user: "user-1", periodEnd: renewedEnd, invoice: "in_RB2")
            $0["in_RB2"] = Self.invoice("in_RB2", subscription: "sub_RB", user: "user-1", paidAt: now - 600, periodEnd: renewedEnd)
            if case .object(var ended) = Self.subscription("sub_RC", user: "user-2", status: "canceled", periodEnd: now + 86_400) {
                ended["ended_at"] = .integer(now - 300)
                ended["cancellation_details"] = ["reason": "cancellation_requested"]
                $0["sub_RC"] = .object(ended)
            }
            $0["sub_RD"] = Self.subscription("sub_RD", user: "user-3", periodEnd: now + 86_400)
        }
        stripe.throttled.withLock { $0 = ["sub_RD"] }
        let waits = LockedBox<[Duration]>([])
        var commands = try StripeHistoryCommands(
            configuration: configuration, appKey: "demo", producer: try relay.environment.process.log.producer, backendURL: backendURL,
            logger: Logger(label: "test"))
        commands.pacing = HistoryLoop.Pacing(waits: [.milliseconds(1)], maximumRetryAfter: .seconds(600)) { wait in waits.withLock { $0.append(wait) } }
        let summary = try await commands.reconcile(since: nil)
        #expect(summary.checked == 4)
        #expect(summary.inSync == 1)
        #expect(summary.failures.isEmpty, "\(summary.failures)")
        #expect(Dictionary(uniqueKeysWithValues: summary.corrections.map { ($0.originalTransactionId, $0.action) }) == [
            "sub_RA": "customer.subscription.updated", "sub_RB": "invoice.paid, customer.subscription.updated", "sub_RC": "customer.subscription.deleted",
        ])
        #expect(waits.value == [.seconds(120)], "\(waits.value)")
        // Again, racing the worker: nothing new is found, whichever corrections it applied meanwhile.
        try await relay.reconcileAgain(after: summary, ended: (.stripe, "sub_RC")) { try await commands.reconcile(since: nil) }

        try await waitUntil("the missed events") {
            let cancellations = try await distinct("cancellation")
            let renewals = try await distinct("renewal")
            let expirations = try await distinct("expiration")
            return cancellations == 1 && renewals == 1 && expirations == 1
        }
        let renewal = try #require(try await events("renewal").first)
        #expect(renewal["data"]?["transactionId"] == "in_RB2")
        #expect(renewal["data"]?["price"]?.doubleValue == 9.99, "\(renewal)")
        #expect(try await events("cancellation").first?["data"]?["originalTransactionId"] == "sub_RA")
        #expect(try await events("expiration").first?["data"]?["originalTransactionId"] == "sub_RC")
        try await waitUntil("the states") {
            let a = try await state("sub_RA")
            let b = try await state("sub_RB")
            let c = try await state("sub_RC")
            return a?.autoRenew == false && b?.expiresAt == renewedEnd * 1000 && c?.status == .expired
        }
        // Both runs processed: each missed event is on the events topic once, whatever the second run appended.
        try await relay.waitForWorker()
        for type in ["cancellation", "renewal", "expiration"] {
            #expect(try await events(type).count == 1, "\(type) once")
        }
        // A record that names one subscription as another's subject is refused (it would write one over the other).
        _ = try await relay.environment.process.log.producer.produce(
            RawNotification(
                store: .stripe, app: "demo", receivedAtMilliseconds: now * 1000,
                body: JSON.object(["objectId": "sub_RA", "subject": "sub_RD", "reconcile": "forged"]).serialized(), requestHeaders: [:],
                source: RawNotification.stripeAPISource
            ).record(topic: configuration.topics.notifications, subject: "sub_RD"))
        try await waitUntil("the rejection") {
            String(decoding: try await relay.get("/metrics").body, as: UTF8.self).contains(#"reason="malformed""#)
        }
        // Only the renewal's payment was lost (the subscription's update arrived): reconcile finds the invoice.
        let lostEnd = now + 86_400 + 2 * 2_592_000
        stripe.objects.withLock {
            $0["sub_RD"] = Self.subscription("sub_RD", user: "user-3", periodEnd: lostEnd, invoice: "in_RD2")
            $0["in_RD2"] = Self.invoice("in_RD2", subscription: "sub_RD", user: "user-3", paidAt: now - 60, periodEnd: lostEnd)
        }
        let update = StripeRecoverTests.event(
            "evt_RD_updated", "customer.subscription.updated", stripe.objects.value["sub_RD"]!, created: now - 30,
            previous: ["current_period_end": .integer(now + 86_400)]
        ).serialized()
        #expect(try await relay.http.send(
            "POST", relay.baseURL + "/v1/notifications/stripe/demo",
            headers: [("Content-Type", "application/json"), ("Stripe-Signature", WebhookSigning.stripeHeader(body: update, secret: "whsec_reconcile", timestamp: now))],
            body: update
        ).status == 200)
        try await waitUntil("the update applied") { try await state("sub_RD")?.expiresAt == lostEnd * 1000 }
        let lost = try await commands.reconcile(since: nil)
        #expect(lost.corrections.map(\.action) == ["invoice.paid"], "\(lost.corrections)")
        try await waitUntil("the lost renewal") { try await distinct("renewal") == 2 }

        // In step now: nothing is appended (RC has ended and is no longer listed).
        let appended = try await relay.records(topic: configuration.topics.notifications).count
        let again = try await commands.reconcile(since: nil)
        #expect(again.corrections.isEmpty, "\(again.corrections)")
        #expect(again.checked == 3)
        #expect(try await relay.records(topic: configuration.topics.notifications).count == appended)
        #expect(try await distinct("renewal") == 2)
        try await relay.stop()
        await api.stop()
    }
}
