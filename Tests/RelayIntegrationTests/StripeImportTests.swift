import Foundation
import Logging
import RelayApp
import RelayConfig
import RelayCore
import RelayHistory
import RelayHTTPClient
import RelayTestSupport
import Testing

/// `import stripe` on a whole relay (embedded log) against a fake Stripe API over real HTTP that lists
/// subscriptions (pages of two), a subscription's paid invoices and a customer's charges, and serves each
/// object (a charge with its invoice expanded), checking the key and every list's filters. Subscriptions
/// the relay never saw come in with their purchase, renewals, refund and current state as historical,
/// undelivered events; another app's price and a subscription the relay holds are skipped; a rerun adds
/// nothing.
@Suite(.serialized) struct StripeImportTests {
    static let stripeKey = "rk_test_import_0123456789"

    final class FakeStripe: Sendable {
        let subscriptions = LockedBox<[JSON]>([])
        let invoices = LockedBox<[JSON]>([])
        let charges = LockedBox<[JSON]>([])
        let lists = LockedBox<[String]>([])

        func answer(_ request: TestHTTPRequest) -> TestHTTPResponse {
            guard request.headers["authorization"] == "Bearer \(StripeImportTests.stripeKey)", request.method == "GET",
                let url = URLComponents(string: "http://stripe.test" + request.path)
            else { return TestHTTPResponse(status: 401, text: "{}") }
            let items = url.queryItems ?? []
            func value(_ name: String) -> String? { items.first { $0.name == name }?.value }
            func page(_ list: [JSON], size: Int) -> TestHTTPResponse {
                var list = list.sorted { ($0["created"]?.int64Value ?? 0) > ($1["created"]?.int64Value ?? 0) }
                if let after = value("starting_after"), let index = list.firstIndex(where: { $0["id"]?.stringValue == after }) { list = Array(list[(index + 1)...]) }
                return TestHTTPResponse(body: JSON.object(["object": "list", "data": .array(Array(list.prefix(size))), "has_more": .bool(list.count > size)]).serialized())
            }
            switch url.path {
            case "/v1/subscriptions":
                lists.withLock { $0.append(request.path) }
                guard value("status") == "all" else { return TestHTTPResponse(status: 400, text: "{}") }
                return page(subscriptions.value, size: 2)
            case "/v1/invoices":
                lists.withLock { $0.append(request.path) }
                guard value("status") == "paid" else { return TestHTTPResponse(status: 400, text: "{}") }
                return page(invoices.value.filter { $0["subscription"]?.stringValue == value("subscription") }, size: 100)
            case "/v1/charges":
                lists.withLock { $0.append(request.path) }
                return page(charges.value.filter { $0["customer"]?.stringValue == value("customer") }, size: 100)
            default:
                let id = String(url.path.split(separator: "/").last ?? "")
                if let object = (subscriptions.value + invoices.value).first(where: { $0["id"]?.stringValue == id }) { return TestHTTPResponse(body: object.serialized()) }
                if case .object(var charge)? = charges.value.first(where: { $0["id"]?.stringValue == id }) {
                    // expand[]=invoice
                    guard value("expand[]") == "invoice" else { return TestHTTPResponse(status: 400, text: "{}") }
                    charge["invoice"] = invoices.value.first { $0["id"] == charge["invoice"] } ?? .null
                    return TestHTTPResponse(body: JSON.object(charge).serialized())
                }
                return TestHTTPResponse(status: 404, text: #"{"error": {"type": "invalid_request_error", "code": "resource_missing"}}"#)
            }
        }
    }

    static let day: Int64 = 86_400

    static func subscription(
        _ id: String, user: String, customer: String, start: Int64, periodEnd: Int64, price: String = "price_pro_monthly", _ change: (inout [String: JSON]) -> Void = { _ in }
    ) -> JSON {
        var members: [String: JSON] = [
            "id": .string(id), "object": "subscription", "status": "active", "customer": .string(customer), "livemode": false, "created": .integer(start),
            "start_date": .integer(start), "current_period_start": .integer(periodEnd - 30 * day), "current_period_end": .integer(periodEnd),
            "cancel_at_period_end": false, "cancel_at": .null, "trial_start": .null, "trial_end": .null, "metadata": ["app_user_id": .string(user)],
            "items": ["object": "list", "data": [["id": "si_1", "quantity": 1, "price": [
                "id": .string(price), "product": "prod_pro", "unit_amount": 999, "currency": "usd", "type": "recurring", "recurring": ["interval": "month"],
            ]]]],
        ]
        change(&members)
        return .object(members)
    }

