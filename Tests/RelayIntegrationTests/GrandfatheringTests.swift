import Foundation
import RelayApp
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayTestSupport
import Testing

/// Grandfathered access: `POST .../users/{id}/app-transaction` on the local backend of a whole relay
/// (embedded log), with AppTransactions signed by the test Apple chain.
@Suite(.serialized) struct GrandfatheringTests {
    let signer = AppleSigner()
    /// 2020-01-01T00:00:00Z, the second rule's `purchasedBefore`.
    static let cutoff: Int64 = 1_577_836_800_000

    /// A sandbox-only test app unless told (`environments`).
    static func configuration(environments: String = "[Sandbox]") throws -> RelayConfiguration {
        let rules = """
            grandfathering:
                    - { entitlements: [pro], originalAppVersionBelow: "2.0" }
                    - { entitlements: [legacy], purchasedBefore: "2020-01-01" }
            """
        return try AppleRelayConfiguration.parse(AppleRelayConfiguration.text(environments: environments, apple: [rules]), name: "grandfathering")
    }

    static func appTransaction(
        id: String = "704289572311504712", version: String = "1.4", purchased: Int64 = 1_600_000_000_000, bundleId: String = "com.example.app",
        environment: String = "Sandbox", signedDate: Int64 = Fixtures.signedDate, extra: [String: JSON] = [:]
    ) -> JSON {
        var object: [String: JSON] = [
            "receiptType": .string(environment), "environment": .string(environment), "appAppleId": 1234, "bundleId": .string(bundleId),
            "applicationVersion": "3.2", "originalApplicationVersion": .string(version), "originalPurchaseDate": .integer(purchased),
            "receiptCreationDate": .integer(signedDate - 5000), "requestDate": .integer(signedDate),
            "signedDate": .integer(signedDate), "appTransactionId": .string(id), "originalPlatform": "iOS",
        ]
        object.merge(extra) { $1 }
        return .object(object)
    }

    struct Harness {
        let relay: TestRelay
        let backendURL: String

        func post(_ user: String, _ signed: String, query: String = "") async throws -> (Int, JSON) {
            let response = try await relay.http.send(
                "POST", backendURL + "/subscriptions-api/public/v1/users/\(user)/app-transaction\(query)",
                headers: [("Authorization", "Bearer test-backend-key"), ("Content-Type", "application/json")],
                body: JSON.object(["signedAppTransaction": .string(signed)]).serialized())
            return (response.status, (try? JSON.parse(response.body)) ?? .null)
        }

        func get(_ path: String) async throws -> JSON {
            let response = try await relay.http.send("GET", backendURL + path, headers: [("Authorization", "Bearer test-backend-key")])
            return try JSON.parse(response.body)
        }

        func customerInfo(_ user: String) async throws -> JSON {
            try await get("/subscriptions-api/public/v1/users/\(user)/entitlements")
        }

        /// The records of `topic` so far, read from the beginning by a fresh group.
        func records(_ topic: String) async throws -> [ConsumedRecord] {
            try await relay.records(topic: topic)
        }

        /// Once the worker has processed everything appended so far: it writes a grant's state, which customer
        /// info shows, before it appends the grant's events.
        func statusChanges(for user: String) async throws -> [JSON] {
            try await relay.waitForWorker()
            return try await records(relay.configuration.topics.events).compactMap { try? JSON.parse($0.value) }.filter {
                $0["type"] == "subscription_status_did_change" && $0["data"]?["appUserId"] == .string(user)
            }
        }

        func stop() async throws { try await relay.stop() }
    }

    static func start(environments: String = "[Sandbox]") async throws -> Harness {
        let relay = try await TestRelay(configuration: try configuration(environments: environments), log: .embedded)
        return Harness(relay: relay, backendURL: await relay.environment.process.backendAddress.value())
    }

    @Test func aVersionRuleGrantsLifetimeEntitlementsThroughThePipelineOnce() async throws {
        let harness = try await Self.start()
        let signed = signer.sign(Self.appTransaction())
        let (status, answer) = try await harness.post("user-1", signed)
        #expect(status == 202, "\(answer)")
        #expect(answer == ["granted": true, "entitlements": ["pro"]])
        try await waitUntil("the grant in customer info") {
            try await harness.customerInfo("user-1")["entitlements"]?.arrayValue?.isEmpty == false
        }
        let info = try await harness.customerInfo("user-1")
        #expect(info["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } == ["pro"])
        let entitlement = try #require(info["customerInfo"]?["entitlements"]?.arrayValue?.first)
        #expect(entitlement["identifier"] == "pro")
        #expect(entitlement["isActive"] == true)
        #expect(entitlement["isLifetime"] == true, "\(entitlement)")
        #expect(info["customerInfo"]?["nonSubscriptions"]?.arrayValue?.first?["productId"] == "$grandfathered:0", "\(info)")
        #expect(info["customerInfo"]?["subscriptions"]?.arrayValue?.isEmpty == true)
        let changes = try await harness.statusChanges(for: "user-1")
        #expect(changes.count == 1, "\(changes)")
        #expect(changes.first?["data"]?["originalTransactionId"] == "app-transaction:704289572311504712")

        // Posted again: granted, nothing appended, no second status change.
        let before = try await harness.records(harness.relay.configuration.topics.notifications).count
        let (again, againAnswer) = try await harness.post("user-1", signed)
        #expect(again == 202)
        #expect(againAnswer == ["granted": true, "entitlements": ["pro"]])
        #expect(try await harness.records(harness.relay.configuration.topics.notifications).count == before)
        #expect(try await harness.statusChanges(for: "user-1").count == 1)
        try await harness.stop()
    }

