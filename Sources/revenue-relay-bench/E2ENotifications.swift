import RelayCrypto
import ArgumentParser
import Foundation
import Glibc
import Logging
import RelayApp
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayVerification
import Synchronization

/// Distinct, correctly signed notifications: Apple DID_RENEW (three JWS on the fixtures' chain), and in
/// mixed mode also Stripe `customer.subscription.created` and Paddle `subscription.created`, each of its own
/// subscription; or, with `subscriptions`, Apple renewals of that many subscriptions in turn.
struct NotificationFactory: Sendable {
    struct Notification: Sendable {
        var store: String
        var kind: Int
        /// `store:notificationId`, as the event ids (and so the webhook ids) begin.
        var key: String
        var body: [UInt8]
        var headers: [(name: String, value: String)]
    }

    static let stripeSecret = "whsec_bench_stripe_secret"
    static let paddleSecret = "pdl_ntfset_bench_paddle_secret"

    let kinds: Int
    /// Apple notifications renew this many subscriptions in turn (index modulo); nil: each its own.
    let subscriptions: Int?
    private let key: PrivateKey
    private let header: String

    init(fixtures: String, mixed: Bool, subscriptions: Int? = nil) throws {
        kinds = mixed ? 3 : 1
        self.subscriptions = subscriptions
        key = try PrivateKey(pem: String(contentsOfFile: "\(fixtures)/apple/leaf.key", encoding: .utf8))
        let chain = try ["leaf", "intermediate", "root"].map { name in
            Base64.encode(try Certificate.pem(Array(String(contentsOfFile: "\(fixtures)/apple/\(name).pem", encoding: .utf8).utf8))[0].der)
        }
        let header: JSON = ["alg": "ES256", "x5c": .array(chain.map(JSON.string))]
        self.header = Base64.encodeURL(header.serialized())
    }

    func configuration(receiverPort: Int, fixtures: String, workerInFlight: Int?, nestedCovered: Bool = false) -> String {
        """
        # The load generator is one client address: the per-client limits stay on (their cost is measured)
        # but far above what it sends.
        ingest: { listen: "127.0.0.1:0", maxBodyBytes: 262144, clientLimit: { requestsPerSecond: 1000000, burst: 1000000, unverifiedBytes: 1073741824 } }
        backend: { url: "http://127.0.0.1:1", apiKey: "bench-backend-key", listen: "127.0.0.1:0", database: backend.sqlite, entitlementsTTL: 60s }
        apps:
          - key: bench
            projectId: 1
            applicationId: 1
            apple: { bundleId: com.example.app, appAppleId: 1234, environments: [Sandbox, Production], rootCertificates: ["\(fixtures)/apple/root.pem"], verifyNestedSignatures: \(!nestedCovered) }
            stripe: { signingSecrets: ["\(Self.stripeSecret)"], tolerance: 300s }
            paddle: { secretKeys: ["\(Self.paddleSecret)"], tolerance: 300s }
            products:
              - { productId: com.example.pro.monthly, store: APP_STORE, entitlements: [pro] }
              - { productId: price_bench_monthly, store: STRIPE, entitlements: [pro] }
              - { productId: pri_bench_monthly, store: PADDLE, entitlements: [pro] }
        endpoints:
          - { id: bench, app: bench, url: "http://127.0.0.1:\(receiverPort)/webhooks", secrets: ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
              events: ["*"], environments: [PRODUCTION, SANDBOX] }
        delivery: { timeout: 15s, allowPrivateNetworks: true }
        money: { exchangeRates: "\(fixtures)/exchange-rates.json" }
        shutdownTimeout: 10s
        """ + (workerInFlight.map { "\nworker: { maxInFlight: \($0) }\n" } ?? "")
    }

    func make(index: Int, kind: Int) -> Notification {
        switch kind {
        case 1: stripe(index)
        case 2: paddle(index)
        default: apple(index)
        }
    }

    private func sign(_ payload: JSON) -> String {
        let input = header + "." + Base64.encodeURL(payload.serialized())
        return input + "." + Base64.encodeURL(try! key.signES256(Array(input.utf8)))
    }

    /// Stripe's and Paddle's signature: hex HMAC-SHA256 of the timestamp prefix and the body.
    private static func hmac(_ secret: String, _ prefix: String, _ body: [UInt8]) -> String {
        Digest.hex(Digest.hmacSHA256(key: Array(secret.utf8), message: Array(prefix.utf8) + body)!)
    }

    private func apple(_ index: Int) -> Notification {
        let signedDate = wallClockMilliseconds()
        let original = "3000\(String(format: "%011d", subscriptions.map { index % $0 } ?? index))"
        let uuid = UUID().uuidString.lowercased()
        let transaction: JSON = [
            "transactionId": .string("4000\(String(format: "%011d", index))"), "originalTransactionId": .string(original),
            "bundleId": "com.example.app", "productId": "com.example.pro.monthly", "purchaseDate": .integer(signedDate),
            "originalPurchaseDate": .integer(signedDate - 2_592_000_000), "expiresDate": .integer(signedDate + 2_592_000_000),
            "type": "Auto-Renewable Subscription", "inAppOwnershipType": "PURCHASED", "environment": "Sandbox",
            "signedDate": .integer(signedDate), "price": 9990, "currency": "USD", "storefront": "USA",
            "transactionReason": "RENEWAL", "appAccountToken": .string(UUID().uuidString.lowercased()),
        ]
        let renewal: JSON = [
            "originalTransactionId": .string(original), "autoRenewProductId": "com.example.pro.monthly",
            "productId": "com.example.pro.monthly", "autoRenewStatus": 1, "environment": "Sandbox", "signedDate": .integer(signedDate),
            "renewalDate": .integer(signedDate + 2_592_000_000), "renewalPrice": 9990, "currency": "USD",
        ]
        let payload: JSON = [
            "notificationType": "DID_RENEW", "notificationUUID": .string(uuid), "version": "2.0", "signedDate": .integer(signedDate),
            "data": [
                "appAppleId": 1234, "bundleId": "com.example.app", "bundleVersion": "1.0", "environment": "Sandbox", "status": 1,
                "signedTransactionInfo": .string(sign(transaction)), "signedRenewalInfo": .string(sign(renewal)),
            ],
        ]
        let body = JSON.object(["signedPayload": .string(sign(payload))]).serialized()
        return Notification(store: "apple", kind: 0, key: "apple:\(uuid)", body: body, headers: [("Content-Type", "application/json")])
    }

