import Foundation
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayTestSupport
import RelayVerification
import Testing

@Suite struct GoogleVerificationTests {
    let signer = GooglePushSigner()
    let now = Fixtures.signedDate / 1000

    func headers(_ token: String) -> [String: String] { ["authorization": "Bearer \(token)"] }

    func push(
        claims: [String: JSON] = [:], notification: JSON = GooglePushSigner.developerNotification(), signer: GooglePushSigner? = nil,
        header: JSON? = nil, receivedAt: Int64? = nil, verifier: NotificationVerifier? = nil
    ) async throws -> Verdict {
        let token = (signer ?? self.signer).token(GooglePushSigner.claims(issuedAt: now - 10, overrides: claims), header: header)
        return try await verdict(.google, GooglePushSigner.envelope(notification), headers: headers(token), receivedAt: receivedAt ?? now, verifier: verifier)
    }

    @Test func acceptsAnAuthenticatedPush() async throws {
        let notification = try #require(try await push().notification)
        #expect(notification.type == "SUBSCRIPTION_PURCHASED")
        #expect(notification.notificationId == "136969346945")
        #expect(notification.payload["subscriptionNotification"]?["purchaseToken"] == "token-abc")
        // Both issuer spellings are Google's.
        #expect(try await reason(push(claims: ["iss": "accounts.google.com"])) == nil)
    }

    @Test func namesEveryNotificationKindAndKeepsUnknownCodesRaw() async throws {
        for (code, name) in DeveloperNotificationKind.subscriptionTypes {
            #expect(try await push(notification: GooglePushSigner.developerNotification(code: code)).notification?.type == name)
        }
        let unknown = try #require(try await push(notification: GooglePushSigner.developerNotification(code: 99)).notification)
        #expect(unknown.type == "SUBSCRIPTION_NOTIFICATION_TYPE_99")
        #expect(unknown.payload["subscriptionNotification"]?["notificationType"] == 99)
        let others: [(JSON, String)] = [
            (["packageName": "com.example.app", "oneTimeProductNotification": ["notificationType": 1, "purchaseToken": "t", "sku": "coins"]], "ONE_TIME_PRODUCT_PURCHASED"),
            (["packageName": "com.example.app", "oneTimeProductNotification": ["notificationType": 2, "purchaseToken": "t", "sku": "coins"]], "ONE_TIME_PRODUCT_CANCELED"),
            (["packageName": "com.example.app", "voidedPurchaseNotification": ["purchaseToken": "t", "orderId": "GPA.1", "productType": 1, "refundType": 1]], "VOIDED_PURCHASE"),
            (["packageName": "com.example.app", "testNotification": ["version": "1.0"]], "TEST"),
        ]
        for (notification, name) in others {
            #expect(try await push(notification: notification).notification?.type == name)
        }
    }

    @Test func checksIssuerAudienceAndServiceAccount() async throws {
        #expect(try await reason(push(claims: ["iss": "https://evil.example.com"])) == .wrongIssuer)
        #expect(try await reason(push(claims: ["iss": nil])) == .wrongIssuer)
        #expect(try await reason(push(claims: ["aud": "https://other.example.com"])) == .wrongAudience)
        #expect(try await reason(push(claims: ["aud": ["https://relay.example.com/v1/notifications/google/demo"]])) == nil)
        #expect(try await reason(push(claims: ["email": "someone@example.com"])) == .wrongServiceAccount)
        #expect(try await reason(push(claims: ["email_verified": false])) == .wrongServiceAccount)
        #expect(try await reason(push(claims: ["email_verified": nil])) == .wrongServiceAccount)
    }

    @Test func checksExpiryAndIssueTimeAgainstTheReceiveTimeWithSixtySecondsOfSkew() async throws {
        let issued = now - 10
        let expires = issued + 3600
        #expect(try await reason(push(receivedAt: expires + 60)) == nil)
        #expect(try await reason(push(receivedAt: expires + 61)) == .tokenExpired)
        #expect(try await reason(push(receivedAt: issued - 60)) == nil)
        #expect(try await reason(push(receivedAt: issued - 61)) == .tokenExpired)
        #expect(try await reason(push(claims: ["exp": nil])) == .malformed)
        #expect(try await reason(push(claims: ["exp": .integer(.min)])) == .tokenExpired)
        #expect(try await reason(push(claims: ["iat": .integer(.max)])) == .tokenExpired)
    }

