import Foundation
import RelayApp
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayTestSupport
import Testing

/// Play purchases an app hands over (`{"store": "PLAY_STORE", "productId", "purchaseToken"}`) on a whole
/// relay (embedded log) against a fake Play Developer API over real HTTP that answers as Google's does
/// (SubscriptionPurchaseV2, ProductPurchase, acknowledge refusing a second acknowledgement) and records
/// every request.
@Suite(.serialized) struct GooglePurchaseTests {
    static let publicKey = "pk_demo_android_0123456789"

    /// The fake's purchases: subscription tokens and one-time product tokens of package com.example.app,
    /// with their acknowledgement state, which `:acknowledge` changes.
    final class FakePlay: Sendable {
        let subscriptions: LockedBox<[String: JSON]>
        let products: LockedBox<[String: JSON]>
        /// Every acknowledgement answers 400, as Play does for a purchase it will not acknowledge.
        let refuseAcknowledgements = LockedBox(false)
        /// The Voided Purchases API's list, served two a page; its first call answers 429.
        let voided = LockedBox<[JSON]>([])
        let voidedCalls = LockedBox<[String]>([])
        /// Tokens whose next `subscriptionsv2.get` answers 429 with `Retry-After: 120` (a quota), once.
        let throttled = LockedBox<Set<String>>([])

        init(subscriptions: [String: JSON], products: [String: JSON] = [:]) {
            self.subscriptions = LockedBox(subscriptions)
            self.products = LockedBox(products)
        }

        static func start(subscriptions: [String: JSON], products: [String: JSON] = [:]) async throws -> (FakePlay, TestHTTPServer) {
            let play = FakePlay(subscriptions: subscriptions, products: products)
            let server = try await TestHTTPServer { request in play.answer(request) }
            return (play, server)
        }