    static func invoice(_ id: String, subscription: String, user: String, reason: String, paidAt: Int64, periodEnd: Int64, amount: Int64 = 999) -> JSON {
        [
            "id": .string(id), "object": "invoice", "status": "paid", "subscription": .string(subscription), "billing_reason": .string(reason),
            "amount_paid": .integer(amount), "currency": "usd", "livemode": false, "created": .integer(paidAt), "charge": .string("ch_\(id.dropFirst(3))"),
            "status_transitions": ["paid_at": .integer(paidAt)], "subscription_details": ["metadata": ["app_user_id": .string(user)]],
            "lines": ["data": [[
                "amount": .integer(amount), "proration": false, "period": ["start": .integer(periodEnd - 30 * day), "end": .integer(periodEnd)],
                "price": ["id": "price_pro_monthly", "product": "prod_pro", "unit_amount": 999, "currency": "usd"],
            ]]],
        ]
    }

    @Test func subscriptionsComeInWithTheirHistoryAsUndeliveredEventsOnce() async throws {
        let stripe = FakeStripe()
        let api = try await TestHTTPServer { request in stripe.answer(request) }
        let now = Int64(Date().timeIntervalSince1970)
        let start1 = now - 70 * Self.day
        // I1: bought 70 days ago, renewed twice, the second renewal refunded, canceled 5 days ago.
        // I2: began with a trial 40 days ago, converted, then set to cancel at the period's end.
        // O: another app's price. K: already known (its webhook reached the relay).
        stripe.subscriptions.withLock {
            $0 = [
                Self.subscription("sub_I1", user: "user-i1", customer: "cus_I1", start: start1, periodEnd: start1 + 90 * Self.day) {
                    $0["status"] = "canceled"
                    $0["ended_at"] = .integer(now - 5 * Self.day)
                    $0["canceled_at"] = .integer(now - 5 * Self.day)
                    $0["cancellation_details"] = ["reason": "cancellation_requested"]
                },
                Self.subscription("sub_I2", user: "user-i2", customer: "cus_I2", start: now - 40 * Self.day, periodEnd: now + 20 * Self.day) {
                    $0["trial_start"] = .integer(now - 40 * Self.day)
                    $0["trial_end"] = .integer(now - 10 * Self.day)
                    $0["cancel_at_period_end"] = true
                },
                Self.subscription("sub_O", user: "user-o", customer: "cus_O", start: now - 30 * Self.day, periodEnd: now + Self.day, price: "price_other_app"),
                Self.subscription("sub_K", user: "user-k", customer: "cus_K", start: now - 3600, periodEnd: now + 30 * Self.day),
            ]
        }
        stripe.invoices.withLock {
            $0 = [
                Self.invoice("in_I1a", subscription: "sub_I1", user: "user-i1", reason: "subscription_create", paidAt: start1, periodEnd: start1 + 30 * Self.day),
                Self.invoice("in_I1b", subscription: "sub_I1", user: "user-i1", reason: "subscription_cycle", paidAt: start1 + 30 * Self.day, periodEnd: start1 + 60 * Self.day),
                Self.invoice("in_I1c", subscription: "sub_I1", user: "user-i1", reason: "subscription_cycle", paidAt: start1 + 60 * Self.day, periodEnd: start1 + 90 * Self.day),
                Self.invoice("in_I2a", subscription: "sub_I2", user: "user-i2", reason: "subscription_create", paidAt: now - 40 * Self.day, periodEnd: now - 10 * Self.day, amount: 0),
                Self.invoice("in_I2b", subscription: "sub_I2", user: "user-i2", reason: "subscription_cycle", paidAt: now - 10 * Self.day, periodEnd: now + 20 * Self.day),
                // K, which the relay holds, renewed once before its webhooks reached the relay: that payment is brought in.
                Self.invoice("in_K2", subscription: "sub_K", user: "user-k", reason: "subscription_cycle", paidAt: now - 1800, periodEnd: now + 30 * Self.day),
            ]
        }
        stripe.charges.withLock {
            $0 = [
                ["id": "ch_I1b", "object": "charge", "customer": "cus_I1", "invoice": "in_I1b", "amount": 999, "amount_refunded": 0, "refunded": false, "currency": "usd",
                 "created": .integer(start1 + 30 * Self.day)],
                ["id": "ch_I1c", "object": "charge", "customer": "cus_I1", "invoice": "in_I1c", "amount": 999, "amount_refunded": 999, "refunded": true, "currency": "usd",
                 "created": .integer(start1 + 60 * Self.day), "refunds": ["data": [["id": "re_1", "created": .integer(start1 + 62 * Self.day)]]]],
            ]
        }
        let text = """
            ingest: { listen: "127.0.0.1:0", ackTimeout: 10s }
            backend: { apiKey: "test-backend-key", database: backend.sqlite, listen: "127.0.0.1:0" }
            apps:
              - key: demo
                projectId: 1
                applicationId: 1
                publicApiKeys: ["pk_import_stripe_0123456789"]
                stripe: { signingSecrets: ["whsec_import"], api: { secretKey: "\(Self.stripeKey)", baseUrl: "\(api.baseURL)" } }
                products:
                  - { productId: price_pro_monthly, store: STRIPE, entitlements: [pro] }
            money: { exchangeRates: \(Fixtures.path("exchange-rates.json")) }
            delivery: { allowPrivateNetworks: true }
            endpoints:
              - { id: hooks, app: demo, url: "http://127.0.0.1:9/hooks", secrets: ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"] }
            shutdownTimeout: 20s
            """
        let configuration = try AppleRelayConfiguration.parse(text, name: "stripe-import")
        let relay = try await TestRelay(configuration: configuration, log: .embedded)
        let backendURL = await relay.environment.process.backendAddress.value()
        @Sendable func events(_ type: String) async throws -> [JSON] { try await relay.events(type) }
        @Sendable func distinct(_ type: String) async throws -> [String] {
            Array(Set(try await events(type).compactMap { $0["data"]?["id"]?.stringValue })).sorted()
        }
        // K's webhook reached the relay live.
        let body = StripeRecoverTests.event("evt_K", "customer.subscription.created", stripe.subscriptions.value[3], created: now - 3600).serialized()
        let header = WebhookSigning.stripeHeader(body: body, secret: "whsec_import", timestamp: now)
        #expect(try await relay.http.send(
            "POST", relay.baseURL + "/v1/notifications/stripe/demo", headers: [("Content-Type", "application/json"), ("Stripe-Signature", header)], body: body
        ).status == 200)
        try await waitUntil("K applied") { try await events("initial_purchase").count == 1 }
        try await waitUntil("K's deliveries") { try await relay.records(topic: configuration.topics.deliveries).count > 0 }
        let deliveries = try await relay.records(topic: configuration.topics.deliveries).count

