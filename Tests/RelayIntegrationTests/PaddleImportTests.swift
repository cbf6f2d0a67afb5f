import Foundation
import Logging
import RelayApp
import RelayConfig
import RelayCore
import RelayHistory
import RelayHTTPClient
import RelayTestSupport
import Testing

/// `import paddle` on a whole relay (embedded log) against a fake Paddle API over real HTTP that lists
/// subscriptions (pages of two), a subscription's completed transactions (oldest first) and its
/// adjustments, and serves each object (an adjustment only through its list, as Paddle does), checking
/// the key and every list's filters. Subscriptions come in with their purchase, renewals, refund and
/// current state as historical events, another app's price is skipped, and a rerun adds nothing.
@Suite(.serialized) struct PaddleImportTests {
    static let apiKey = "pdl_apikey_import_0123456789"

    final class FakePaddle: Sendable {
        let subscriptions = LockedBox<[JSON]>([])
        let transactions = LockedBox<[JSON]>([])
        let adjustments = LockedBox<[JSON]>([])

        func answer(_ request: TestHTTPRequest) -> TestHTTPResponse {
            guard request.headers["authorization"] == "Bearer \(PaddleImportTests.apiKey)", request.method == "GET",
                let url = URLComponents(string: "http://paddle.test" + request.path)
            else { return TestHTTPResponse(status: 403, text: #"{"error": {"type": "request_error", "code": "forbidden"}}"#) }
            let items = url.queryItems ?? []
            func value(_ name: String) -> String? { items.first { $0.name == name }?.value }
            func page(_ list: [JSON], size: Int) -> TestHTTPResponse {
                var list = list
                if let after = value("after"), let index = list.firstIndex(where: { $0["id"]?.stringValue == after }) { list = Array(list[(index + 1)...]) }
                let document: JSON = [
                    "data": .array(Array(list.prefix(size))), "meta": ["request_id": "r", "pagination": ["per_page": .integer(Int64(size)), "has_more": .bool(list.count > size)]],
                ]
                return TestHTTPResponse(body: document.serialized())
            }
            let parts = url.path.split(separator: "/").map(String.init)
            switch parts {
            case ["subscriptions"]:
                return page(subscriptions.value, size: 2)
            case ["transactions"]:
                guard value("status") == "completed", value("order_by") == "billed_at[ASC]" else { return TestHTTPResponse(status: 400, text: "{}") }
                return page(
                    transactions.value.filter { $0["subscription_id"]?.stringValue == value("subscription_id") }
                        .sorted { ($0["billed_at"]?.stringValue ?? "") < ($1["billed_at"]?.stringValue ?? "") }, size: 200)
            case ["adjustments"]:
                if let id = value("id") { return page(adjustments.value.filter { $0["id"]?.stringValue == id }, size: 50) }
                return page(adjustments.value.filter { $0["subscription_id"]?.stringValue == value("subscription_id") }, size: 50)
            default:
                if parts.count == 2, let object = (subscriptions.value + transactions.value).first(where: { $0["id"]?.stringValue == parts[1] }) {
                    return TestHTTPResponse(body: JSON.object(["data": object, "meta": ["request_id": "r"]]).serialized())
                }
                return TestHTTPResponse(status: 404, text: #"{"error": {"type": "request_error", "code": "not_found"}}"#)
            }
        }
    }

    static func transaction(_ id: String, subscription: String, origin: String, billedAt: String) -> JSON {
        guard case .object(var members) = PaddleReconcileTests.transaction(id, subscription: subscription, billedAt: billedAt, periodEnd: "2099-03-01T00:00:00Z") else {
            return .null
        }
        members["origin"] = .string(origin)
        return .object(members)
    }

    @Test func subscriptionsComeInWithTheirHistoryAsHistoricalEventsOnce() async throws {
        let paddle = FakePaddle()
        let api = try await TestHTTPServer { request in paddle.answer(request) }
        let milliseconds = Int64(Date().timeIntervalSince1970 * 1000)
        func ago(_ days: Int64) -> String { Timestamp.rfc3339(milliseconds: milliseconds - days * 86_400_000) }
        // J1: bought 70 days ago, renewed twice, the second renewal refunded, canceled 5 days ago.
        // J2: active, scheduled to cancel. JO: another app's price.
        paddle.subscriptions.withLock {
            $0 = [
                PaddleReconcileTests.subscription("sub_J1", user: "user-j1") {
                    $0["started_at"] = .string(ago(70))
                    $0["status"] = "canceled"
                    $0["canceled_at"] = .string(ago(5))
                    $0["current_billing_period"] = .null
                },
                PaddleReconcileTests.subscription("sub_J2", user: "user-j2") {
                    $0["started_at"] = .string(ago(20))
                    $0["scheduled_change"] = ["action": "cancel", "effective_at": "2099-02-01T00:00:00Z"]
                },
                PaddleReconcileTests.subscription("sub_JO", user: "user-jo") {
                    $0["items"] = [["status": "active", "quantity": 1, "price": ["id": "pri_other_app", "product_id": "pro_other", "unit_price": ["amount": "100", "currency_code": "USD"]]]]
                },
            ]
        }
        paddle.transactions.withLock {
            $0 = [
                Self.transaction("txn_J1a", subscription: "sub_J1", origin: "web", billedAt: ago(70)),
                Self.transaction("txn_J1b", subscription: "sub_J1", origin: "subscription_recurring", billedAt: ago(40)),
                Self.transaction("txn_J1c", subscription: "sub_J1", origin: "subscription_recurring", billedAt: ago(10)),
                Self.transaction("txn_J2a", subscription: "sub_J2", origin: "web", billedAt: ago(20)),
            ]
        }
        paddle.adjustments.withLock {
            $0 = [
                ["id": "adj_J1", "action": "refund", "type": "full", "status": "approved", "subscription_id": "sub_J1", "transaction_id": "txn_J1c",
                 "customer_id": "ctm_web", "currency_code": "USD", "reason": "Customer wrote: please refund",
                 "totals": ["subtotal": "999", "tax": "0", "total": "999", "fee": "100", "earnings": "899", "currency_code": "USD"],
                 "created_at": .string(ago(8)), "updated_at": .string(ago(8))],
                ["id": "adj_J1_pending", "action": "refund", "type": "full", "status": "pending_approval", "subscription_id": "sub_J1", "transaction_id": "txn_J1b",
                 "totals": ["total": "999", "currency_code": "USD"], "created_at": .string(ago(7))],
            ]
        }
        let text = """
            ingest: { listen: "127.0.0.1:0", ackTimeout: 10s }
            backend: { apiKey: "test-backend-key", database: backend.sqlite, listen: "127.0.0.1:0" }
            apps:
              - key: demo
                projectId: 1
                applicationId: 1
                paddle: { secretKeys: ["pdl_ntfset_import"], environment: SANDBOX, api: { apiKey: "\(Self.apiKey)", baseUrl: "\(api.baseURL)" } }
                products:
                  - { productId: pri_pro_monthly, store: PADDLE, entitlements: [pro] }
            money: { exchangeRates: \(Fixtures.path("exchange-rates.json")) }
            shutdownTimeout: 20s
            """
        let configuration = try AppleRelayConfiguration.parse(text, name: "paddle-import")
        let relay = try await TestRelay(configuration: configuration, log: .embedded)
        let backendURL = await relay.environment.process.backendAddress.value()
        @Sendable func events(_ type: String) async throws -> [JSON] { try await relay.events(type) }
        @Sendable func distinct(_ type: String) async throws -> Int { try await relay.distinctEvents(type) }

        let commands = try PaddleHistoryCommands(
            configuration: configuration, appKey: "demo", producer: try relay.environment.process.log.producer, backendURL: backendURL,
            logger: Logger(label: "test"))
        let summary = try await commands.importSubscriptions(deliver: false)
        #expect(summary.subscriptions == 2)
        #expect(summary.otherApps == 1)
        #expect(summary.imported == 2)
        #expect(summary.renewals == 2)
        #expect(summary.refunds == 1)

        try await waitUntil("the imported history") {
            let purchases = try await distinct("initial_purchase")
            let renewals = try await distinct("renewal")
            let expirations = try await distinct("expiration")
            let cancellations = try await distinct("cancellation")
            return purchases == 2 && renewals == 2 && expirations == 1 && cancellations == 2
        }
        let purchases = try await events("initial_purchase")
        #expect(purchases.first { $0["data"]?["originalTransactionId"] == "sub_J1" }?["data"]?["purchasedAt"]?.int64Value == Timestamp.milliseconds(ago(70)))
        let renewals = try await events("renewal")
        #expect(Set(renewals.compactMap { $0["data"]?["transactionId"]?.stringValue }) == ["txn_J1b", "txn_J1c"])
        #expect(renewals.allSatisfy { $0["data"]?["price"]?.doubleValue == 9.99 }, "\(renewals)")
        let refund = try #require(try await events("cancellation").first { $0["data"]?["cancelReason"] == "CUSTOMER_SUPPORT" })
        #expect(refund["data"]?["transactionId"] == "txn_J1c")
        #expect(refund["data"]?["price"]?.doubleValue == -9.99)
        #expect(try await events("cancellation").contains { $0["data"]?["originalTransactionId"] == "sub_J2" && $0["data"]?["cancelReason"] == "UNSUBSCRIBE" })
        #expect(try await events("expiration").first?["data"]?["originalTransactionId"] == "sub_J1")
        let records = try await relay.records(topic: configuration.topics.events)
        #expect(records.allSatisfy { $0.headers.first(named: RelayHeaderName.historical)?.stringValue == "true" })
        // What the state records of the applied adjustment keeps no free text of it (its reason).
        let state = try await relay.http.send(
            "GET", backendURL + "/subscriptions-api/internal/v1/subscriptions/paddle/sub_J1", headers: [("Authorization", "Bearer test-backend-key")])
        let recorded = String(decoding: state.body, as: UTF8.self)
        #expect(recorded.contains("adj_J1"), "\(recorded)")
        #expect(!recorded.contains("please refund"))

        // Again, once the backend has recorded what the first run caused (a rerun skips the payments recorded
        // in the events store, which the recorder writes in batches gathered for 50 ms): nothing is appended.
        try await relay.waitForRecordedEvents()
        let appended = try await relay.records(topic: configuration.topics.notifications).count
        let again = try await commands.importSubscriptions(deliver: false)
        #expect(again.alreadyKnown == 2)
        #expect(again.imported == 0)
        #expect(try await relay.records(topic: configuration.topics.notifications).count == appended)
        try await relay.stop()
        await api.stop()
    }
}