        func answer(_ request: TestHTTPRequest) -> TestHTTPResponse {
            if request.path.hasSuffix("/token") { return TestHTTPResponse(text: #"{"access_token": "play-token", "expires_in": 3600}"#) }
            guard request.headers["authorization"] == "Bearer play-token" else { return Self.error(401, "UNAUTHENTICATED") }
            let prefix = "/androidpublisher/v3/applications/com.example.app/purchases/"
            guard request.path.hasPrefix(prefix) else { return Self.error(404, "NOT_FOUND") }
            if request.method == "GET", request.path.hasPrefix(prefix + "voidedpurchases?") { return voidedPage(request.path) }
            let rest = request.path.dropFirst(prefix.count).split(separator: "/").map { String($0).removingPercentEncoding ?? String($0) }
            switch (request.method, rest.count) {
            case ("GET", 3) where rest[0] == "subscriptionsv2":
                if throttled.withLock({ $0.remove(rest[2]) != nil }) {
                    var response = Self.error(429, "RESOURCE_EXHAUSTED", "Quota exceeded")
                    response.headers.append(("Retry-After", "120"))
                    return response
                }
                guard let purchase = subscriptions.value[rest[2]] else { return Self.error(404, "NOT_FOUND") }
                return TestHTTPResponse(body: purchase.serialized())
            case ("GET", 4) where rest[0] == "products":
                guard let purchase = products.value[rest[3]], purchase["productId"]?.stringValue == rest[1] else { return Self.error(404, "NOT_FOUND") }
                return TestHTTPResponse(body: purchase.serialized())
            case ("POST", 4) where rest[3].hasSuffix(":acknowledge"):
                if refuseAcknowledgements.value {
                    return Self.error(400, "FAILED_PRECONDITION", "The purchase is not in a valid state to perform the desired operation.")
                }
                let token = String(rest[3].dropLast(":acknowledge".count))
                if rest[0] == "subscriptions" {
                    return Self.acknowledge(subscriptions, token, productId: rest[1], pending: { $0["acknowledgementState"] == "ACKNOWLEDGEMENT_STATE_PENDING" }) {
                        $0["lineItems"]?.arrayValue?.first?["productId"]?.stringValue
                    } mark: { $0["acknowledgementState"] = "ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED" }
                }
                return Self.acknowledge(products, token, productId: rest[1], pending: { $0["acknowledgementState"] == 0 }) {
                    $0["productId"]?.stringValue
                } mark: { $0["acknowledgementState"] = 1 }
            default:
                return Self.error(404, "NOT_FOUND")
            }
        }

        func voidedPage(_ path: String) -> TestHTTPResponse {
            let calls = voidedCalls.withLock { calls -> Int in
                calls.append(path)
                return calls.count
            }
            if calls == 1 { return Self.error(429, "RESOURCE_EXHAUSTED", "Quota exceeded") }
            let items = URLComponents(string: "http://play.test" + path)?.queryItems ?? []
            let start = items.first { $0.name == "token" }.flatMap { Int($0.value ?? "") } ?? 0
            let list = voided.value
            var page: [String: JSON] = ["voidedPurchases": .array(Array(list.dropFirst(start).prefix(2)))]
            if start + 2 < list.count { page["tokenPagination"] = ["nextPageToken": .string(String(start + 2))] }
            return TestHTTPResponse(body: JSON.object(page).serialized())
        }

        static func acknowledge(
            _ box: LockedBox<[String: JSON]>, _ token: String, productId: String, pending: (JSON) -> Bool, product: (JSON) -> String?,
            mark: (inout [String: JSON]) -> Void
        ) -> TestHTTPResponse {
            box.withLock { purchases in
                guard let purchase = purchases[token], product(purchase) == productId else { return Self.error(404, "NOT_FOUND") }
                // Google refuses a second acknowledgement.
                guard pending(purchase), case .object(var members) = purchase else {
                    return Self.error(400, "FAILED_PRECONDITION", "The purchase is not in a valid state to perform the desired operation.")
                }
                mark(&members)
                purchases[token] = .object(members)
                return TestHTTPResponse(text: "")
            }
        }

        static func error(_ status: Int, _ code: String, _ message: String = "error") -> TestHTTPResponse {
            TestHTTPResponse(status: status, text: JSON.object(["error": ["code": .integer(Int64(status)), "message": .string(message), "status": .string(code)]]).serialized().string)
        }
    }

    static func subscription(
        user: String? = nil, acknowledged: Bool = false, order: String = "GPA.3300-0000-0000-00001", state: String = "SUBSCRIPTION_STATE_ACTIVE"
    ) -> JSON {
        var purchase: [String: JSON] = [
            "kind": "androidpublisher#subscriptionPurchaseV2", "subscriptionState": .string(state),
            "startTime": "2030-01-01T00:00:00Z", "regionCode": "US",
            "acknowledgementState": acknowledged ? "ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED" : "ACKNOWLEDGEMENT_STATE_PENDING",
            "lineItems": [[
                "productId": "pro_monthly", "expiryTime": "2099-02-01T00:00:00Z", "offerDetails": ["basePlanId": "monthly"],
                "autoRenewingPlan": ["autoRenewEnabled": true, "recurringPrice": ["currencyCode": "USD", "units": "4", "nanos": 990000000]],
                "latestSuccessfulOrderId": .string(order),
            ]],
        ]
        if let user { purchase["externalAccountIdentifiers"] = ["obfuscatedExternalAccountId": .string(user)] }
        return .object(purchase)
    }

    static func product(order: String = "GPA.3300-0000-0000-00009") -> JSON {
        [
            "kind": "androidpublisher#productPurchase", "productId": "coins_100", "purchaseTimeMillis": "1900000000000", "purchaseState": 0,
            "consumptionState": 0, "orderId": .string(order), "purchaseType": 0, "acknowledgementState": 0, "regionCode": "US",
        ]
    }

    struct Harness {
        let relay: TestRelay
        let backendURL: String
        let play: FakePlay
        let api: TestHTTPServer

        func hand(_ user: String, productId: String = "pro_monthly", token: String) async throws -> (Int, JSON) {
            let response = try await relay.http.send(
                "POST", backendURL + "/subscriptions-api/public/v1/users/\(user)/purchases",
                headers: [("Authorization", "Bearer \(GooglePurchaseTests.publicKey)"), ("Content-Type", "application/json")],
                body: JSON.object(["store": "PLAY_STORE", "productId": .string(productId), "purchaseToken": .string(token)]).serialized())
            return (response.status, (try? JSON.parse(response.body)) ?? .null)
        }

        func events(_ type: String) async throws -> [JSON] {
            try await relay.settledEvents(type)
        }

        func acknowledgements() -> [TestHTTPRequest] { api.requests.filter { $0.method == "POST" && $0.path.hasSuffix(":acknowledge") } }

        func state(_ token: String) async throws -> SubscriptionState? {
            let response = try await relay.http.send(
                "GET", backendURL + "/subscriptions-api/internal/v1/subscriptions/google/\(token)", headers: [("Authorization", "Bearer test-backend-key")])
            guard response.status == 200 else { return nil }
            return try SubscriptionState(json: try JSON.parse(response.body))
        }

        func entitlements(_ user: String) async throws -> [String] {
            let response = try await relay.http.send(
                "GET", backendURL + "/subscriptions-api/public/v1/users/\(user)/entitlements",
                headers: [("Authorization", "Bearer \(GooglePurchaseTests.publicKey)")])
            return try JSON.parse(response.body)["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } ?? []
        }

        /// Play's own SUBSCRIPTION_PURCHASED of `token`, pushed through the ingest.
        func playNotification(token: String, messageId: String) async throws {
            var notification = GooglePushSigner.developerNotification()
            if case .object(var members) = notification, case .object(var sub) = members["subscriptionNotification"] {
                sub["purchaseToken"] = .string(token)
                members["subscriptionNotification"] = .object(sub)
                notification = .object(members)
            }
            let claims = GooglePushSigner.claims(issuedAt: Int64(Date().timeIntervalSince1970), overrides: ["aud": "https://relay.test/google"])
            let response = try await relay.http.send(
                "POST", relay.baseURL + "/v1/notifications/google/demo",
                headers: [("Content-Type", "application/json"), ("Authorization", "Bearer \(GooglePushSigner().token(claims))")],
                body: GooglePushSigner.envelope(notification, messageId: messageId))
            #expect(response.status == 200)
        }

        func stop() async throws {
            try await relay.stop()
            await api.stop()
        }
    }

    static func start(subscriptions: [String: JSON], products: [String: JSON] = [:], acknowledge: Bool = true) async throws -> Harness {
        let (play, api) = try await FakePlay.start(subscriptions: subscriptions, products: products)
        let text = """
            ingest: { listen: "127.0.0.1:0", ackTimeout: 10s }
            backend: { apiKey: "test-backend-key", database: backend.sqlite, listen: "127.0.0.1:0" }
            apps:
              - key: demo
                projectId: 1
                applicationId: 1
                publicApiKeys: ["\(publicKey)"]
                google:
                  packageName: com.example.app
                  pushAudience: "https://relay.test/google"
                  pushServiceAccount: "pubsub-push@example.iam.gserviceaccount.com"
                  jwks: \(Fixtures.path("google/jwks.json"))
                  playApi: { baseUrl: "\(api.baseURL)", tokenUrl: "\(api.baseURL)/token", serviceAccountKey: \(Fixtures.path("google/service-account.json")), acknowledgePurchases: \(acknowledge) }
                products:
                  - { productId: pro_monthly, store: PLAY_STORE, entitlements: [pro] }
                  - { productId: coins_100, store: PLAY_STORE, entitlements: [coins] }
            money: { exchangeRates: \(Fixtures.path("exchange-rates.json")) }
            delivery: { allowPrivateNetworks: true }
            shutdownTimeout: 20s
            """
        let relay = try await TestRelay(configuration: try AppleRelayConfiguration.parse(text, name: "google-purchases"), log: .embedded)
        return Harness(relay: relay, backendURL: await relay.environment.process.backendAddress.value(), play: play, api: api)
    }

    @Test func aHandedOverSubscriptionGivesAccessAndIsAcknowledgedOnce() async throws {
        let harness = try await Self.start(subscriptions: ["token-1": Self.subscription()])
        let (status, answer) = try await harness.hand("user-1", token: "token-1")
        #expect(status == 200, "\(answer)")
        #expect(answer["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } == ["pro"], "\(answer)")
        try await waitUntil("the acknowledgement") { harness.acknowledgements().count == 1 }
        let ack = try #require(harness.acknowledgements().first)
        #expect(ack.path == "/androidpublisher/v3/applications/com.example.app/purchases/subscriptions/pro_monthly/tokens/token-1:acknowledge")
        #expect(ack.headers["authorization"] == "Bearer play-token")
        #expect(harness.play.subscriptions.value["token-1"]?["acknowledgementState"] == "ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED")
        // Handed over again (an app's retry): the user has it; nothing is appended, nothing acknowledged again.
        let records = try await harness.relay.records(topic: harness.relay.configuration.topics.notifications).count
        #expect(try await harness.hand("user-1", token: "token-1").0 == 200)
        #expect(try await harness.relay.records(topic: harness.relay.configuration.topics.notifications).count == records)
        #expect(harness.acknowledgements().count == 1)
        #expect(try await harness.events("initial_purchase").count == 1)
        try await harness.stop()
    }

    @Test func aHandOverThenPlaysNotificationAndTheReverseSendOneInitialPurchaseEach() async throws {
        let harness = try await Self.start(subscriptions: ["token-2": Self.subscription(order: "GPA.2"), "token-3": Self.subscription(order: "GPA.3")])
        // The hand-over first, then Play's notification.
        #expect(try await harness.hand("user-2", token: "token-2").0 == 200)
        try await harness.playNotification(token: "token-2", messageId: "m-2")
        try await waitUntil("Play's notification applied") { try await harness.state("token-2")?.recentNotifications.count == 2 }
        // Play's notification first, then the hand-over.
        try await harness.playNotification(token: "token-3", messageId: "m-3")
        try await waitUntil("Play's notification applied") { try await harness.state("token-3") != nil }
        #expect(try await harness.hand("user-3", token: "token-3").0 == 200)
        let purchases = try await harness.events("initial_purchase")
        #expect(purchases.compactMap { $0["data"]?["originalTransactionId"]?.stringValue }.sorted() == ["token-2", "token-3"], "\(purchases)")
        #expect(try await harness.state("token-3")?.originalAppUserId == "user-3")
        try await harness.stop()
    }

    @Test func aTokenOfAnotherPackageOrProductIsRefusedWithTheReason() async throws {
        let harness = try await Self.start(subscriptions: ["token-4": Self.subscription()])
        var (status, answer) = try await harness.hand("user-4", token: "token-of-another-app")
        #expect(status == 400)
        #expect(answer["error"] == "invalid_purchase")
        #expect(answer["reason"] == "purchase_not_found", "\(answer)")
        (status, answer) = try await harness.hand("user-4", productId: "other_product", token: "token-4")
        #expect(status == 400)
        #expect(answer["reason"] == "wrong_product", "\(answer)")
        #expect(try await harness.relay.records(topic: harness.relay.configuration.topics.notifications).isEmpty)
        #expect(harness.acknowledgements().isEmpty)
        try await harness.stop()
    }

    @Test func aOneTimeProductIsReadAndAcknowledgedAsAProduct() async throws {
        let harness = try await Self.start(subscriptions: [:], products: ["coin-token": Self.product()])
        let (status, answer) = try await harness.hand("user-5", productId: "coins_100", token: "coin-token")
        #expect(status == 200, "\(answer)")
        #expect(answer["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } == ["coins"], "\(answer)")
        try await waitUntil("the acknowledgement") { harness.acknowledgements().count == 1 }
        #expect(harness.acknowledgements().first?.path.hasSuffix("/purchases/products/coins_100/tokens/coin-token:acknowledge") == true)
        #expect(try await harness.events("non_renewing_purchase").count == 1)
        try await harness.stop()
    }

    @Test func onlyAPurchaseThatGivesAUserAccessIsAcknowledged() async throws {
        let harness = try await Self.start(subscriptions: [
            "token-7": Self.subscription(order: "GPA.7"), "token-8": Self.subscription(order: "GPA.8", state: "SUBSCRIPTION_STATE_PENDING"),
        ])
        // Play's notification of a purchase no user has (no obfuscated account id): left to Play's refund.
        try await harness.playNotification(token: "token-7", messageId: "m-7")
        try await waitUntil("its events") { try await harness.events("initial_purchase").count == 1 }
        #expect(harness.acknowledgements().isEmpty)
        // Handed over by the app: a user has it now, and it is acknowledged.
        #expect(try await harness.hand("user-7", token: "token-7").0 == 200)
        try await waitUntil("the acknowledgement") { harness.acknowledgements().count == 1 }
        // A purchase still pending payment gives no access: Play would refuse, so it is not acknowledged, and
        // the worker goes on (its status change is out).
        #expect(try await harness.hand("user-8", token: "token-8").0 == 200)
        try await waitUntil("the worker done with it") {
            try await harness.relay.records(topic: harness.relay.configuration.topics.events).count >= 3
                && harness.api.requests.filter { $0.path.hasSuffix("/tokens/token-8") }.count >= 2
        }
        #expect(harness.acknowledgements().count == 1)
        try await harness.stop()
    }

    @Test func aRefusedAcknowledgementHoldsNothingUp() async throws {
        let harness = try await Self.start(subscriptions: ["token-9": Self.subscription(order: "GPA.9")])
        // Play answers 400 to every acknowledgement (as for a purchase it will not acknowledge).
        harness.play.refuseAcknowledgements.withLock { $0 = true }
        #expect(try await harness.hand("user-9", token: "token-9").0 == 200)
        // The record is done (its events are out), not retried for ever behind the refusal.
        try await waitUntil("its events") { try await harness.events("initial_purchase").count == 1 }
        #expect(harness.acknowledgements().count == 1)
        #expect(harness.play.subscriptions.value["token-9"]?["acknowledgementState"] == "ACKNOWLEDGEMENT_STATE_PENDING")
        let metrics = String(decoding: try await harness.relay.get("/metrics").body, as: UTF8.self)
        #expect(metrics.contains(#"relay_play_api_errors_total{kind="rejected"}"#), "\(metrics.split(separator: "\n").filter { $0.contains("play") })")
        try await harness.stop()
    }

    @Test func aPlanChangeOfATransferredSubscriptionStaysWithTheUserItWasTransferredTo() async throws {
        // Bought by user-0 (Play carries user-0), restored by user-1: under `transfer` it is user-1's.
        var upgraded = Self.subscription(user: "user-0", acknowledged: true, order: "GPA.11")
        if case .object(var members) = upgraded {
            members["linkedPurchaseToken"] = "token-10"
            members["lineItems"] = [[
                "productId": "pro_monthly", "expiryTime": "2099-03-01T00:00:00Z", "offerDetails": ["basePlanId": "monthly"],
                "autoRenewingPlan": ["autoRenewEnabled": true], "latestSuccessfulOrderId": "GPA.11",
            ]]
            upgraded = .object(members)
        }
        let harness = try await Self.start(subscriptions: ["token-10": Self.subscription(user: "user-0", order: "GPA.10"), "token-11": upgraded])
        try await harness.playNotification(token: "token-10", messageId: "m-10")
        try await waitUntil("Play's notification applied") { try await harness.state("token-10") != nil }
        #expect(try await harness.entitlements("user-0") == ["pro"])
        #expect(try await harness.hand("user-1", token: "token-10").0 == 200)
        #expect(try await harness.entitlements("user-0") == [])
        // The plan change: a new token whose linkedPurchaseToken is the transferred one. Play still names
        // user-0, but the subscription is user-1's.
        try await harness.playNotification(token: "token-11", messageId: "m-11")
        try await waitUntil("the plan change applied") { try await harness.state("token-11") != nil }
        #expect(try await harness.state("token-11")?.ownerAppUserId == "user-1")
        #expect(try await harness.entitlements("user-1") == ["pro"])
        #expect(try await harness.entitlements("user-0") == [])
        try await harness.stop()
    }

    @Test func withoutTheSettingTheRelayAcknowledgesNothing() async throws {
        let harness = try await Self.start(subscriptions: ["token-6": Self.subscription()], acknowledge: false)
        #expect(try await harness.hand("user-6", token: "token-6").0 == 200)
        try await harness.playNotification(token: "token-6", messageId: "m-6")
        try await waitUntil("Play's notification applied") { try await harness.state("token-6")?.recentNotifications.count == 2 }
        #expect(harness.acknowledgements().isEmpty)
        try await harness.stop()
    }
}

extension [UInt8] {
    var string: String { String(decoding: self, as: UTF8.self) }
}
