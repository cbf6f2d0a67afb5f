import Foundation
import Logging
import RelayApp
import RelayConfig
import RelayCore
import RelayHistory
import RelayHTTPClient
import RelayTestSupport
import Testing

/// `recover paddle` on a whole relay (embedded log) against a fake Paddle API over real HTTP: its
/// notifications list in pages of two (checking the key and the cursor), and a replay endpoint that, as
/// Paddle does, sends the notification again, signed, to the relay's ingest. An event the relay processed
/// is left alone, a missed one is replayed once (one replay for an event Paddle notified twice), and a
/// second run replays nothing.
@Suite(.serialized) struct PaddleRecoverTests {
    static let apiKey = "pdl_apikey_recover_0123456789"
    static let secret = "pdl_ntfset_recover_secret"

    final class FakePaddle: Sendable {
        let notifications = LockedBox<[JSON]>([])
        let replays = LockedBox<[String]>([])
        let ingest = LockedBox<String>("")
        let listCalls = LockedBox<[String]>([])

        func answer(_ request: TestHTTPRequest) async -> TestHTTPResponse {
            guard request.headers["authorization"] == "Bearer \(PaddleRecoverTests.apiKey)" else {
                return TestHTTPResponse(status: 403, text: #"{"error": {"type": "request_error", "code": "forbidden"}}"#)
            }
            guard let url = URLComponents(string: "http://paddle.test" + request.path) else { return TestHTTPResponse(status: 400, text: "{}") }
            if request.method == "GET", url.path == "/notifications" {
                listCalls.withLock { $0.append(request.path) }
                // Only the relay's destination is listed.
                guard url.queryItems?.first(where: { $0.name == "notification_setting_id" })?.value == "ntfset_relay" else {
                    return TestHTTPResponse(body: JSON.object(["data": [], "meta": ["pagination": ["has_more": false]]]).serialized())
                }
                let after = url.queryItems?.first { $0.name == "after" }?.value
                var list = notifications.value
                if let after, let index = list.firstIndex(where: { $0["id"]?.stringValue == after }) { list = Array(list[(index + 1)...]) }
                let page = Array(list.prefix(2))
                let document: JSON = ["data": .array(page), "meta": ["request_id": "r", "pagination": ["per_page": 2, "has_more": .bool(list.count > 2)]]]
                return TestHTTPResponse(body: document.serialized())
            }
            let parts = url.path.split(separator: "/").map(String.init)
            if request.method == "POST", parts.count == 3, parts[0] == "notifications", parts[2] == "replay",
                let notification = notifications.value.first(where: { $0["id"]?.stringValue == parts[1] }), let payload = notification["payload"]
            {
                replays.withLock { $0.append(parts[1]) }
                // Paddle sends the notification again, signed, to the destination.
                let body = payload.serialized()
                let header = WebhookSigning.paddleHeader(body: body, secret: PaddleRecoverTests.secret, timestamp: Int64(Date().timeIntervalSince1970))
                _ = try? await HTTPClient().send(
                    "POST", ingest.value + "/v1/notifications/paddle/demo", headers: [("Content-Type", "application/json"), ("Paddle-Signature", header)],
                    body: body)
                return TestHTTPResponse(status: 202, text: #"{"data": {"notification_id": "ntf_replayed"}, "meta": {"request_id": "r"}}"#)
            }
            return TestHTTPResponse(status: 404, text: #"{"error": {"type": "request_error", "code": "not_found"}}"#)
        }
    }

    static func notification(_ id: String, event: String, type: String, data: JSON, occurred: String) -> JSON {
        [
            "id": .string(id), "type": .string(type), "status": "failed", "origin": "event", "occurred_at": .string(occurred),
            "payload": ["event_id": .string(event), "event_type": .string(type), "occurred_at": .string(occurred), "notification_id": .string(id), "data": data],
        ]
    }

    @Test func eventsMissedDuringAnOutageAreReplayedByPaddleOnce() async throws {
        let paddle = FakePaddle()
        let api = try await TestHTTPServer { request in await paddle.answer(request) }
        var subscription = try #require(WebPurchaseTests.paddleSubscription.objectValue, "the Paddle subscription fixture is a JSON object")
        subscription["custom_data"] = ["app_user_id": "user-p"]
        subscription["transaction_id"] = "txn_p1"
        var canceled = subscription
        canceled["status"] = "canceled"
        canceled["canceled_at"] = "2026-11-27T00:00:00Z"
        let day = Timestamp.rfc3339(milliseconds: Int64(Date().timeIntervalSince1970 * 1000) - 3_600_000)
        paddle.notifications.withLock {
            $0 = [
                Self.notification("ntf_01", event: "evt_p1", type: "subscription.created", data: .object(subscription), occurred: day),
                Self.notification("ntf_02", event: "evt_p2", type: "subscription.canceled", data: .object(canceled), occurred: day),
                // Paddle's retry of the same event: one replay for both.
                Self.notification("ntf_03", event: "evt_p2", type: "subscription.canceled", data: .object(canceled), occurred: day),
                Self.notification("ntf_04", event: "evt_p3", type: "customer.updated", data: ["id": "ctm_web"], occurred: day),
            ]
        }
        let text = """
            ingest: { listen: "127.0.0.1:0", ackTimeout: 10s }
            backend: { apiKey: "test-backend-key", database: backend.sqlite, listen: "127.0.0.1:0" }
            apps:
              - key: demo
                projectId: 1
                applicationId: 1
                paddle: { secretKeys: ["\(Self.secret)"], environment: SANDBOX, api: { apiKey: "\(Self.apiKey)", baseUrl: "\(api.baseURL)", notificationSettingId: ntfset_relay } }
                products:
                  - { productId: pri_pro_monthly, store: PADDLE, entitlements: [pro] }
            money: { exchangeRates: \(Fixtures.path("exchange-rates.json")) }
            delivery: { allowPrivateNetworks: true }
            shutdownTimeout: 20s
            """
        let configuration = try AppleRelayConfiguration.parse(text, name: "paddle-recover")
        let relay = try await TestRelay(configuration: configuration, log: .embedded)
        paddle.ingest.withLock { $0 = relay.baseURL }
        let backendURL = await relay.environment.process.backendAddress.value()
        @Sendable func events(_ type: String) async throws -> [JSON] { try await relay.events(type) }
        // Only the first event reached the relay live.
        let body = paddle.notifications.value[0]["payload"]!.serialized()
        let header = WebhookSigning.paddleHeader(body: body, secret: Self.secret, timestamp: Int64(Date().timeIntervalSince1970))
        #expect(try await relay.http.send(
            "POST", relay.baseURL + "/v1/notifications/paddle/demo", headers: [("Content-Type", "application/json"), ("Paddle-Signature", header)], body: body
        ).status == 200)
        try await waitUntil("the live event applied") { try await events("initial_purchase").count == 1 }

        let commands = try PaddleHistoryCommands(configuration: configuration, appKey: "demo", backendURL: backendURL, logger: Logger(label: "test"))
        let since = Int64(Date().timeIntervalSince1970 * 1000) - 86_400_000
        let summary = try await commands.recover(since: since, until: nil)
        #expect(summary == PaddleHistoryCommands.RecoverSummary(found: 2, alreadyProcessed: 1, replayed: 1))
        #expect(paddle.replays.value == ["ntf_02"])
        #expect(paddle.listCalls.value.count == 2)
        #expect(paddle.listCalls.value.last?.contains("after=ntf_02") == true, "\(paddle.listCalls.value)")
        // Paddle's replay went through the ingest: the subscription's end, once, with the event's own id.
        try await waitUntil("the replayed event applied") { try await !events("expiration").isEmpty }
        #expect(try await events("expiration").first?["data"]?["id"] == "paddle:evt_p2:expiration")
        let again = try await commands.recover(since: since, until: nil)
        #expect(again == PaddleHistoryCommands.RecoverSummary(found: 2, alreadyProcessed: 2, replayed: 0))
        #expect(try await events("expiration").count == 1)
        try await relay.stop()
        await api.stop()
    }
}
