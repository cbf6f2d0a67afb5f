import Foundation
import RelayApp
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayTestSupport
import Testing

/// Stripe and Paddle purchases an app hands over (`{"store": "STRIPE", "checkoutSessionId" | "subscriptionId"}`,
/// `{"store": "PADDLE", "transactionId"}`) on a whole relay (embedded log), against fake Stripe and Paddle
/// APIs over real HTTP that answer with the objects the stores' own webhooks carry and check each request's
/// key; then the stores' own signed notifications of the same purchases: one purchase event each.
@Suite(.serialized) struct WebPurchaseTests {
    static let publicKey = "pk_demo_web_0123456789"
    static let stripeKey = "sk_test_relay_0123456789"
    static let paddleKey = "pdl_apikey_relay_0123456789"
    /// Another app on the same Stripe account.
    static let otherKey = "pk_other_web_0123456789"

    static let stripeSubscription: JSON = [
        "id": "sub_1Web0001", "object": "subscription", "billing_cycle_anchor": 1893456000, "cancel_at": nil, "cancel_at_period_end": false,
        "canceled_at": nil, "collection_method": "charge_automatically", "created": 1893456000, "currency": "usd",
        "current_period_start": 1893456000, "current_period_end": 4_000_000_000, "customer": "cus_Web0001", "discount": nil, "discounts": [],
        "ended_at": nil, "latest_invoice": "in_1Web0001", "livemode": false, "metadata": [:], "start_date": 1893456000, "status": "active",
        "trial_end": nil,
        "items": ["object": "list", "data": [[
            "id": "si_Web0001", "object": "subscription_item", "quantity": 1,
            "price": ["id": "price_pro_monthly", "object": "price", "currency": "usd", "product": "prod_pro", "type": "recurring", "unit_amount": 999,
                      "recurring": ["interval": "month", "interval_count": 1]],
        ]]],
    ]

    /// A second subscription as Stripe answers it months later: renewed since (its latest invoice is not its first).
    static var renewedSubscription: JSON {
        guard case .object(var members) = stripeSubscription else { return stripeSubscription }
        members["id"] = "sub_1Web0002"
        members["latest_invoice"] = "in_1Web0009"
        return .object(members)
    }

    static let stripeSessions: [String: JSON] = [
        "cs_test_sub": [
            "id": "cs_test_sub", "object": "checkout.session", "mode": "subscription", "status": "complete", "payment_status": "paid",
            "subscription": "sub_1Web0001", "livemode": false, "metadata": [:], "customer_details": ["email": "kim@example.com"],
        ],
        "cs_test_pay": [
            "id": "cs_test_pay", "object": "checkout.session", "mode": "payment", "status": "complete", "payment_status": "paid",
            "payment_intent": "pi_3Web0001", "amount_total": 4999, "currency": "usd", "livemode": false, "created": 1893455900,
            "metadata": ["price_id": "price_lifetime"], "total_details": ["amount_tax": 0],
            "customer_details": ["email": "kim@example.com", "name": "Kim Lee", "address": ["country": "US", "city": "Seattle"]],
        ],
        "cs_test_open": ["id": "cs_test_open", "object": "checkout.session", "mode": "payment", "status": "open", "payment_status": "unpaid"],
    ]

    static let paddleTransactions: [String: JSON] = [
        "txn_web_sub": [
            "id": "txn_web_sub", "status": "completed", "origin": "web", "subscription_id": "sub_web_paddle", "customer_id": "ctm_web",
            "currency_code": "USD", "custom_data": nil,
            "billing_details": ["enable_checkout": false, "purchase_order_number": "PO-Kim-Lee-4242"],
            "payments": [["payment_method_id": "paymtd_1", "method_details": ["type": "card", "card": ["type": "visa", "last4": "4242", "cardholder_name": "Kim Lee"]]]],
        ],
        "txn_web_once": [
            "id": "txn_web_once", "status": "completed", "origin": "web", "subscription_id": nil, "customer_id": "ctm_web", "currency_code": "USD",
            "custom_data": nil, "billed_at": "2030-01-01T00:00:00Z",
            "items": [["price": ["id": "pri_coins", "product_id": "pro_coins", "unit_price": ["amount": "499", "currency_code": "USD"]], "quantity": 1]],
            "details": ["totals": ["subtotal": "499", "tax": "0", "discount": "0", "total": "499", "grand_total": "499", "fee": "50", "earnings": "449", "currency_code": "USD"],
                        "line_items": [["id": "txnitm_once", "price_id": "pri_coins", "totals": ["subtotal": "499", "tax": "0", "total": "499"]]]],
        ],
        "txn_draft": ["id": "txn_draft", "status": "draft", "origin": "web"],
    ]