    @Test func aPurchaseDateRuleGrantsItsEntitlements() async throws {
        let harness = try await Self.start()
        // Version 2.1 misses the first rule; bought before 2020 meets the second.
        let signed = signer.sign(Self.appTransaction(id: "800", version: "2.1", purchased: Self.cutoff - 1))
        let (status, answer) = try await harness.post("user-2", signed, query: "?applicationId=1")
        #expect(status == 202, "\(answer)")
        #expect(answer == ["granted": true, "entitlements": ["legacy"]])
        try await waitUntil("the grant in customer info") {
            try await harness.customerInfo("user-2")["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } == ["legacy"]
        }
        #expect(try await harness.statusChanges(for: "user-2").count == 1)
        try await harness.stop()
    }

    @Test func noMatchingRuleGrantsNothingAndAppendsNothing() async throws {
        let harness = try await Self.start()
        // 2.0 is not below 2.0, and 2020-01-01 is not before itself.
        let signed = signer.sign(Self.appTransaction(id: "900", version: "2.0", purchased: Self.cutoff))
        let (status, answer) = try await harness.post("user-3", signed)
        #expect(status == 200)
        #expect(answer == ["granted": false])
        #expect(try await harness.records(harness.relay.configuration.topics.notifications).isEmpty)
        try await harness.stop()
    }

    @Test func refusedAppTransactionsAnswer400WithTheReason() async throws {
        let harness = try await Self.start()
        // Forged: a valid JWS whose payload was swapped (an older version claimed).
        let genuine = signer.sign(Self.appTransaction(version: "2.5")).split(separator: ".").map(String.init)
        let forgedPayload = Base64.encodeURL(Self.appTransaction(version: "1.0").serialized())
        let forged = [genuine[0], forgedPayload, genuine[2]].joined(separator: ".")
        let cases: [(String, String)] = [
            (forged, "bad_signature"),
            (signer.sign(Self.appTransaction(bundleId: "com.other.app")), "wrong_bundle_id"),
            (signer.sign(Self.appTransaction(environment: "Production")), "wrong_environment"),
            (AppleSigner(key: "apple/rogue-leaf.key", chain: ["apple/rogue-leaf.pem", "apple/rogue-intermediate.pem", "apple/rogue-root.pem"])
                .sign(Self.appTransaction()), "untrusted_chain"),
        ]
        for (signed, reason) in cases {
            let (status, answer) = try await harness.post("user-4", signed)
            #expect(status == 400, "\(reason): \(answer)")
            #expect(answer["error"] == "invalid_app_transaction")
            #expect(answer["reason"] == .string(reason), "\(answer)")
        }
        // Without the backend key: 401.
        let unauthorized = try await harness.relay.http.send(
            "POST", harness.backendURL + "/subscriptions-api/public/v1/users/user-4/app-transaction",
            body: JSON.object(["signedAppTransaction": .string(signer.sign(Self.appTransaction()))]).serialized())
        #expect(unauthorized.status == 401)
        // An unknown application: 404.
        #expect(try await harness.post("user-4", signer.sign(Self.appTransaction()), query: "?applicationId=7").0 == 404)
        // A refunded app purchase (Apple's revocationDate/revocationReason): 403 revoked, even though a rule matches.
        let revoked = signer.sign(Self.appTransaction(extra: ["revocationDate": .integer(Fixtures.signedDate - 1000), "revocationReason": 0]))
        let (revokedStatus, revokedAnswer) = try await harness.post("user-4", revoked)
        #expect(revokedStatus == 403, "\(revokedAnswer)")
        #expect(revokedAnswer["error"] == "revoked", "\(revokedAnswer)")
        #expect(try await harness.records(harness.relay.configuration.topics.notifications).isEmpty)
        try await harness.stop()
    }

    /// Apple sets originalApplicationVersion to "1.0" in the sandbox, which TestFlight uses: a sandbox
    /// AppTransaction would meet a version rule for any tester. An app with Production takes Production
    /// AppTransactions only, and unsigned Xcode/LocalTesting ones never grant.
    @Test func anAppWithProductionGrantsOnlyProductionAppTransactions() async throws {
        let harness = try await Self.start(environments: "[Production, Sandbox, Xcode]")
        let cases: [(String, String)] = [
            (signer.sign(Self.appTransaction(id: "500", version: "1.0")), "Sandbox"),
            (signer.sign(Self.appTransaction(id: "501", version: "1.0", environment: "Xcode")), "Xcode"),
            (signer.sign(Self.appTransaction(id: "502", version: "1.0", environment: "LocalTesting")), "LocalTesting"),
        ]
        for (signed, environment) in cases {
            let (status, answer) = try await harness.post("tester", signed)
            #expect(status == 400, "\(environment): \(answer)")
            #expect(answer["error"] == "invalid_app_transaction")
            #expect(answer["reason"] == "wrong_environment", "\(environment): \(answer)")
        }
        #expect(try await harness.records(harness.relay.configuration.topics.notifications).isEmpty)
        // A Production one grants.
        let (status, answer) = try await harness.post("buyer", signer.sign(Self.appTransaction(id: "503", version: "1.0", environment: "Production")))
        #expect(status == 202, "\(answer)")
        try await waitUntil("the grant in customer info") {
            try await harness.customerInfo("buyer")["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } == ["pro"]
        }
        #expect(try await harness.customerInfo("tester")["entitlements"] == [])
        try await harness.stop()
    }

    /// A signed AppTransaction is a bearer artifact: one buyer's JWS replayed under other accounts must not
    /// give them access. The route answers 409 and appends nothing; a record for another user that reaches
    /// the worker anyway (two first grants racing) adds nobody. The grant's own user may post again, also
    /// with a cached AppTransaction signed before the stored grant (the grant's time is the receive time).
    @Test func oneAppTransactionGrantsOneUser() async throws {
        let harness = try await Self.start()
        let signed = signer.sign(Self.appTransaction(id: "600"))
        #expect(try await harness.post("owner", signed).0 == 202)
        try await waitUntil("the grant in customer info") {
            try await harness.customerInfo("owner")["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } == ["pro"]
        }
        let notifications = harness.relay.configuration.topics.notifications
        let before = try await harness.records(notifications).count
        #expect(before == 1)

        let (status, answer) = try await harness.post("someone-else", signed)
        #expect(status == 409, "\(answer)")
        #expect(answer["error"] == "already_granted", "\(answer)")
        let detail = try #require(answer["detail"]?.stringValue)
        #expect(!detail.contains("owner"), "\(detail)")
        #expect(try await harness.records(notifications).count == before)
        // The owner again: 202, nothing appended.
        let (again, againAnswer) = try await harness.post("owner", signed)
        #expect(again == 202, "\(againAnswer)")
        #expect(againAnswer == ["granted": true, "entitlements": ["pro"]])
        #expect(try await harness.records(notifications).count == before)

        // The owner with a cached AppTransaction signed a day before the grant: still granted, nothing appended.
        let older = signer.sign(Self.appTransaction(id: "600", signedDate: Fixtures.signedDate - 86_400_000))
        let (olderStatus, olderAnswer) = try await harness.post("owner", older)
        #expect(olderStatus == 202, "\(olderAnswer)")
        #expect(olderAnswer == ["granted": true, "entitlements": ["pro"]])
        #expect(try await harness.records(notifications).count == before)
        // The grant's time is when the record was received, not the AppTransaction's signedDate (2030 here).
        let statePath = "/subscriptions-api/internal/v1/subscriptions/apple/app-transaction:600"
        let state = try await harness.get(statePath)
        #expect(state["appUserIds"] == ["owner"], "\(state)")
        let sourceTimestamp = try #require(state["sourceTimestamp"]?.int64Value)
        #expect(sourceTimestamp != Fixtures.signedDate && sourceTimestamp <= Int64(Date().timeIntervalSince1970 * 1000), "\(state)")

        // The worker side: a record for another user, appended past the route (as two first grants racing
        // would), adds nobody. A marker grant (another AppTransaction) under the same key follows it, so
        // once the marker is applied, so is the record before it.
        let producer = try harness.relay.environment.process.log.producer
        for (signed, user) in [(signed, "someone-else"), (signer.sign(Self.appTransaction(id: "601")), "marker")] {
            let record = RawNotification(
                store: .apple, app: "demo", receivedAtMilliseconds: Int64(Date().timeIntervalSince1970 * 1000),
                body: AppTransactionGrant.body(signedAppTransaction: signed, appUserId: user, rule: 0), requestHeaders: [:],
                source: AppTransactionGrant.source)
            _ = try await producer.produce(record.record(topic: notifications, subject: "app-transaction:600"))
        }
        try await waitUntil("the marker grant") {
            try await harness.customerInfo("marker")["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } == ["pro"]
        }
        #expect(try await harness.customerInfo("someone-else")["entitlements"] == [])
        #expect(try await harness.statusChanges(for: "someone-else").isEmpty)
        #expect(try await harness.get(statePath)["appUserIds"] == ["owner"])
        #expect(try await harness.customerInfo("owner")["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } == ["pro"])
        try await harness.stop()
    }
}