    @Test func acceptsOnlyRS256FromAKnownKey() async throws {
        for algorithm in ["none", "HS256", "RS512", "ES256"] {
            #expect(try await reason(push(header: ["alg": .string(algorithm), "kid": "relay-test-1"])) == .unsupportedAlgorithm, "\(algorithm)")
        }
        #expect(try await reason(push(header: ["alg": "RS256", "kid": "somebody-else"])) == .unknownKey)
        #expect(try await reason(push(header: ["alg": "RS256"])) == .unknownKey)
        // Signed by key 2 but claiming key 1.
        #expect(try await reason(push(signer: GooglePushSigner(key: "google/push-signing-2.key", kid: "relay-test-1"))) == .badSignature)
        #expect(try await reason(push(signer: GooglePushSigner(key: "google/push-signing-2.key", kid: "relay-test-2"))) == nil)
    }

    @Test func requiresTheAuthorizationHeader() async throws {
        let body = GooglePushSigner.envelope(GooglePushSigner.developerNotification())
        #expect(try await reason(verdict(.google, body)) == .missingSignature)
        #expect(try await reason(verdict(.google, body, headers: ["authorization": "Basic dXNlcjpwYXNz"])) == .missingSignature)
        #expect(try await reason(verdict(.google, body, headers: ["authorization": "Bearer not-a-jwt"])) == .malformed)
    }

    @Test func checksTheMessageAndPackageName() async throws {
        #expect(try await reason(push(notification: GooglePushSigner.developerNotification(packageName: "com.other.app"))) == .wrongPackageName)
        let token = signer.token(GooglePushSigner.claims(issuedAt: now))
        for body in [#"{"message": {"data": "%%%"}}"#, #"{"message": {"data": "bm90IGpzb24="}}"#, #"{"nothing": 1}"#] {
            #expect(try await reason(verdict(.google, Array(body.utf8), headers: headers(token), receivedAt: now)) == .malformed, "\(body)")
        }
    }

    @Test func rejectsTamperingWithTheToken() async throws {
        let verifier = try NotificationVerifier(configuration: Fixtures.configuration(), logger: testLogger())
        let token = signer.token(GooglePushSigner.claims(issuedAt: now))
        let body = GooglePushSigner.envelope(GooglePushSigner.developerNotification())
        #expect(try await reason(verdict(.google, body, headers: headers(token), receivedAt: now, verifier: verifier)) == nil)
        var accepted: [Int] = []
        let bytes = Array(token.utf8)
        for index in bytes.indices {
            var tampered = bytes
            tampered[index] = bytes[index] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
            let verdict = try await verdict(.google, body, headers: headers(String(decoding: tampered, as: UTF8.self)), receivedAt: now, verifier: verifier)
            if verdict.notification != nil { accepted.append(index) }
        }
        #expect(accepted.isEmpty, "tampered token bytes accepted at \(accepted)")
    }

    @Test func readsThePEMCertificateMapFormat() async throws {
        let verifier = try NotificationVerifier(configuration: Fixtures.configuration(jwks: "google/certs-v1.json"), logger: testLogger())
        let second = GooglePushSigner(key: "google/push-signing-2.key", kid: "relay-test-2")
        #expect(try await reason(push(signer: second, verifier: verifier)) == nil)
        #expect(try await reason(push(verifier: verifier)) == .unknownKey)
    }

    @Test func parsesTheSharedSubscriptionPurchasedEnvelope() async throws {
        let vectors = try #require(Fixtures.sharedVectors)
        let samples = try JSON.parse(Array(Data(contentsOf: vectors.appendingPathComponent("google-play/samples.json"))))
        let envelope = try #require(samples["derived_envelope_SUBSCRIPTION_PURCHASED"]?["envelope"])
        let token = signer.token(GooglePushSigner.claims(issuedAt: now))
        let notification = try #require(try await verdict(.google, envelope.serialized(), headers: headers(token), receivedAt: now).notification)
        #expect(notification.type == "SUBSCRIPTION_PURCHASED")
        #expect(notification.notificationId == "1234567890")
        #expect(notification.payload["subscriptionNotification"]?["purchaseToken"] == "PURCHASE_TOKEN_PLACEHOLDER")
    }
}