    static let paddleSubscription: JSON = [
        "id": "sub_web_paddle", "status": "active", "customer_id": "ctm_web", "currency_code": "USD", "started_at": "2030-01-01T00:00:00Z",
        "first_billed_at": "2030-01-01T00:00:00Z", "next_billed_at": "2099-02-01T00:00:00Z", "paused_at": nil, "canceled_at": nil, "discount": nil,
        "current_billing_period": ["starts_at": "2030-01-01T00:00:00Z", "ends_at": "2099-02-01T00:00:00Z"], "scheduled_change": nil,
        "billing_cycle": ["interval": "month", "frequency": 1], "custom_data": nil,
        "items": [[
            "status": "active", "quantity": 1, "recurring": true, "trial_dates": nil,
            "price": ["id": "pri_pro_monthly", "product_id": "pro_pro", "billing_cycle": ["interval": "month", "frequency": 1], "trial_period": nil,
                      "unit_price": ["amount": "999", "currency_code": "USD"]],
        ]],
    ]

    struct Harness {
        let relay: TestRelay
        let backendURL: String
        let stripe: TestHTTPServer
        let paddle: TestHTTPServer

        func hand(_ user: String, _ body: JSON, key: String = WebPurchaseTests.publicKey) async throws -> (Int, JSON) {
            let response = try await relay.http.send(
                "POST", backendURL + "/subscriptions-api/public/v1/users/\(user)/purchases",
                headers: [("Authorization", "Bearer \(key)"), ("Content-Type", "application/json")], body: body.serialized())
            return (response.status, (try? JSON.parse(response.body)) ?? .null)
        }

        func events(_ type: String) async throws -> [JSON] {
            try await relay.settledEvents(type)
        }

        func state(_ store: Store, _ id: String) async throws -> SubscriptionState? {
            let response = try await relay.http.send(
                "GET", backendURL + "/subscriptions-api/internal/v1/subscriptions/\(store.rawValue)/\(id)", headers: [("Authorization", "Bearer test-backend-key")])
            guard response.status == 200 else { return nil }
            return try SubscriptionState(json: try JSON.parse(response.body))
        }

        /// The store's own notification, signed as the store signs it, through the ingest.
        func notify(_ store: Store, _ event: JSON) async throws {
            let body = event.serialized()
            let now = Int64(Date().timeIntervalSince1970)
            let header = store == .stripe
                ? ("Stripe-Signature", WebhookSigning.stripeHeader(body: body, secret: "whsec_web_test", timestamp: now))
                : ("Paddle-Signature", WebhookSigning.paddleHeader(body: body, secret: "pdl_ntfset_web_test", timestamp: now))
            let response = try await relay.http.send(
                "POST", relay.baseURL + "/v1/notifications/\(store.rawValue)/demo", headers: [("Content-Type", "application/json"), header], body: body)
            #expect(response.status == 200)
        }

        func stop() async throws {
            try await relay.stop()
            await stripe.stop()
            await paddle.stop()
        }
    }