        let commands = try StripeHistoryCommands(
            configuration: configuration, appKey: "demo", producer: try relay.environment.process.log.producer, backendURL: backendURL,
            logger: Logger(label: "test"))
        let summary = try await commands.importSubscriptions(since: nil, deliver: false)
        #expect(summary.subscriptions == 3)
        #expect(summary.otherApps == 1)
        #expect(summary.alreadyKnown == 1)
        #expect(summary.imported == 2)
        #expect(summary.renewals == 4)
        #expect(summary.refunds == 1)
        #expect(stripe.lists.value.filter { $0.hasPrefix("/v1/subscriptions") }.count == 2, "pages of two: \(stripe.lists.value)")

        try await waitUntil("the imported history") {
            let purchases = try await distinct("initial_purchase").count
            let renewals = try await distinct("renewal").count
            let expirations = try await distinct("expiration").count
            let cancellations = try await distinct("cancellation").count
            return purchases == 3 && renewals == 4 && expirations == 1 && cancellations == 2
        }
        // The purchases at their start, the renewals with their money at their payment, the refund taken back.
        let purchases = try await events("initial_purchase").filter { $0["data"]?["originalTransactionId"] != "sub_K" }
        #expect(Set(purchases.compactMap { $0["data"]?["originalTransactionId"]?.stringValue }) == ["sub_I1", "sub_I2"])
        #expect(purchases.first { $0["data"]?["originalTransactionId"] == "sub_I1" }?["data"]?["purchasedAt"]?.int64Value == start1 * 1000)
        #expect(purchases.first { $0["data"]?["originalTransactionId"] == "sub_I2" }?["data"]?["periodType"] == "TRIAL")
        let renewals = try await events("renewal")
        #expect(Set(renewals.compactMap { $0["data"]?["transactionId"]?.stringValue }) == ["in_I1b", "in_I1c", "in_I2b", "in_K2"])
        // The purchase is the first invoice's payment, for its first period.
        let first = try #require(purchases.first { $0["data"]?["originalTransactionId"] == "sub_I1" })
        #expect(first["data"]?["transactionId"] == "in_I1a", "\(first)")
        #expect(first["data"]?["expirationAt"]?.int64Value == (start1 + 30 * Self.day) * 1000, "\(first)")
        #expect(renewals.allSatisfy { $0["data"]?["price"]?.doubleValue == 9.99 }, "\(renewals)")
        #expect(renewals.first { $0["data"]?["transactionId"] == "in_I2b" }?["data"]?["isTrialConversion"] == true)
        let cancellations = try await events("cancellation")
        let refund = try #require(cancellations.first { $0["data"]?["cancelReason"] == "CUSTOMER_SUPPORT" })
        #expect(refund["data"]?["transactionId"] == "in_I1c")
        #expect(refund["data"]?["price"]?.doubleValue == -9.99)
        #expect(cancellations.contains { $0["data"]?["originalTransactionId"] == "sub_I2" && $0["data"]?["cancelReason"] == "UNSUBSCRIBE" })
        #expect(try await events("expiration").first?["data"]?["originalTransactionId"] == "sub_I1")
        // Historical, and not delivered (counted once the worker has processed every imported record).
        try await relay.waitForWorker()
        let imported = try await relay.records(topic: configuration.topics.events).filter {
            (try? JSON.parse($0.value))?["data"]?["originalTransactionId"] != "sub_K" || (try? JSON.parse($0.value))?["type"] == "renewal"
        }
        #expect(imported.allSatisfy { $0.headers.first(named: RelayHeaderName.historical)?.stringValue == "true" })
        #expect(try await relay.records(topic: configuration.topics.deliveries).count == deliveries)
        // The users have what Stripe says they have now.
        let entitlements = try await relay.http.send(
            "GET", backendURL + "/subscriptions-api/public/v1/users/user-i2/entitlements", headers: [("Authorization", "Bearer pk_import_stripe_0123456789")])
        #expect(try JSON.parse(entitlements.body)["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } == ["pro"])
        let ended = try await relay.http.send(
            "GET", backendURL + "/subscriptions-api/public/v1/users/user-i1/entitlements", headers: [("Authorization", "Bearer pk_import_stripe_0123456789")])
        #expect(try JSON.parse(ended.body)["entitlements"]?.arrayValue?.isEmpty == true)