/// Keys fetched over HTTP from a real server on loopback.
@Suite struct GoogleKeyEndpointTests {
    let now = Fixtures.signedDate / 1000

    func body() -> [UInt8] { GooglePushSigner.envelope(GooglePushSigner.developerNotification()) }

    func headers(_ signer: GooglePushSigner) -> [String: String] {
        ["authorization": "Bearer \(signer.token(GooglePushSigner.claims(issuedAt: now)))"]
    }

    @Test func fetchesCachesAndRefetchesForANewKid() async throws {
        let served = LockedBox(try JSON.parse(Array(Fixtures.text("google/jwks.json").utf8)))
        // First only key 1 is published; key 2 appears later (rotation).
        if case .object(var members) = served.value, case .array(let keys) = members["keys"] {
            members["keys"] = .array([keys[0]])
            served.withLock { $0 = .object(members) }
        }
        let server = try await TestHTTPServer { _ in TestHTTPResponse(headers: [("Cache-Control", "public, max-age=3600")], body: served.value.serialized()) }
        let configuration = try Fixtures.configuration(jwks: "\(server.baseURL)/oauth2/v3/certs")
        let verifier = try NotificationVerifier(configuration: configuration, logger: testLogger(), keyRefetchInterval: .zero)

        #expect(try await reason(verdict(.google, body(), headers: headers(GooglePushSigner()), receivedAt: now, verifier: verifier)) == nil)
        #expect(try await reason(verdict(.google, body(), headers: headers(GooglePushSigner()), receivedAt: now, verifier: verifier)) == nil)
        #expect(server.requests.count == 1, "keys are cached for max-age")

        served.withLock { $0 = try! JSON.parse(Array(Fixtures.text("google/jwks.json").utf8)) }
        let second = GooglePushSigner(key: "google/push-signing-2.key", kid: "relay-test-2")
        #expect(try await reason(verdict(.google, body(), headers: headers(second), receivedAt: now, verifier: verifier)) == nil)
        #expect(server.requests.count == 2, "an unknown kid reads the keys again")
        #expect(server.requests.first?.path == "/oauth2/v3/certs")
        await server.stop()
    }

    @Test func knownKeysKeepServingWhileTheEndpointIsDown() async throws {
        let failing = LockedBox(false)
        let server = try await TestHTTPServer { _ in
            failing.value ? TestHTTPResponse(status: 503, text: "unavailable") : TestHTTPResponse(body: Array(Fixtures.text("google/jwks.json").utf8))
        }
        let verifier = try NotificationVerifier(
            configuration: try Fixtures.configuration(jwks: "\(server.baseURL)/certs"), logger: testLogger(), keyRefetchInterval: .zero)
        #expect(try await reason(verdict(.google, body(), headers: headers(GooglePushSigner()), receivedAt: now, verifier: verifier)) == nil)
        failing.withLock { $0 = true }
        #expect(try await reason(verdict(.google, body(), headers: headers(GooglePushSigner()), receivedAt: now, verifier: verifier)) == nil)
        // A kid that is not known while the endpoint is down: no verdict yet (the worker retries), never a reject.
        let unknown = GooglePushSigner(key: "google/push-signing-2.key", kid: "relay-test-3")
        await #expect(throws: VerificationUnavailable.self) {
            _ = try await verdict(.google, body(), headers: headers(unknown), receivedAt: now, verifier: verifier)
        }
        await server.stop()
    }

    @Test func noKeysAtAllIsUnavailableNotARejection() async throws {
        let server = try await TestHTTPServer { _ in TestHTTPResponse(status: 500, text: "boom") }
        let verifier = try NotificationVerifier(configuration: try Fixtures.configuration(jwks: "\(server.baseURL)/certs"), logger: testLogger())
        await #expect(throws: VerificationUnavailable.self) {
            _ = try await verdict(.google, body(), headers: headers(GooglePushSigner()), receivedAt: now, verifier: verifier)
        }
        await server.stop()
    }
}
