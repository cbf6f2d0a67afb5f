import Foundation
import Logging
import RelayApp
import RelayConfig
import RelayCore
import RelayHistory
import RelayHTTPClient
import RelayTestSupport
import Testing

/// `reconcile paddle` on a whole relay (embedded log) against a fake Paddle API over real HTTP that serves
/// subscriptions, transactions and a subscription's transactions list (checking the key and the list's
/// filters): a scheduled cancellation, a renewal and an end the relay never heard of are corrected with
/// their events (the renewal with its money), once; a subscription in step is left alone.
@Suite(.serialized) struct PaddleReconcileTests {
    static let apiKey = "pdl_apikey_reconcile_0123456789"
    static let secret = "pdl_ntfset_reconcile_secret"

    final class FakePaddle: Sendable {
        let subscriptions = LockedBox<[String: JSON]>([:])
        let transactions = LockedBox<[JSON]>([])
        let listCalls = LockedBox<[String]>([])

        func answer(_ request: TestHTTPRequest) -> TestHTTPResponse {
            guard request.headers["authorization"] == "Bearer \(PaddleReconcileTests.apiKey)" else {
                return TestHTTPResponse(status: 403, text: #"{"error": {"type": "request_error", "code": "forbidden"}}"#)
            }
            guard request.method == "GET", let url = URLComponents(string: "http://paddle.test" + request.path) else { return Self.notFound }
            let parts = url.path.split(separator: "/").map(String.init)
            func data(_ value: JSON, more: Bool? = nil) -> TestHTTPResponse {
                var document: [String: JSON] = ["data": value, "meta": ["request_id": "r"]]
                if let more { document["meta"] = ["request_id": "r", "pagination": ["per_page": 1, "has_more": .bool(more)]] }
                return TestHTTPResponse(body: JSON.object(document).serialized())
            }
            if parts == ["transactions"] {
                listCalls.withLock { $0.append(request.path) }
                let items = url.queryItems ?? []
                func value(_ name: String) -> String? { items.first { $0.name == name }?.value }
                guard value("status") == "completed", value("order_by") == "billed_at[DESC]" else { return Self.notFound }
                let list = transactions.value.filter { $0["subscription_id"]?.stringValue == value("subscription_id") }
                    .sorted { ($0["billed_at"]?.stringValue ?? "") > ($1["billed_at"]?.stringValue ?? "") }
                let page = Array(list.prefix(Int(value("per_page") ?? "") ?? 30))
                return data(.array(page), more: list.count > page.count)
            }
            if parts.count == 2, parts[0] == "subscriptions", let subscription = subscriptions.value[parts[1]] { return data(subscription) }
            if parts.count == 2, parts[0] == "transactions", let transaction = transactions.value.first(where: { $0["id"]?.stringValue == parts[1] }) {
                return data(transaction)
            }
            return Self.notFound
        }

        static let notFound = TestHTTPResponse(status: 404, text: #"{"error": {"type": "request_error", "code": "not_found"}}"#)
    }

    static func subscription(_ id: String, user: String, _ change: (inout [String: JSON]) -> Void = { _ in }) -> JSON {
        guard case .object(var members) = WebPurchaseTests.paddleSubscription else {
            Issue.record("the Paddle subscription fixture is not a JSON object")
            return .null
        }
        members["id"] = .string(id)
        members["custom_data"] = ["app_user_id": .string(user)]
        change(&members)
        return .object(members)
    }

    static func transaction(_ id: String, subscription: String, billedAt: String, periodEnd: String) -> JSON {
        [
            "id": .string(id), "status": "completed", "origin": "subscription_recurring", "subscription_id": .string(subscription),
            "customer_id": "ctm_web", "currency_code": "USD", "billed_at": .string(billedAt), "created_at": .string(billedAt),
            "billing_period": ["starts_at": "2099-02-01T00:00:00Z", "ends_at": .string(periodEnd)],
            "items": [["price": ["id": "pri_pro_monthly", "product_id": "pro_pro", "unit_price": ["amount": "999", "currency_code": "USD"]], "quantity": 1]],
            "details": ["totals": ["subtotal": "999", "tax": "0", "discount": "0", "total": "999", "grand_total": "999", "fee": "100", "earnings": "899",
                                   "currency_code": "USD"]],
        ]
    }

    @Test func missedChangesAreCorrectedOnceWithTheirEventsAndMoney() async throws {
        let paddle = FakePaddle()
        let api = try await TestHTTPServer { request in paddle.answer(request) }
        let text = """
            ingest: { listen: "127.0.0.1:0", ackTimeout: 10s }
            backend: { apiKey: "test-backend-key", database: backend.sqlite, listen: "127.0.0.1:0" }
            apps:
              - key: demo
                projectId: 1
                applicationId: 1
                paddle: { secretKeys: ["\(Self.secret)"], environment: SANDBOX, api: { apiKey: "\(Self.apiKey)", baseUrl: "\(api.baseURL)" } }
                products:
                  - { productId: pri_pro_monthly, store: PADDLE, entitlements: [pro] }
            money: { exchangeRates: \(Fixtures.path("exchange-rates.json")) }
            delivery: { allowPrivateNetworks: true }
            shutdownTimeout: 20s
            """
        let configuration = try AppleRelayConfiguration.parse(text, name: "paddle-reconcile")
        let relay = try await TestRelay(configuration: configuration, log: .embedded)
        let backendURL = await relay.environment.process.backendAddress.value()
        @Sendable func events(_ type: String) async throws -> [JSON] { try await relay.events(type) }
        @Sendable func distinct(_ type: String) async throws -> Int { try await relay.distinctEvents(type) }
        @Sendable func state(_ id: String) async throws -> SubscriptionState? { try await relay.state(.paddle, id) }
        // Four subscriptions reached the relay live.
        let hourAgo = Timestamp.rfc3339(milliseconds: Int64(Date().timeIntervalSince1970 * 1000) - 3_600_000)
        for (index, id) in ["sub_PA", "sub_PB", "sub_PC", "sub_PD"].enumerated() {
            let body = JSON.object([
                "event_id": .string("evt_created_\(index)"), "event_type": "subscription.created", "occurred_at": .string(hourAgo),
                "notification_id": .string("ntf_created_\(index)"), "data": Self.subscription(id, user: "user-\(index)"),
            ]).serialized()
            let header = WebhookSigning.paddleHeader(body: body, secret: Self.secret, timestamp: Int64(Date().timeIntervalSince1970))
            #expect(try await relay.http.send(
                "POST", relay.baseURL + "/v1/notifications/paddle/demo", headers: [("Content-Type", "application/json"), ("Paddle-Signature", header)], body: body
            ).status == 200)
        }
        try await waitUntil("the purchases") { try await events("initial_purchase").count == 4 }
        // What happened at Paddle while its notifications were lost: PA scheduled to cancel, PB renewed (a
        // completed transaction, a later period end), PC canceled; PD is unchanged.
        let tenMinutesAgo = Timestamp.rfc3339(milliseconds: Int64(Date().timeIntervalSince1970 * 1000) - 600_000)
        paddle.subscriptions.withLock {
            $0["sub_PA"] = Self.subscription("sub_PA", user: "user-0") { $0["scheduled_change"] = ["action": "cancel", "effective_at": "2099-02-01T00:00:00Z"] }
            $0["sub_PB"] = Self.subscription("sub_PB", user: "user-1") {
                $0["current_billing_period"] = ["starts_at": "2099-02-01T00:00:00Z", "ends_at": "2099-03-01T00:00:00Z"]
            }
            $0["sub_PC"] = Self.subscription("sub_PC", user: "user-2") {
                $0["status"] = "canceled"
                $0["canceled_at"] = .string(tenMinutesAgo)
                $0["current_billing_period"] = .null
            }
            $0["sub_PD"] = Self.subscription("sub_PD", user: "user-3")
        }
        paddle.transactions.withLock { $0 = [Self.transaction("txn_PB2", subscription: "sub_PB", billedAt: tenMinutesAgo, periodEnd: "2099-03-01T00:00:00Z")] }
        let commands = try PaddleHistoryCommands(
            configuration: configuration, appKey: "demo", producer: try relay.environment.process.log.producer, backendURL: backendURL,
            logger: Logger(label: "test"))
        let summary = try await commands.reconcile(since: nil)
        #expect(summary.checked == 4)
        #expect(summary.inSync == 1)
        #expect(summary.failures.isEmpty, "\(summary.failures)")
        #expect(Dictionary(uniqueKeysWithValues: summary.corrections.map { ($0.originalTransactionId, $0.action) }) == [
            "sub_PA": "subscription.updated", "sub_PB": "transaction.completed, subscription.updated", "sub_PC": "subscription.canceled",
        ])
        // Each subscription's latest completed transaction is read: a payment lost alone is found too.
        #expect(paddle.listCalls.value.count == 4, "\(paddle.listCalls.value)")
        #expect(paddle.listCalls.value.contains { $0.contains("subscription_id=sub_PB") && $0.contains("per_page=1") }, "\(paddle.listCalls.value)")
        // Again, racing the worker: nothing new is found, whichever corrections it applied meanwhile.
        try await relay.reconcileAgain(after: summary, ended: (.paddle, "sub_PC")) { try await commands.reconcile(since: nil) }

        try await waitUntil("the missed events") {
            let cancellations = try await distinct("cancellation")
            let renewals = try await distinct("renewal")
            let expirations = try await distinct("expiration")
            return cancellations == 1 && renewals == 1 && expirations == 1
        }
        let renewal = try #require(try await events("renewal").first)
        #expect(renewal["data"]?["transactionId"] == "txn_PB2")
        #expect(renewal["data"]?["price"]?.doubleValue == 9.99, "\(renewal)")
        #expect(try await events("cancellation").first?["data"]?["originalTransactionId"] == "sub_PA")
        #expect(try await events("expiration").first?["data"]?["originalTransactionId"] == "sub_PC")
        try await waitUntil("the states") {
            let a = try await state("sub_PA")
            let b = try await state("sub_PB")
            let c = try await state("sub_PC")
            return a?.autoRenew == false && b?.expiresAt == Timestamp.milliseconds("2099-03-01T00:00:00Z") && c?.status == .expired
        }
        // Both runs processed: each missed event is on the events topic once, whatever the second run appended.
        try await relay.waitForWorker()
        for type in ["cancellation", "renewal", "expiration"] {
            #expect(try await events(type).count == 1, "\(type) once")
        }
        // In step now: nothing is appended (PC has ended and is no longer listed).
        let appended = try await relay.records(topic: configuration.topics.notifications).count
        let again = try await commands.reconcile(since: nil)
        #expect(again.corrections.isEmpty, "\(again.corrections)")
        #expect(again.checked == 3)
        #expect(try await relay.records(topic: configuration.topics.notifications).count == appended)
        try await relay.stop()
        await api.stop()
    }
}