    static func start() async throws -> Harness {
        let stripe = try await TestHTTPServer { request in
            guard request.method == "GET", request.headers["authorization"] == "Bearer \(WebPurchaseTests.stripeKey)",
                request.headers["stripe-version"] == "2024-06-20"
            else { return TestHTTPResponse(status: 401, text: #"{"error": {"type": "invalid_request_error"}}"#) }
            if request.path == "/v1/subscriptions/sub_1Web0001" { return TestHTTPResponse(body: Self.stripeSubscription.serialized()) }
            if request.path == "/v1/subscriptions/sub_1Web0002" { return TestHTTPResponse(body: Self.renewedSubscription.serialized()) }
            if request.path == "/v1/subscriptions/sub_1WebNamed", case .object(var named) = Self.stripeSubscription {
                named["id"] = "sub_1WebNamed"
                named["metadata"] = ["app_user_id": "user-named"]
                return TestHTTPResponse(body: JSON.object(named).serialized())
            }
            if request.path.hasPrefix("/v1/checkout/sessions/"), let session = Self.stripeSessions[String(request.path.dropFirst("/v1/checkout/sessions/".count))] {
                return TestHTTPResponse(body: session.serialized())
            }
            return TestHTTPResponse(status: 404, text: #"{"error": {"type": "invalid_request_error", "code": "resource_missing"}}"#)
        }
        let paddle = try await TestHTTPServer { request in
            guard request.method == "GET", request.headers["authorization"] == "Bearer \(WebPurchaseTests.paddleKey)" else {
                return TestHTTPResponse(status: 403, text: #"{"error": {"type": "request_error", "code": "forbidden"}}"#)
            }
            if request.path == "/subscriptions/sub_web_paddle" {
                return TestHTTPResponse(body: JSON.object(["data": Self.paddleSubscription, "meta": ["request_id": "r1"]]).serialized())
            }
            if request.path.hasPrefix("/transactions/"), let transaction = Self.paddleTransactions[String(request.path.dropFirst("/transactions/".count))] {
                return TestHTTPResponse(body: JSON.object(["data": transaction, "meta": ["request_id": "r2"]]).serialized())
            }
            return TestHTTPResponse(status: 404, text: #"{"error": {"type": "request_error", "code": "not_found"}}"#)
        }
        let text = """
            ingest: { listen: "127.0.0.1:0", ackTimeout: 10s }
            backend: { apiKey: "test-backend-key", database: backend.sqlite, listen: "127.0.0.1:0" }
            apps:
              - key: demo
                projectId: 1
                applicationId: 1
                publicApiKeys: ["\(publicKey)"]
                stripe: { signingSecrets: ["whsec_web_test"], api: { secretKey: "\(stripeKey)", baseUrl: "\(stripe.baseURL)" } }
                paddle: { secretKeys: ["pdl_ntfset_web_test"], environment: SANDBOX, api: { apiKey: "\(paddleKey)", baseUrl: "\(paddle.baseURL)" } }
                products:
                  - { productId: price_pro_monthly, store: STRIPE, entitlements: [pro] }
                  - { productId: price_lifetime, store: STRIPE, entitlements: [lifetime] }
                  - { productId: pri_pro_monthly, store: PADDLE, entitlements: [pro] }
                  - { productId: pri_coins, store: PADDLE, entitlements: [coins] }
              - key: other
                projectId: 1
                applicationId: 2
                publicApiKeys: ["\(otherKey)"]
                stripe: { signingSecrets: ["whsec_web_other"], api: { secretKey: "\(stripeKey)", baseUrl: "\(stripe.baseURL)" } }
                products:
                  - { productId: price_pro_monthly, store: STRIPE, entitlements: [pro] }
            money: { exchangeRates: \(Fixtures.path("exchange-rates.json")) }
            delivery: { allowPrivateNetworks: true }
            shutdownTimeout: 20s
            """
        let relay = try await TestRelay(configuration: try AppleRelayConfiguration.parse(text, name: "web-purchases"), log: .embedded)
        return Harness(relay: relay, backendURL: await relay.environment.process.backendAddress.value(), stripe: stripe, paddle: paddle)
    }

    static func entitlements(_ answer: JSON) -> [String] {
        answer["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } ?? []
    }

    @Test func aStripeSubscriptionHandedOverThenStripesOwnEventSendOneInitialPurchase() async throws {
        let harness = try await Self.start()
        let (status, answer) = try await harness.hand("user-1", ["store": "STRIPE", "checkoutSessionId": "cs_test_sub"])
        #expect(status == 200, "\(answer)")
        #expect(Self.entitlements(answer) == ["pro"], "\(answer)")
        // Read with the app's key: the session, then its subscription (by the route, then by the worker).
        #expect(harness.stripe.requests.map(\.path).contains("/v1/checkout/sessions/cs_test_sub"))
        #expect(harness.stripe.requests.map(\.path).contains("/v1/subscriptions/sub_1Web0001"))
        #expect(try await harness.state(.stripe, "sub_1Web0001")?.originalAppUserId == "user-1")
        // Stripe's own event of the same subscription.
        try await harness.notify(.stripe, [
            "id": "evt_1Web0001", "object": "event", "api_version": "2024-06-20", "type": "customer.subscription.created", "created": 1893456000,
            "livemode": false, "data": ["object": Self.stripeSubscription],
        ])
        try await waitUntil("Stripe's event applied") { try await harness.state(.stripe, "sub_1Web0001")?.recentNotifications.count == 2 }
        let purchases = try await harness.events("initial_purchase")
        #expect(purchases.count == 1, "\(purchases)")
        #expect(purchases.first?["data"]?["price"]?.doubleValue == 9.99)
        #expect(purchases.first?["data"]?["originalAppUserId"] == "user-1")
        // Handed over again, by subscription id: nothing new.
        #expect(try await harness.hand("user-1", ["store": "STRIPE", "subscriptionId": "sub_1Web0001"]).0 == 200)
        #expect(try await harness.events("initial_purchase").count == 1)
        try await harness.stop()
    }

    @Test func aRestoreOfASubscriptionTheRelayHoldsIsNoNewPurchase() async throws {
        let harness = try await Self.start()
        // Stripe's event when it was bought (its first invoice), then a restore months later: Stripe's API now
        // answers the subscription with its latest invoice, which is no purchase.
        guard case .object(var bought) = Self.renewedSubscription else { return }
        bought["latest_invoice"] = "in_1Web0001"
        try await harness.notify(.stripe, [
            "id": "evt_1Web0002", "object": "event", "type": "customer.subscription.created", "created": 1893456000, "livemode": false,
            "data": ["object": .object(bought)],
        ])
        try await waitUntil("Stripe's event applied") { try await harness.state(.stripe, "sub_1Web0002") != nil }
        let (status, answer) = try await harness.hand("user-6", ["store": "STRIPE", "subscriptionId": "sub_1Web0002"])
        #expect(status == 200, "\(answer)")
        #expect(Self.entitlements(answer) == ["pro"])
        #expect(try await harness.events("initial_purchase").count == 1)
        try await harness.stop()
    }

    @Test func aStripePaymentHandedOverThenStripesCheckoutEventSendOnePurchaseWithoutTheCustomersDetails() async throws {
        let harness = try await Self.start()
        let (status, answer) = try await harness.hand("user-2", ["store": "STRIPE", "checkoutSessionId": "cs_test_pay"])
        #expect(status == 200, "\(answer)")
        #expect(Self.entitlements(answer) == ["lifetime"])
        try await harness.notify(.stripe, [
            "id": "evt_1WebPay01", "object": "event", "type": "checkout.session.completed", "created": 1893456000, "livemode": false,
            "data": ["object": Self.stripeSessions["cs_test_pay"]!],
        ])
        try await waitUntil("Stripe's event applied") { try await harness.state(.stripe, "pi_3Web0001")?.recentNotifications.count == 2 }
        let purchases = try await harness.events("non_renewing_purchase")
        #expect(purchases.count == 1, "\(purchases)")
        #expect(purchases.first?["data"]?["price"]?.doubleValue == 49.99)
        // What the worker recorded of Stripe's answer has no e-mail or name.
        let stored = try #require(try await harness.state(.stripe, "pi_3Web0001"))
        let recorded = String(decoding: stored.json.serialized(), as: UTF8.self)
        #expect(!recorded.contains("kim@example.com") && !recorded.contains("Kim Lee"), "\(recorded)")
        try await harness.stop()
    }

    @Test func aWebPurchaseIdIsNoKeyToAnotherUsersOrAnotherAppsPurchase() async throws {
        let harness = try await Self.start()
        // Stripe names the subscription's user: another user's hand-over is refused even under transfer (a
        // Checkout Session's id is in a URL, a subscription's on a receipt).
        let (refused, answer) = try await harness.hand("user-thief", ["store": "STRIPE", "subscriptionId": "sub_1WebNamed"])
        #expect(refused == 409, "\(answer)")
        #expect(answer["error"] == "owned_by_another_user")
        #expect(!String(decoding: answer.serialized(), as: UTF8.self).contains("user-named"))
        #expect(try await harness.hand("user-named", ["store": "STRIPE", "subscriptionId": "sub_1WebNamed"]).0 == 200)
        // Another app on the same Stripe account cannot take this app's subscription.
        #expect(try await harness.hand("user-1", ["store": "STRIPE", "subscriptionId": "sub_1Web0001"]).0 == 200)
        let (status, other) = try await harness.hand("user-2", ["store": "STRIPE", "subscriptionId": "sub_1Web0001"], key: Self.otherKey)
        #expect(status == 400, "\(other)")
        #expect(other["reason"] == "unknown_app")
        #expect(try await harness.state(.stripe, "sub_1Web0001")?.applicationId == 1)
        #expect(try await harness.state(.stripe, "sub_1Web0001")?.originalAppUserId == "user-1")
        try await harness.stop()
    }

    @Test func unknownOrUnfinishedWebPurchasesAreRefusedWithTheReason() async throws {
        let harness = try await Self.start()
        var (status, answer) = try await harness.hand("user-3", ["store": "STRIPE", "subscriptionId": "sub_of_another_account"])
        #expect(status == 400)
        #expect(answer["reason"] == "purchase_not_found", "\(answer)")
        (status, answer) = try await harness.hand("user-3", ["store": "STRIPE", "checkoutSessionId": "cs_test_open"])
        #expect(status == 400)
        #expect(answer["reason"] == "not_completed", "\(answer)")
        (status, answer) = try await harness.hand("user-3", ["store": "STRIPE", "checkoutSessionId": "cs_test_sub", "subscriptionId": "sub_1Web0001"])
        #expect(status == 400)
        (status, answer) = try await harness.hand("user-3", ["store": "PADDLE", "transactionId": "txn_draft"])
        #expect(status == 400)
        #expect(answer["reason"] == "not_completed", "\(answer)")
        (status, answer) = try await harness.hand("user-3", ["store": "PADDLE", "transactionId": "txn_unknown"])
        #expect(status == 400)
        #expect(answer["reason"] == "purchase_not_found", "\(answer)")
        #expect(try await harness.relay.records(topic: harness.relay.configuration.topics.notifications).isEmpty)
        try await harness.stop()
    }

    @Test func aPaddleSubscriptionHandedOverThenPaddlesOwnEventSendOneInitialPurchase() async throws {
        let harness = try await Self.start()
        let (status, answer) = try await harness.hand("user-4", ["store": "PADDLE", "transactionId": "txn_web_sub"])
        #expect(status == 200, "\(answer)")
        #expect(Self.entitlements(answer) == ["pro"])
        #expect(harness.paddle.requests.allSatisfy { $0.headers["authorization"] == "Bearer \(Self.paddleKey)" })
        let state = try #require(try await harness.state(.paddle, "sub_web_paddle"))
        #expect(state.lastTransactionId == "txn_web_sub")
        #expect(state.environment == "SANDBOX")
        // What the worker recorded of Paddle's answer has no card or billing details.
        let recorded = String(decoding: state.json.serialized(), as: UTF8.self)
        #expect(!recorded.contains("4242") && !recorded.contains("Kim Lee") && recorded.contains("txn_web_sub"), "\(recorded)")
        // Paddle's own event, older than the hand-over (sent when the checkout completed, arriving late).
        guard case .object(var data) = Self.paddleSubscription else { return }
        data["transaction_id"] = "txn_web_sub"
        try await harness.notify(.paddle, [
            "event_id": "evt_web_paddle_1", "event_type": "subscription.created", "occurred_at": "2026-01-01T00:00:00.000000Z",
            "notification_id": "ntf_web_paddle_1", "data": .object(data),
        ])
        try await waitUntil("Paddle's event applied") { try await harness.state(.paddle, "sub_web_paddle")?.recentNotifications.count == 2 }
        let purchases = try await harness.events("initial_purchase")
        #expect(purchases.count == 1, "\(purchases)")
        #expect(purchases.first?["data"]?["originalAppUserId"] == "user-4")
        try await harness.stop()
    }

    @Test func aPaddleOneTimeTransactionHandedOverIsANonRenewingPurchase() async throws {
        let harness = try await Self.start()
        let (status, answer) = try await harness.hand("user-5", ["store": "PADDLE", "transactionId": "txn_web_once"])
        #expect(status == 200, "\(answer)")
        #expect(Self.entitlements(answer) == ["coins"])
        let purchases = try await harness.events("non_renewing_purchase")
        #expect(purchases.count == 1)
        #expect(purchases.first?["data"]?["price"]?.doubleValue == 4.99)
        try await harness.stop()
    }
}
