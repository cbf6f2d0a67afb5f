import Foundation
import RelayApp
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayTestSupport
import Testing

/// Promotional grants on a whole relay (embedded log): the secret key's routes and the command line,
/// customer info, the events, the end on time (the backend's schedule, real clock), and revocation.
@Suite(.serialized) struct GrantTests {
    static let publicKey = "pk_demo_grants_0123456789"

    struct Harness {
        let relay: TestRelay
        let backendURL: String

        func grant(_ user: String, _ body: JSON, key: String = "test-backend-key") async throws -> (Int, JSON) {
            let response = try await relay.http.send(
                "POST", backendURL + "/subscriptions-api/internal/v1/users/\(user)/grants",
                headers: [("Authorization", "Bearer \(key)"), ("Content-Type", "application/json")], body: body.serialized())
            return (response.status, (try? JSON.parse(response.body)) ?? .null)
        }

        func revoke(_ user: String, _ grantId: String) async throws -> (Int, JSON) {
            let response = try await relay.http.send(
                "DELETE", backendURL + "/subscriptions-api/internal/v1/users/\(user)/grants/\(grantId)",
                headers: [("Authorization", "Bearer test-backend-key")])
            return (response.status, (try? JSON.parse(response.body)) ?? .null)
        }

        func customerInfo(_ user: String) async throws -> JSON {
            let response = try await relay.http.send(
                "GET", backendURL + "/subscriptions-api/public/v1/users/\(user)/entitlements", headers: [("Authorization", "Bearer \(GrantTests.publicKey)")])
            return try JSON.parse(response.body)
        }

        func entitlements(_ user: String) async throws -> [String] {
            try await customerInfo(user)["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } ?? []
        }

        func events(_ type: String, user: String? = nil) async throws -> [JSON] {
            try await relay.records(topic: relay.configuration.topics.events).compactMap { try? JSON.parse($0.value) }.filter {
                $0["type"]?.stringValue == type && (user == nil || $0["data"]?["appUserId"] == .string(user!) || $0["data"]?["originalAppUserId"] == .string(user!))
            }
        }

        func stop() async throws { try await relay.stop() }
    }