    private func stripe(_ index: Int) -> Notification {
        let now = wallClockMilliseconds() / 1000
        let id = "evt_bench\(String(format: "%015d", index))"
        let subscription = "sub_bench\(String(format: "%015d", index))"
        let event: JSON = [
            "id": .string(id), "object": "event", "api_version": "2024-06-20", "created": .integer(now), "livemode": true,
            "pending_webhooks": 1, "type": "customer.subscription.created", "request": ["id": nil, "idempotency_key": nil],
            "data": [
                "object": [
                    "id": .string(subscription), "object": "subscription", "billing_cycle_anchor": .integer(now), "cancel_at": nil,
                    "cancel_at_period_end": false, "canceled_at": nil, "collection_method": "charge_automatically", "created": .integer(now),
                    "currency": "usd", "current_period_start": .integer(now), "current_period_end": .integer(now + 2_592_000),
                    "customer": .string("cus_bench\(index)"), "discounts": [], "ended_at": nil,
                    "latest_invoice": .string("in_bench\(index)"), "livemode": true,
                    "metadata": ["app_user_id": .string("bench-user-\(index)")], "start_date": .integer(now), "status": "active",
                    "trial_end": nil,
                    "items": [
                        "object": "list", "has_more": false,
                        "data": [
                            [
                                "id": .string("si_bench\(index)"), "object": "subscription_item", "quantity": 1,
                                "current_period_start": .integer(now), "current_period_end": .integer(now + 2_592_000),
                                "price": [
                                    "id": "price_bench_monthly", "object": "price", "currency": "usd", "product": "prod_bench",
                                    "type": "recurring", "unit_amount": 999, "unit_amount_decimal": "999",
                                    "recurring": ["interval": "month", "interval_count": 1],
                                ],
                            ]
                        ],
                    ],
                ]
            ],
        ]
        let body = event.serialized()
        let signature = Self.hmac(Self.stripeSecret, "\(now).", body)
        return Notification(
            store: "stripe", kind: 1, key: "stripe:\(id)", body: body,
            headers: [("Content-Type", "application/json"), ("Stripe-Signature", "t=\(now),v1=\(signature)")])
    }

    private func paddle(_ index: Int) -> Notification {
        let now = wallClockMilliseconds() / 1000
        let date = ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: TimeInterval(now)))
        let next = ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: TimeInterval(now + 2_592_000)))
        // The relay keys Paddle's events by event_id (a resent notification_id names the same event).
        let id = "evt_bench\(String(format: "%017d", index))"
        let price: JSON = [
            "id": "pri_bench_monthly", "product_id": "pro_bench", "name": "Monthly", "description": "Bench, billed monthly",
            "type": "standard", "billing_cycle": ["interval": "month", "frequency": 1], "trial_period": nil, "tax_mode": "account_setting",
            "unit_price": ["amount": "999", "currency_code": "USD"], "unit_price_overrides": [], "quantity": ["minimum": 1, "maximum": 1],
            "status": "active", "custom_data": nil, "import_meta": nil,
        ]
        let event: JSON = [
            "event_id": .string(id), "event_type": "subscription.created",
            "occurred_at": .string(date), "notification_id": .string("ntf_bench\(String(format: "%017d", index))"),
            "data": [
                "id": .string("sub_bench\(String(format: "%017d", index))"), "status": "active",
                "customer_id": .string("ctm_bench\(index)"), "address_id": .string("add_bench\(index)"), "business_id": nil,
                "currency_code": "USD", "created_at": .string(date), "updated_at": .string(date), "started_at": .string(date),
                "first_billed_at": .string(date), "next_billed_at": .string(next), "paused_at": nil, "canceled_at": nil, "discount": nil,
                "collection_mode": "automatic", "billing_details": nil,
                "current_billing_period": ["starts_at": .string(date), "ends_at": .string(next)],
                "billing_cycle": ["interval": "month", "frequency": 1], "scheduled_change": nil,
                "items": [
                    [
                        "status": "active", "quantity": 1, "recurring": true, "created_at": .string(date), "updated_at": .string(date),
                        "previously_billed_at": .string(date), "next_billed_at": .string(next), "trial_dates": nil, "price": price,
                    ]
                ],
                "custom_data": ["app_user_id": .string("bench-user-\(index)")], "import_meta": nil,
                "transaction_id": .string("txn_bench\(index)"),
            ],
        ]
        let body = event.serialized()
        let signature = Self.hmac(Self.paddleSecret, "\(now):", body)
        return Notification(
            store: "paddle", kind: 2, key: "paddle:\(id)", body: body,
            headers: [("Content-Type", "application/json"), ("Paddle-Signature", "ts=\(now);h1=\(signature)")])
    }
}
