import Foundation
import Logging
import RelayApp
import RelayConfig
import RelayCore
import RelayHistory
import RelayHTTPClient
import RelayTestSupport
import Testing

/// `recover stripe` on a whole relay (embedded log) against a fake Stripe API over real HTTP that lists
/// events in pages of two (checking the key, the time range, the types and the cursor) and answers the
/// first list call 429: an event the relay processed is left alone, the ones missed during an outage are
/// re-ingested once, and a second run appends nothing.
@Suite(.serialized) struct StripeRecoverTests {
    static let stripeKey = "rk_test_recover_0123456789"

    final class FakeStripe: Sendable {
        let events = LockedBox<[JSON]>([])
        let listCalls = LockedBox<[String]>([])

        func answer(_ request: TestHTTPRequest) -> TestHTTPResponse {
            guard request.headers["authorization"] == "Bearer \(StripeRecoverTests.stripeKey)" else { return TestHTTPResponse(status: 401, text: "{}") }
            guard let url = URLComponents(string: "http://stripe.test" + request.path) else { return TestHTTPResponse(status: 400, text: "{}") }
            if url.path == "/v1/events" {
                let calls = listCalls.withLock { calls -> Int in
                    calls.append(request.path)
                    return calls.count
                }
                // Stripe's rate limit, once, with Retry-After: 0: the client asks again after its own short wait.
                if calls == 1 { return TestHTTPResponse(status: 429, headers: [("Retry-After", "0")], text: #"{"error": {"type": "rate_limit_error"}}"#) }
                let items = url.queryItems ?? []
                func value(_ name: String) -> String? { items.first { $0.name == name }?.value }
                let from = Int64(value("created[gte]") ?? "") ?? 0
                let before = Int64(value("created[lt]") ?? "") ?? .max
                let types = Set(items.filter { $0.name == "types[]" }.compactMap(\.value))
                var list = events.value.filter {
                    let created = $0["created"]?.int64Value ?? 0
                    return created >= from && created < before && types.contains($0["type"]?.stringValue ?? "")
                }.sorted { ($0["created"]?.int64Value ?? 0) > ($1["created"]?.int64Value ?? 0) }
                if let after = value("starting_after"), let index = list.firstIndex(where: { $0["id"]?.stringValue == after }) {
                    list = Array(list[(index + 1)...])
                }
                let page = Array(list.prefix(2))
                return TestHTTPResponse(body: JSON.object(["object": "list", "data": .array(page), "has_more": .bool(list.count > 2)]).serialized())
            }
            if url.path.hasPrefix("/v1/events/"), let event = events.value.first(where: { $0["id"]?.stringValue == String(url.path.dropFirst("/v1/events/".count)) }) {
                return TestHTTPResponse(body: event.serialized())
            }
            return TestHTTPResponse(status: 404, text: #"{"error": {"type": "invalid_request_error", "code": "resource_missing"}}"#)
        }
    }

    static func subscription(_ id: String, user: String, cancelAtPeriodEnd: Bool = false) -> JSON {
        [
            "id": .string(id), "object": "subscription", "status": "active", "customer": "cus_Recover", "livemode": false,
            "start_date": 1_893_456_000, "current_period_start": 1_893_456_000, "current_period_end": 4_000_000_000, "latest_invoice": .string("in_\(id)"),
            "cancel_at_period_end": .bool(cancelAtPeriodEnd), "metadata": ["app_user_id": .string(user)],
            "items": ["object": "list", "data": [["id": "si_R", "quantity": 1, "price": [
                "id": "price_pro_monthly", "product": "prod_pro", "unit_amount": 999, "currency": "usd", "type": "recurring", "recurring": ["interval": "month"],
            ]]]],
        ]
    }

    static func event(_ id: String, _ type: String, _ object: JSON, created: Int64, previous: JSON? = nil) -> JSON {
        var data: [String: JSON] = ["object": object]
        if let previous { data["previous_attributes"] = previous }
        return ["id": .string(id), "object": "event", "api_version": "2024-06-20", "type": .string(type), "created": .integer(created), "livemode": false, "data": .object(data)]
    }

    @Test func eventsMissedDuringAnOutageAreReingestedOnceAndARerunAppendsNothing() async throws {
        let stripe = FakeStripe()
        let api = try await TestHTTPServer { request in stripe.answer(request) }
        let now = Int64(Date().timeIntervalSince1970)
        stripe.events.withLock {
            $0 = [
                Self.event("evt_RecoverA", "customer.subscription.created", Self.subscription("sub_RecoverA", user: "user-a"), created: now - 7200),
                Self.event("evt_RecoverB", "customer.subscription.created", Self.subscription("sub_RecoverB", user: "user-b"), created: now - 3600),
                Self.event(
                    "evt_RecoverC", "customer.subscription.updated", Self.subscription("sub_RecoverA", user: "user-a", cancelAtPeriodEnd: true),
                    created: now - 1800, previous: ["cancel_at_period_end": false]),
                // Not a type the relay maps: never listed.
                Self.event("evt_RecoverD", "customer.created", ["id": "cus_Recover", "object": "customer"], created: now - 900),
            ]
        }
        let text = """
            ingest: { listen: "127.0.0.1:0", ackTimeout: 10s }
            backend: { apiKey: "test-backend-key", database: backend.sqlite, listen: "127.0.0.1:0" }
            apps:
              - key: demo
                projectId: 1
                applicationId: 1
                stripe: { signingSecrets: ["whsec_recover"], api: { secretKey: "\(Self.stripeKey)", baseUrl: "\(api.baseURL)" } }
                products:
                  - { productId: price_pro_monthly, store: STRIPE, entitlements: [pro] }
              - key: no-api
                projectId: 1
                applicationId: 2
                stripe: { signingSecrets: ["whsec_other"] }
            money: { exchangeRates: \(Fixtures.path("exchange-rates.json")) }
            delivery: { allowPrivateNetworks: true }
            shutdownTimeout: 20s
            """
        let configuration = try AppleRelayConfiguration.parse(text, name: "stripe-recover")
        let relay = try await TestRelay(configuration: configuration, log: .embedded)
        let backendURL = await relay.environment.process.backendAddress.value()
        // Only the first event reached the relay live.
        let body = stripe.events.value[0].serialized()
        let header = WebhookSigning.stripeHeader(body: body, secret: "whsec_recover", timestamp: now)
        #expect(try await relay.http.send(
            "POST", relay.baseURL + "/v1/notifications/stripe/demo", headers: [("Content-Type", "application/json"), ("Stripe-Signature", header)], body: body
        ).status == 200)
        @Sendable func events(_ type: String) async throws -> [JSON] { try await relay.events(type) }
        try await waitUntil("the live event applied") { try await events("initial_purchase").count == 1 }

        let commands = try StripeHistoryCommands(
            configuration: configuration, appKey: "demo", producer: try relay.environment.process.log.producer, backendURL: backendURL,
            logger: Logger(label: "test"))
        let lines = LockedBox<[String]>([])
        let summary = try await commands.recover(since: (now - 86_400) * 1000, until: nil) { line in lines.withLock { $0.append(line) } }
        #expect(summary == StripeHistoryCommands.RecoverSummary(found: 3, alreadyProcessed: 1, reingested: 2))
        #expect(lines.value.count == 2, "two pages: \(lines.value)")
        // The requests: the rate limit once, then two pages, the second after the first page's last event.
        let calls = stripe.listCalls.value
        #expect(calls.count == 3, "\(calls)")
        #expect(calls.last?.contains("starting_after=evt_RecoverB") == true, "\(calls)")
        #expect(calls.allSatisfy { $0.contains("types%5B%5D=customer.subscription.created") || $0.contains("types[]=customer.subscription.created") }, "\(calls)")
        // The worker reads them from Stripe and applies them as their webhooks: the same ids, once each.
        try await waitUntil("the missed events applied") {
            let purchases = try await events("initial_purchase").count
            let cancellations = try await events("cancellation").count
            return purchases == 2 && cancellations == 1
        }
        let purchaseIds = try await events("initial_purchase").compactMap { $0["data"]?["id"]?.stringValue }.sorted()
        #expect(purchaseIds == ["stripe:evt_RecoverA:initial_purchase", "stripe:evt_RecoverB:initial_purchase"])
        #expect(try await events("cancellation").first?["data"]?["id"] == "stripe:evt_RecoverC:cancellation")
        // Again: everything is processed; nothing is appended.
        let again = try await commands.recover(since: (now - 86_400) * 1000, until: nil)
        #expect(again == StripeHistoryCommands.RecoverSummary(found: 3, alreadyProcessed: 3, reingested: 0))

        // Refusals: older than Stripe's 30 days; an app without stripe.api (exit 78).
        await #expect(throws: CommandFailure.self) { try await commands.recover(since: (now - 31 * 86_400) * 1000, until: nil) }
        #expect(throws: CommandFailure.self) {
            try StripeHistoryCommands(configuration: configuration, appKey: "no-api", producer: try relay.environment.process.log.producer, logger: Logger(label: "test"))
        }
        do {
            _ = try StripeHistoryCommands(configuration: configuration, appKey: "no-api", producer: try relay.environment.process.log.producer, logger: Logger(label: "test"))
        } catch let failure as CommandFailure {
            #expect(failure.exitCode == 78)
            #expect(failure.description.contains("apps[1].stripe.api"))
        }
        try await relay.stop()
        await api.stop()
    }
}