    static func start() async throws -> Harness {
        let configuration = try AppleRelayConfiguration.parse(
            AppleRelayConfiguration.text(app: [#"publicApiKeys: ["\#(publicKey)"]"#]), name: "grants")
        let relay = try await TestRelay(configuration: configuration, log: .embedded)
        return Harness(relay: relay, backendURL: await relay.environment.process.backendAddress.value())
    }

    @Test func aGrantShowsInCustomerInfoAndEventsThenEndsOnTimeByItself() async throws {
        let harness = try await Self.start()
        let ends = Int64(Date().timeIntervalSince1970 * 1000) + 1_500
        let (status, grant) = try await harness.grant("user-1", ["app": "demo", "entitlement": "pro", "expiresAt": .integer(ends), "reason": "beta tester"])
        #expect(status == 201, "\(grant)")
        #expect(grant["status"] == "ACTIVE")
        #expect(grant["store"] == "PROMOTIONAL")
        #expect(grant["expiresAt"] == .integer(ends))
        let grantId = try #require(grant["grantId"]?.stringValue)
        #expect(grantId.hasPrefix("grant_") && grantId.count == 38)
        // Customer info: the entitlement, from a PROMOTIONAL subscription that does not renew.
        let info = try await harness.customerInfo("user-1")
        #expect(info["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } == ["pro"], "\(info)")
        let entry = try #require(info["customerInfo"]?["subscriptions"]?.arrayValue?.first)
        #expect(entry["store"] == "PROMOTIONAL")
        #expect(entry["willRenew"] == false)
        #expect(entry["expirationDate"] == .integer(ends))
        #expect(info["customerInfo"]?["entitlements"]?.arrayValue?.first?["store"] == "PROMOTIONAL")
        // The events: a purchase at price 0, and the status change.
        let purchase = try #require(try await harness.events("non_renewing_purchase").first)
        #expect(purchase["data"]?["price"]?.doubleValue == 0)
        #expect(purchase["data"]?["store"] == "PROMOTIONAL")
        #expect(purchase["data"]?["periodType"] == "PROMOTIONAL")
        #expect(purchase["data"]?["originalAppUserId"] == "user-1")
        #expect(purchase["data"]?["transactionId"] == .string(grantId))
        #expect(try await harness.events("subscription_status_did_change", user: "user-1").count == 1)
        // Nothing else happens: the grant ends at its time all the same.
        try await waitUntil("the grant's expiration") { try await !harness.events("expiration").isEmpty }
        let expiration = try #require(try await harness.events("expiration").first)
        #expect(expiration["data"]?["expirationReason"] == "UNKNOWN")
        #expect(expiration["data"]?["ts"] == .integer(ends))
        #expect(try await harness.entitlements("user-1").isEmpty)
        let changes = try await harness.events("subscription_status_did_change", user: "user-1")
        #expect(changes.count == 2)
        #expect(changes.last?["data"]?["to"]?["status"] == "INACTIVE")
        try await harness.stop()
    }

    @Test func aRevokedGrantEndsAtOnceOnce() async throws {
        let harness = try await Self.start()
        let (status, grant) = try await harness.grant("user-2", ["app": "demo", "entitlement": "pro", "duration": "P1M"])
        #expect(status == 201, "\(grant)")
        let grantId = try #require(grant["grantId"]?.stringValue)
        let expected = Int64(Date().timeIntervalSince1970 * 1000) + 28 * 86_400_000
        #expect((grant["expiresAt"]?.int64Value ?? 0) >= expected, "a month is at least 28 days")
        #expect(try await harness.entitlements("user-2") == ["pro"])
        // Another user cannot revoke it, and cannot tell it exists.
        #expect(try await harness.revoke("user-3", grantId).0 == 404)
        #expect(try await harness.revoke("user-2", "grant_unknown").0 == 404)
        let (revoked, answer) = try await harness.revoke("user-2", grantId)
        #expect(revoked == 200, "\(answer)")
        #expect(answer["status"] == "REVOKED")
        #expect(try await harness.entitlements("user-2").isEmpty)
        let expirations = try await harness.events("expiration")
        #expect(expirations.count == 1)
        #expect(expirations.first?["data"]?["expirationReason"] == "DEVELOPER_INITIATED")
        // Revoked again: nothing more happens.
        #expect(try await harness.revoke("user-2", grantId).0 == 200)
        #expect(try await harness.events("expiration").count == 1)
        #expect(try await harness.events("subscription_status_did_change", user: "user-2").count == 2)
        try await harness.stop()
    }

    @Test func aLifetimeGrantIsALifetimeEntitlement() async throws {
        let harness = try await Self.start()
        let (status, grant) = try await harness.grant("user-4", ["app": "demo", "entitlement": "vip", "lifetime": true])
        #expect(status == 201, "\(grant)")
        let info = try await harness.customerInfo("user-4")
        let entitlement = try #require(info["customerInfo"]?["entitlements"]?.arrayValue?.first)
        #expect(entitlement["identifier"] == "vip")
        #expect(entitlement["isLifetime"] == true)
        #expect(info["customerInfo"]?["nonSubscriptions"]?.arrayValue?.first?["store"] == "PROMOTIONAL")
        try await harness.stop()
    }

    @Test func badGrantsAre400AndAPublicKeyCannotGrant() async throws {
        let harness = try await Self.start()
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        for body: JSON in [
            ["app": "demo", "entitlement": "pro"],  // no end
            ["app": "demo", "entitlement": "pro", "duration": "P1M", "lifetime": true],  // two ends
            ["app": "demo", "entitlement": "pro", "expiresAt": .integer(now - 1000)],  // over before it starts
            ["app": "demo", "entitlement": "pro", "duration": "one month"],
            ["app": "nobody", "entitlement": "pro", "lifetime": true],
            ["app": "demo", "entitlement": "", "lifetime": true],
            ["app": "demo", "entitlement": "pro", "lifetime": true, "reason": .string(String(repeating: "x", count: 501))],
        ] {
            let (status, answer) = try await harness.grant("user-5", body)
            #expect(status == 400, "\(body): \(answer)")
            #expect(answer["error"] == "bad_request")
        }
        let (status, _) = try await harness.grant("user-5", ["app": "demo", "entitlement": "pro", "lifetime": true], key: Self.publicKey)
        #expect(status == 403)
        #expect(try await harness.entitlements("user-5").isEmpty)
        #expect(try await harness.relay.records(topic: harness.relay.configuration.topics.notifications).isEmpty)
        try await harness.stop()
    }

    @Test func theCommandLineGrantsAndRevokes() async throws {
        let harness = try await Self.start()
        let executable: URL = try #require(CommandLineTests.executable, "the revenue-relay executable was not built next to the tests")
        // AppleRelayConfiguration.parse keeps the YAML beside the backend's database.
        let config = URL(fileURLWithPath: harness.relay.configuration.backend.database).deletingLastPathComponent().appendingPathComponent("relay.yaml").path
        let common = ["--config", config, "--backend-url", harness.backendURL]
        let granted = try await runChildProcess(
            executable, ["grant"] + common + ["--app", "demo", "--user", "user-6", "--entitlement", "pro", "--duration", "P7D", "--reason", "support"])
        #expect(granted.status == 0, "\(granted.stderr)")
        let grant = try JSON.parse(granted.stdout)
        #expect(grant["status"] == "ACTIVE")
        #expect(grant["reason"] == "support")
        #expect(try await harness.entitlements("user-6") == ["pro"])
        let grantId = try #require(grant["grantId"]?.stringValue)
        let revoked = try await runChildProcess(executable, ["revoke"] + common + ["--user", "user-6", "--grant-id", grantId])
        #expect(revoked.status == 0, "\(revoked.stderr)")
        #expect(try JSON.parse(revoked.stdout)["status"] == "REVOKED")
        #expect(try await harness.entitlements("user-6").isEmpty)
        // Unknown grant: 65; no end given: 64.
        #expect(try await runChildProcess(executable, ["revoke"] + common + ["--user", "user-6", "--grant-id", "grant_nope"]).status == 65)
        #expect(try await runChildProcess(executable, ["grant"] + common + ["--app", "demo", "--user", "u", "--entitlement", "pro"]).status == 64)
        try await harness.stop()
    }
}
