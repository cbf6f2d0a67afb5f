import Foundation
import RelayConfig
import RelayCore
import RelayTestSupport
import RelayVerification
import Testing

@Suite struct StripeVerificationTests {
    let body = Array(#"{"id":"evt_1","object":"event","type":"invoice.paid","livemode":false,"data":{"object":{"id":"in_1","subscription":"sub_1"}}}"#.utf8)
    let t: Int64 = 1_900_000_000

    func check(_ header: String?, body: [UInt8]? = nil, receivedAt: Int64? = nil, app: String = "demo") async throws -> Verdict {
        try await verdict(.stripe, body ?? self.body, headers: header.map { ["stripe-signature": $0] } ?? [:], receivedAt: receivedAt ?? t, app: app)
    }

    @Test func acceptsAnyConfiguredSecretAndAnyV1() async throws {
        let notification = try #require(try await check(WebhookSigning.stripeHeader(body: body, secret: "whsec_test_secret", timestamp: t)).notification)
        #expect(notification.type == "invoice.paid")
        #expect(notification.notificationId == "evt_1")
        #expect(notification.environment == "SANDBOX")
        // The older of two configured secrets (rotation on the relay's side).
        #expect(try await reason(check(WebhookSigning.stripeHeader(body: body, secret: "whsec_old_secret", timestamp: t))) == nil)
        // Stripe sends two v1 while the endpoint's secret is rolled; one matching is enough.
        let good = WebhookSigning.stripeHeader(body: body, secret: "whsec_test_secret", timestamp: t)
        #expect(try await reason(check("t=\(t),v1=\(String(repeating: "0", count: 64)),\(good.split(separator: ",")[1])")) == nil)
    }

    @Test func rejectsWithTheRightReason() async throws {
        let good = WebhookSigning.stripeHeader(body: body, secret: "whsec_test_secret", timestamp: t)
        #expect(try await reason(check(nil)) == .missingSignature)
        #expect(try await reason(check("t=\(t),v0=abc")) == .missingSignature)
        #expect(try await reason(check("v1=abc")) == .malformed)
        #expect(try await reason(check("garbage")) == .malformed)
        #expect(try await reason(check(WebhookSigning.stripeHeader(body: body, secret: "whsec_unknown", timestamp: t))) == .badSignature)
        #expect(try await reason(check(good, body: body + [0x20])) == .badSignature)
        #expect(try await reason(check(good, receivedAt: t + 300)) == nil)
        #expect(try await reason(check(good, receivedAt: t + 301)) == .staleTimestamp)
        #expect(try await reason(check(good, receivedAt: t - 301)) == .staleTimestamp)
        #expect(try await reason(check(good, app: "nobody")) == .unknownApp)
        // Extreme timestamps are stale, never an arithmetic trap.
        for extreme in [Int64.min, Int64.max] {
            #expect(try await reason(check(WebhookSigning.stripeHeader(body: body, secret: "whsec_test_secret", timestamp: extreme))) == .staleTimestamp)
        }
        #expect(try await reason(verdict(.apple, body, app: "stripe-only")) == .unknownApp)
        let notJSON = Array("not json".utf8)
        #expect(try await reason(check(WebhookSigning.stripeHeader(body: notJSON, secret: "whsec_test_secret", timestamp: t), body: notJSON)) == .malformed)
    }

    @Test func rejectsTamperingWithAnyByteOfBodyOrHeader() async throws {
        let verifier = try NotificationVerifier(configuration: Fixtures.configuration(), logger: testLogger())
        let header = Array(WebhookSigning.stripeHeader(body: body, secret: "whsec_test_secret", timestamp: t).utf8)
        var accepted: [String] = []
        for index in body.indices {
            var tampered = body
            tampered[index] ^= 0x01
            let verdict = try await verdict(.stripe, tampered, headers: ["stripe-signature": String(decoding: header, as: UTF8.self)], receivedAt: t, verifier: verifier)
            if verdict.notification != nil { accepted.append("body \(index)") }
        }
        for index in header.indices {
            var tampered = header
            tampered[index] ^= 0x01
            let verdict = try await verdict(.stripe, body, headers: ["stripe-signature": String(decoding: tampered, as: UTF8.self)], receivedAt: t, verifier: verifier)
            if verdict.notification != nil { accepted.append("header \(index)") }
        }
        #expect(accepted.isEmpty, "\(accepted)")
    }

    @Test func reproducesTheSharedStripeVectors() async throws {
        let vectors = try #require(Fixtures.sharedVectors)
        let file = try JSON.parse(Array(Data(contentsOf: vectors.appendingPathComponent("stripe/derived_vectors.json"))))
        let payload = Array(file["payload"]!.stringValue!.utf8)
        let t = file["t"]!.int64Value!
        func verifier(_ secret: String) throws -> NotificationVerifier {
            let configuration = try RelayConfiguration.parse(
                yaml: "apps: [{ key: demo, projectId: 1, applicationId: 1, stripe: { signingSecrets: [\"\(secret)\"] } }]", baseDirectory: "/", environment: [:])
            return try NotificationVerifier(configuration: configuration, logger: testLogger())
        }
        let expected: [String: RejectReason?] = [
            "valid_single": nil, "valid_with_extra_bad_v1": nil, "rotation_two_v1": nil, "v0_only": .missingSignature,
            "bad_sig": .badSignature, "malformed": .malformed, "too_old": .staleTimestamp,
        ]
        for testCase in file["cases"]!.arrayValue! {
            let name = testCase["name"]!.stringValue!
            let receivedAt = testCase["now"]?.int64Value ?? t
            let header = ["stripe-signature": testCase["header"]!.stringValue!]
            let result = try await verdict(.stripe, payload, headers: header, receivedAt: receivedAt, verifier: verifier(file["secret"]!.stringValue!))
            #expect(reason(result) == expected[name] ?? .malformed, "\(name)")
            if name == "rotation_two_v1" {
                let rolled = try await verdict(.stripe, payload, headers: header, receivedAt: receivedAt, verifier: verifier("whsec_test_secret_rolled_key"))
                #expect(reason(rolled) == nil, "rotation with the rolled key")
            }
        }
    }
}

@Suite struct PaddleVerificationTests {
    let body = Array(#"{"event_id":"evt_01","event_type":"subscription.created","occurred_at":"2030-01-01T00:00:00Z","data":{"id":"sub_01"}}"#.utf8)
    let ts: Int64 = 1_900_000_000
    let secret = "pdl_ntfset_01h8bzakzx_TESTSECRET"

    func check(_ header: String?, body: [UInt8]? = nil, receivedAt: Int64? = nil) async throws -> Verdict {
        try await verdict(.paddle, body ?? self.body, headers: header.map { ["paddle-signature": $0] } ?? [:], receivedAt: receivedAt ?? ts)
    }

    @Test func acceptsEveryH1AndChecksTheRest() async throws {
        let good = WebhookSigning.paddleHeader(body: body, secret: secret, timestamp: ts)
        let notification = try #require(try await check(good).notification)
        #expect(notification.type == "subscription.created")
        #expect(notification.notificationId == "evt_01")
        let h1 = good.split(separator: ";")[1]
        #expect(try await reason(check("ts=\(ts);h1=\(String(repeating: "a", count: 64));\(h1)")) == nil)
        #expect(try await reason(check(nil)) == .missingSignature)
        #expect(try await reason(check("ts=\(ts)")) == .missingSignature)
        #expect(try await reason(check("h1=abc")) == .malformed)
        #expect(try await reason(check(WebhookSigning.paddleHeader(body: body, secret: "pdl_other", timestamp: ts))) == .badSignature)
        #expect(try await reason(check(good, body: body + [0x0A])) == .badSignature)
        // Stripe's separator and message format do not verify as Paddle's.
        #expect(try await reason(check(WebhookSigning.stripeHeader(body: body, secret: secret, timestamp: ts).replacingOccurrences(of: ",v1=", with: ";h1=").replacingOccurrences(of: "t=", with: "ts="))) == .badSignature)
        #expect(try await reason(check(good, receivedAt: ts + 300)) == nil)
        #expect(try await reason(check(good, receivedAt: ts + 301)) == .staleTimestamp)
        #expect(try await reason(check(good, receivedAt: ts - 301)) == .staleTimestamp)
    }

    @Test func reproducesTheSharedPaddleVectors() async throws {
        let vectors = try #require(Fixtures.sharedVectors)
        let file = try JSON.parse(Array(Data(contentsOf: vectors.appendingPathComponent("paddle/derived_vectors.json"))))
        // The vectors follow Paddle's SDK, which allows 5 s.
        let configuration = try RelayConfiguration.parse(
            yaml: "apps: [{ key: demo, projectId: 1, applicationId: 1, paddle: { secretKeys: [\"\(file["secret"]!.stringValue!)\"], tolerance: 5s } }]",
            baseDirectory: "/", environment: [:])
        let verifier = try NotificationVerifier(configuration: configuration, logger: testLogger())
        let expected: [String: RejectReason?] = ["valid": nil, "stale": .staleTimestamp, "tampered_body": .badSignature]
        for testCase in file["cases"]!.arrayValue! {
            let name = testCase["name"]!.stringValue!
            let body = Array((testCase["body_override"]?.stringValue ?? file["body"]!.stringValue!).utf8)
            let result = try await verdict(
                .paddle, body, headers: ["paddle-signature": testCase["header"]!.stringValue!], receivedAt: testCase["now"]?.int64Value ?? file["ts"]!.int64Value!, verifier: verifier)
            #expect(reason(result) == expected[name] ?? .malformed, "\(name)")
        }
    }
}

/// The configurations the repository ships build a verifier: their roots and key files are usable.
@Suite struct ShippedConfigurationTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    @Test func devAndExampleConfigurationsBuildAVerifier() throws {
        let dev = try RelayConfiguration.load(path: Self.root.appendingPathComponent("config/dev.yaml").path, environment: [:])
        _ = try NotificationVerifier(configuration: dev, logger: testLogger())
        let environment = ["RELAY_BACKEND_KEY": "k", "ANALYTICS_READ_KEY": "r", "DEMO_PUBLIC_API_KEY": "p", "STRIPE_WEBHOOK_SECRET": "whsec_s", "PADDLE_WEBHOOK_SECRET": "p", "ANALYTICS_WHSEC": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "GOOGLE_SERVICE_ACCOUNT_KEY_FILE": Self.root.appendingPathComponent("Tests/Fixtures/google/service-account.json").path]
        let example = try RelayConfiguration.load(path: Self.root.appendingPathComponent("config/example.yaml").path, environment: environment)
        #expect(example.app("demo")?.google?.jwks == "https://www.googleapis.com/oauth2/v3/certs")
        // The URL is fetched on first use, not at startup, so this needs no network.
        _ = try NotificationVerifier(configuration: example, logger: testLogger())
    }

    @Test func anUnusableRootIsAConfigurationErrorNamingTheKey() throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("root") + ".pem")
        try Data("not a certificate".utf8).write(to: file)
        let configuration = try RelayConfiguration.parse(
            yaml: "apps: [{ key: demo, projectId: 1, applicationId: 1, apple: { bundleId: b, environments: [Sandbox], rootCertificates: [\"\(file.path)\"] } }]",
            baseDirectory: "/", environment: [:])
        #expect { _ = try NotificationVerifier(configuration: configuration, logger: testLogger()) } throws: {
            ($0 as? ConfigurationError)?.key == "apps[0].apple.rootCertificates"
        }
    }
}