        // RevenueCat's export of the same Stripe subscription adds nothing: its payments cannot be matched with
        // Stripe's invoices, and the relay has the subscription from Stripe itself.
        let export = [
            RevenueCatImportTests.header,
            RevenueCatImportTests.row(user: "user-i2", alias: "user-i2", product: "price_pro_monthly", start: -10, end: 20, store: "stripe",
                transaction: "sub_I2", original: "sub_I2", price: "9.99", renewal: 2),
        ].joined(separator: "\n")
        let revenueCat = try RevenueCatHistoryCommands(
            configuration: configuration, appKey: "demo", producer: try relay.environment.process.log.producer, backendURL: backendURL,
            logger: Logger(label: "test"))
        let fromRevenueCat = try await revenueCat.importTransactions(try RevenueCatHistoryCommands.parseExport([export]), deliver: false)
        #expect(fromRevenueCat.appended == 0, "\(fromRevenueCat)")
        #expect(fromRevenueCat.alreadyRecorded == 1)

        // Again, once the backend has recorded what the first run caused (a rerun skips the payments recorded
        // in the events store, which the recorder writes in batches gathered for 50 ms): nothing is appended.
        try await relay.waitForRecordedEvents()
        let appended = try await relay.records(topic: configuration.topics.notifications).count
        let again = try await commands.importSubscriptions(since: nil, deliver: false)
        #expect(again.alreadyKnown == 3)
        #expect(again.imported == 0)
        #expect(try await relay.records(topic: configuration.topics.notifications).count == appended)
        try await relay.stop()
        await api.stop()
    }
}
