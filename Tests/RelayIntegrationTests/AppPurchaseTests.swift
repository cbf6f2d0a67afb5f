import Foundation
import RelayApp
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayTestSupport
import Testing

/// Purchases an app hands over (`POST .../users/{id}/purchases`) on a whole relay (embedded log), with
/// StoreKit 2 transactions signed by the test Apple chain: access, aliases, the store's own notification
/// of the same purchase, and transfers under both policies.
@Suite(.serialized) struct AppPurchaseTests {
    let signer = AppleSigner()
    static let publicKey = "pk_demo_ios_0123456789"

    static func configuration(policy: String = "transfer") throws -> RelayConfiguration {
        try AppleRelayConfiguration.parse(
            AppleRelayConfiguration.text(app: [#"publicApiKeys: ["\#(publicKey)"]"#, "transferPolicy: \(policy)"]), name: "app-purchases")
    }

    /// A first purchase of a subscription (its transaction is its original one).
    static func transaction(id: String = "2000000500000001", original: String? = nil, token: String? = nil, bundleId: String = "com.example.app")
        -> JSON
    {
        var transaction = AppleSigner.transaction(bundleId: bundleId)
        guard case .object(var members) = transaction else { return transaction }
        members["transactionId"] = .string(id)
        members["originalTransactionId"] = .string(original ?? id)
        if let token { members["appAccountToken"] = .string(token) }
        transaction = .object(members)
        return transaction
    }

    struct Harness {
        let relay: TestRelay
        let backendURL: String

        func hand(_ user: String, _ body: JSON, key: String = AppPurchaseTests.publicKey) async throws -> (Int, JSON) {
            let response = try await relay.http.send(
                "POST", backendURL + "/subscriptions-api/public/v1/users/\(Self.escaped(user))/purchases",
                headers: [("Authorization", "Bearer \(key)"), ("Content-Type", "application/json")], body: body.serialized())
            return (response.status, (try? JSON.parse(response.body)) ?? .null)
        }

        func handApple(_ user: String, _ signed: String) async throws -> (Int, JSON) {
            try await hand(user, ["store": "APP_STORE", "signedTransaction": .string(signed)])
        }

        func link(_ user: String, _ aliases: [String]) async throws -> Int {
            try await relay.http.send(
                "POST", backendURL + "/subscriptions-api/public/v1/users/\(Self.escaped(user))/aliases",
                headers: [("Authorization", "Bearer \(AppPurchaseTests.publicKey)"), ("Content-Type", "application/json")],
                body: JSON.object(["aliasIds": .array(aliases.map(JSON.string))]).serialized()
            ).status
        }

        func entitlements(_ user: String) async throws -> [String] {
            let response = try await relay.http.send(
                "GET", backendURL + "/subscriptions-api/public/v1/users/\(Self.escaped(user))/entitlements",
                headers: [("Authorization", "Bearer \(AppPurchaseTests.publicKey)")])
            return try JSON.parse(response.body)["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } ?? []
        }

        /// Every event, once the worker has processed everything appended so far (a hand-over answers when its
        /// state is written, before its events are produced).
        func events() async throws -> [JSON] {
            try await relay.waitForWorker()
            return try await relay.records(topic: relay.configuration.topics.events).compactMap { try? JSON.parse($0.value) }
        }

        func events(_ type: String) async throws -> [JSON] {
            try await events().filter { $0["type"]?.stringValue == type }
        }

        func statusChanges(for user: String) async throws -> [JSON] {
            try await events("subscription_status_did_change").filter { $0["data"]?["appUserId"] == .string(user) }
        }

        func notificationCount() async throws -> Int {
            try await relay.records(topic: relay.configuration.topics.notifications).count
        }

        /// The store's own SUBSCRIBED (INITIAL_BUY) notification of `transaction`, through the ingest.
        func storeNotification(
            _ transaction: JSON, signer: AppleSigner, uuid: String = "5b6d8e2c-1f0a-4c1e-9a57-3f2f0b6a9c11", type: String = "SUBSCRIBED",
            signedDate: Int64 = Fixtures.signedDate
        ) async throws {
            let subtype: String? = type == "SUBSCRIBED" ? "INITIAL_BUY" : nil
            guard case .object(var payload) = signer.notificationPayload(type: type, subtype: subtype, signedDate: signedDate, transaction: transaction) else { return }
            if type != "SUBSCRIBED" { payload["notificationUUID"] = .string(UUID().uuidString.lowercased()); payload["subtype"] = nil }
            if type == "SUBSCRIBED" { payload["notificationUUID"] = .string(uuid) }
            let response = try await relay.http.send(
                "POST", relay.baseURL + "/v1/notifications/apple/demo", headers: [("Content-Type", "application/json")],
                body: signer.body(.object(payload)))
            #expect(response.status == 200)
        }

        /// The stored state of an Apple subscription, through the backend's secret route; nil when none.
        func state(_ id: String) async throws -> SubscriptionState? {
            let response = try await relay.http.send(
                "GET", backendURL + "/subscriptions-api/internal/v1/subscriptions/apple/\(id)", headers: [("Authorization", "Bearer test-backend-key")])
            guard response.status == 200 else { return nil }
            return try SubscriptionState(json: try JSON.parse(response.body))
        }

        static func escaped(_ id: String) -> String {
            id.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? id
        }

        func stop() async throws { try await relay.stop() }
    }

    static func start(policy: String = "transfer") async throws -> Harness {
        let relay = try await TestRelay(configuration: try configuration(policy: policy), log: .embedded)
        return Harness(relay: relay, backendURL: await relay.environment.process.backendAddress.value())
    }

    @Test func anAnonymousPurchaseHandedOverCountsForTheUserAfterLogin() async throws {
        let harness = try await Self.start()
        let alias = "$SuperwallAlias:7C1A0E59-1A2B-4C3D-8E9F-001122334455"
        let (status, answer) = try await harness.handApple(alias, signer.sign(Self.transaction()))
        #expect(status == 200, "\(answer)")
        #expect(answer["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } == ["pro"], "\(answer)")
        #expect(answer["customerInfo"]?["subscriptions"]?.arrayValue?.first?["transactionId"] == "2000000500000001", "\(answer)")
        // Login: the alias is the user's from now on, with what it bought.
        #expect(try await harness.entitlements("user-1").isEmpty)
        #expect(try await harness.link("user-1", [alias]) == 200)
        #expect(try await harness.entitlements("user-1") == ["pro"])
        // The purchase's events name the id that handed it over.
        let purchases = try await harness.events("initial_purchase")
        #expect(purchases.count == 1)
        #expect(purchases.first?["data"]?["originalAppUserId"] == .string(alias), "\(purchases)")
        #expect(purchases.first?["data"]?["source"]?["store"] == "apple")
        #expect(try await harness.statusChanges(for: alias).count == 1)
        try await harness.stop()
    }

    @Test func aPurchaseHandedOverThenTheStoresNotificationSendsOneInitialPurchase() async throws {
        let harness = try await Self.start()
        let transaction = Self.transaction(id: "2000000500000002")
        let (status, _) = try await harness.handApple("user-2", signer.sign(transaction))
        #expect(status == 200)
        try await harness.storeNotification(transaction, signer: signer)
        // The store's notification applied (the worker wrote it): then count.
        try await waitUntil("both applied") { try await harness.state("2000000500000002")?.recentNotifications.count == 2 }
        #expect(try await harness.events("initial_purchase").count == 1)
        #expect(try await harness.statusChanges(for: "user-2").count == 1)
        #expect(try await harness.entitlements("user-2") == ["pro"])
        try await harness.stop()
    }

    @Test func theStoresNotificationThenTheHandOverSendsOneInitialPurchaseAndGivesTheUserAccess() async throws {
        let harness = try await Self.start()
        let transaction = Self.transaction(id: "2000000500000003")
        try await harness.storeNotification(transaction, signer: signer)
        try await waitUntil("the store's notification applied") { try await harness.state("2000000500000003") != nil }
        // Bought without an appAccountToken: nobody's yet.
        #expect(try await harness.entitlements("user-3").isEmpty)
        let (status, answer) = try await harness.handApple("user-3", signer.sign(transaction))
        #expect(status == 200, "\(answer)")
        #expect(answer["entitlements"]?.arrayValue?.count == 1)
        #expect(try await harness.events("initial_purchase").count == 1)
        // The user gained access by the hand-over: a status change names the user.
        let changes = try await harness.statusChanges(for: "user-3")
        #expect(changes.count == 1, "\(changes)")
        #expect(changes.first?["data"]?["from"]?["status"] == "INACTIVE")
        #expect(changes.first?["data"]?["to"]?["status"] == "ACTIVE")
        try await harness.stop()
    }

    @Test func refusedTransactionsAnswer400WithTheReasonAndAppendNothing() async throws {
        let harness = try await Self.start()
        // Forged: a genuine JWS whose payload was swapped.
        let genuine = signer.sign(Self.transaction()).split(separator: ".").map(String.init)
        let forged = [genuine[0], Base64.encodeURL(Self.transaction(id: "999").serialized()), genuine[2]].joined(separator: ".")
        var (status, answer) = try await harness.handApple("user-4", forged)
        #expect(status == 400)
        #expect(answer["error"] == "invalid_purchase")
        #expect(answer["reason"] == "bad_signature", "\(answer)")
        // Another app's transaction, genuinely signed.
        (status, answer) = try await harness.handApple("user-4", signer.sign(Self.transaction(bundleId: "com.other.app")))
        #expect(status == 400)
        #expect(answer["reason"] == "wrong_bundle_id", "\(answer)")
        // Signed by a chain that does not lead to the configured root.
        let stranger = AppleSigner(chain: [Fixtures.appleChain[0], Fixtures.appleChain[1]])
        (status, answer) = try await harness.handApple("user-4", stranger.sign(Self.transaction()))
        #expect(status == 400)
        #expect(answer["reason"]?.stringValue.map { ["untrusted_chain", "malformed"].contains($0) } == true, "\(answer)")
        // Not a purchase at all.
        (status, answer) = try await harness.hand("user-4", ["store": "APP_STORE"])
        #expect(status == 400)
        (status, answer) = try await harness.hand("user-4", ["store": "AMAZON"])
        #expect(status == 400)
        #expect(try await harness.notificationCount() == 0)
        // Counted for the operator: the three refused App Store transactions and the body without one.
        let metrics = String(decoding: try await harness.relay.get("/metrics").body, as: UTF8.self)
        let refused = metrics.split(separator: "\n").filter {
            $0.hasPrefix("relay_backend_purchases_total{") && $0.contains(#"outcome="refused""#) && $0.contains(#"store="APP_STORE""#)
        }
        #expect(refused.count == 1 && refused.first?.hasSuffix(" 4") == true, "\(refused)")
        try await harness.stop()
    }

    @Test func aRestoreByASecondUserTransfersAccessUnderTransfer() async throws {
        let harness = try await Self.start()
        let signed = signer.sign(Self.transaction(id: "2000000500000005"))
        #expect(try await harness.handApple("user-a", signed).0 == 200)
        #expect(try await harness.entitlements("user-a") == ["pro"])
        let (status, answer) = try await harness.handApple("user-b", signed)
        #expect(status == 200, "\(answer)")
        #expect(answer["entitlements"]?.arrayValue?.count == 1)
        #expect(try await harness.entitlements("user-b") == ["pro"])
        #expect(try await harness.entitlements("user-a").isEmpty)
        // Both users hear of it; the transfer's events name where it came from.
        let gained = try await harness.statusChanges(for: "user-b")
        #expect(gained.count == 1, "\(gained)")
        #expect(gained.first?["data"]?["to"]?["status"] == "ACTIVE")
        #expect(gained.first?["data"]?["transferredFrom"] == "user-a")
        let changesOfA = try await harness.statusChanges(for: "user-a")
        let lost = changesOfA.filter { $0["data"]?["to"]?["status"] == "INACTIVE" }
        #expect(lost.count == 1, "\(changesOfA)")
        #expect(lost.first?["data"]?["transferredFrom"] == "user-a")
        // No second purchase: the payment was recorded with the first hand-over.
        #expect(try await harness.events("initial_purchase").count == 1)
        // The store's next notification (a renewal) keeps it with the user it was transferred to.
        var renewal = Self.transaction(id: "2000000500000015", original: "2000000500000005")
        if case .object(var members) = renewal {
            members["purchaseDate"] = .integer(Fixtures.signedDate + 2_592_000_000)
            members["expiresDate"] = .integer(Fixtures.signedDate + 5_184_000_000)
            members["signedDate"] = .integer(Fixtures.signedDate + 2_592_000_000)
            renewal = .object(members)
        }
        try await harness.storeNotification(renewal, signer: signer, type: "DID_RENEW", signedDate: Fixtures.signedDate + 2_592_000_000)
        try await waitUntil("the renewal applied") { try await harness.state("2000000500000005")?.lastTransactionId == "2000000500000015" }
        #expect(try await harness.entitlements("user-b") == ["pro"])
        #expect(try await harness.entitlements("user-a").isEmpty)
        #expect(try await harness.events("renewal").first?["data"]?["subscriptionStatus"]?["status"] == "ACTIVE")
        #expect(try await harness.statusChanges(for: "user-a").count == 2, "the renewal changes nothing for user-a")
        // And back again: the first user restores the latest transaction.
        #expect(try await harness.handApple("user-a", signer.sign(renewal)).0 == 200)
        #expect(try await harness.entitlements("user-a") == ["pro"])
        #expect(try await harness.entitlements("user-b").isEmpty)
        try await harness.stop()
    }

    @Test func aRevokedTransactionHandedOverTwiceCountsNoRefundAndGivesNoAccess() async throws {
        let harness = try await Self.start()
        var transaction = Self.transaction(id: "2000000500000009")
        if case .object(var members) = transaction {
            members["revocationDate"] = .integer(Fixtures.signedDate - 500)
            members["revocationReason"] = 1
            transaction = .object(members)
        }
        let signed = signer.sign(transaction)
        #expect(try await harness.handApple("user-r", signed).0 == 200)
        #expect(try await harness.handApple("user-r", signed).0 == 200)
        #expect(try await harness.entitlements("user-r").isEmpty)
        #expect(try await harness.events("cancellation").isEmpty)
        #expect(try await harness.state("2000000500000009")?.status == .refunded)
        try await harness.stop()
    }

    @Test func theSameUserHandingOverAgainAppendsNothing() async throws {
        let harness = try await Self.start()
        let signed = signer.sign(Self.transaction(id: "2000000500000010"))
        #expect(try await harness.handApple("user-l", signed).0 == 200)
        #expect(try await harness.link("user-l", ["$SuperwallDevice:L"]) == 200)
        let records = try await harness.notificationCount()
        // Every launch of the app, under any of the user's ids: answered from the state, nothing appended.
        for id in ["user-l", "$SuperwallDevice:L", "user-l"] {
            let (status, answer) = try await harness.handApple(id, signed)
            #expect(status == 200)
            #expect(answer["entitlements"]?.arrayValue?.count == 1, "\(answer)")
        }
        #expect(try await harness.notificationCount() == records)
        try await harness.stop()
    }

    @Test func aRestoreByASecondUserIsRefusedUnderKeepWithoutNamingTheOwner() async throws {
        let harness = try await Self.start(policy: "keep")
        let signed = signer.sign(Self.transaction(id: "2000000500000006"))
        #expect(try await harness.handApple("user-a", signed).0 == 200)
        let before = try await harness.notificationCount()
        let response = try await harness.relay.http.send(
            "POST", harness.backendURL + "/subscriptions-api/public/v1/users/user-b/purchases",
            headers: [("Authorization", "Bearer \(Self.publicKey)"), ("Content-Type", "application/json")],
            body: JSON.object(["store": "APP_STORE", "signedTransaction": .string(signed)]).serialized())
        #expect(response.status == 409)
        let text = String(decoding: response.body, as: UTF8.self)
        #expect(try JSON.parse(response.body)["error"] == "owned_by_another_user")
        #expect(!text.contains("user-a"), "\(text)")
        #expect(try await harness.notificationCount() == before)
        #expect(try await harness.entitlements("user-a") == ["pro"])
        #expect(try await harness.entitlements("user-b").isEmpty)
        // The owner's alias is the owner: no conflict.
        #expect(try await harness.link("user-a", ["$SuperwallDevice:D1"]) == 200)
        #expect(try await harness.handApple("$SuperwallDevice:D1", signed).0 == 200)
        try await harness.stop()
    }

    @Test func anAppAccountTokenOfAnotherUserIsThatUsersPurchaseUnderKeep() async throws {
        let harness = try await Self.start(policy: "keep")
        let token = "8c1a4e9b-1f2d-4a3b-9c8d-7e6f5a4b3c2d"
        let signed = signer.sign(Self.transaction(id: "2000000500000007", token: token))
        #expect(try await harness.handApple("user-c", signed).0 == 409)
        #expect(try await harness.handApple(token, signed).0 == 200)
        #expect(try await harness.entitlements(token) == ["pro"])
        // The same UUID in upper case (as an app may spell its user id) is the same user.
        let (status, answer) = try await harness.handApple(token.uppercased(), signed)
        #expect(status == 200)
        #expect(answer["entitlements"]?.arrayValue?.count == 1, "\(answer)")
        #expect(try await harness.entitlements(token.uppercased()) == ["pro"])
        try await harness.stop()
    }

    @Test func anotherAppsPublicKeyAndNoKeyAreRefused() async throws {
        let harness = try await Self.start()
        let signed = signer.sign(Self.transaction(id: "2000000500000008"))
        #expect(try await harness.hand("user-d", ["store": "APP_STORE", "signedTransaction": .string(signed)], key: "pk_unknown").0 == 401)
        let (status, _) = try await harness.relay.http.send(
            "POST", harness.backendURL + "/subscriptions-api/public/v1/users/user-d/purchases?applicationId=2",
            headers: [("Authorization", "Bearer \(Self.publicKey)"), ("Content-Type", "application/json")],
            body: JSON.object(["store": "APP_STORE", "signedTransaction": .string(signed)]).serialized()
        ).statusAndBody
        #expect(status == 403)
        #expect(try await harness.notificationCount() == 0)
        try await harness.stop()
    }
}

extension HTTPClientResponse {
    var statusAndBody: (Int, [UInt8]) { (status, body) }
}
