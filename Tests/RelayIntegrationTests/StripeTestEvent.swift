import Foundation
import RelayCore
import RelayTestSupport

/// The Stripe notification the integration tests post: `customer.subscription.created` of a monthly
/// `price_pro` subscription for one user, signed with the test apps' `whsec_test`.
enum StripeTestEvent {
    /// - Parameters:
    ///   - start: the subscription's start and the event's time (Unix seconds).
    ///   - livemode: production (true) or Stripe's test mode, the relay's SANDBOX.
    static func subscriptionCreated(
        subscription: String, event: String, user: String, cents: Int64 = 999, start: Int64, livemode: Bool = false
    ) -> String {
        let object: JSON = [
            "id": .string(subscription), "object": "subscription", "customer": .string("cus_\(subscription)"), "status": "active",
            "start_date": .integer(start), "current_period_end": .integer(start + 2_592_000), "cancel_at_period_end": false,
            "livemode": .bool(livemode), "metadata": ["app_user_id": .string(user)],
            "items": [
                "data": [
                    [
                        "quantity": 1,
                        "price": [
                            "id": "price_pro", "product": "prod_pro", "unit_amount": .integer(cents), "currency": "usd",
                            "recurring": ["interval": "month", "interval_count": 1],
                        ],
                    ]
                ]
            ],
        ]
        return JSON.object([
            "id": .string(event), "object": "event", "type": "customer.subscription.created", "created": .integer(start), "livemode": .bool(livemode),
            "data": ["object": object],
        ]).text
    }

    /// The `Stripe-Signature` of `body` at `now` (Unix seconds) with `whsec_test`.
    static func signature(_ body: String, now: Int64 = Int64(Date().timeIntervalSince1970)) -> String {
        WebhookSigning.stripeHeader(body: Array(body.utf8), secret: "whsec_test", timestamp: now)
    }
}

extension TestRelay {
    /// Posts a Stripe notification for app `demo`, signed now; the ingest's status.
    func postStripe(_ body: String) async throws -> Int {
        try await post("/v1/notifications/stripe/demo", body: body, headers: [("Stripe-Signature", StripeTestEvent.signature(body))]).status
    }

    /// A backend API call with `key` (the test relays' secret key by default): the status and the JSON answer.
    func backend(_ path: String, method: String = "GET", key: String = "test-backend-key") async throws -> (status: Int, json: JSON) {
        let backendURL = await environment.process.backendAddress.value()
        let response = try await http.send(method, backendURL + path, headers: [("Authorization", "Bearer \(key)")])
        return (response.status, (try? JSON.parse(response.body)) ?? .null)
    }
}

/// The configuration the delivery, console and shutdown tests run: the `demo` app, which sells Stripe's
/// `price_pro` (entitlement `pro`), with the test's own backend, endpoints and delivery settings.
enum StripeDemoConfiguration {
    /// Writes it to `file`.
    /// - Parameters:
    ///   - backend: the inside of `backend: { … }` (a database and `listen` are the test's to give).
    ///   - endpoints: each endpoint's inside of `{ … }`.
    ///   - delivery: the inside of `delivery: { … }`.
    static func write(
        to file: URL, backend: String = #"apiKey: "test-backend-key", database: backend.sqlite, listen: "127.0.0.1:0""#, endpoints: [String],
        delivery: String = "retrySchedule: [100ms], allowPrivateNetworks: true", shutdownTimeout: String = "20s"
    ) throws {
        try Data(
            """
            ingest: { listen: "127.0.0.1:0" }
            backend: { \(backend) }
            apps:
              - key: demo
                projectId: 1
                applicationId: 1
                stripe: { signingSecrets: ["whsec_test"] }
                products:
                  - { productId: price_pro, store: STRIPE, entitlements: [pro] }
            endpoints:
            \(endpoints.map { "  - { \($0) }" }.joined(separator: "\n"))
            delivery: { \(delivery) }
            shutdownTimeout: \(shutdownTimeout)
            """.utf8
        ).write(to: file)
    }
}
