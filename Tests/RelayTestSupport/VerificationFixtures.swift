public import RelayCrypto
public import Foundation
public import RelayConfig
public import RelayCore
import RelayVerification

/// The committed test PKI and keys (`Tests/Fixtures`, made by `Tests/Fixtures/generate.sh`), and
/// builders for signed store notifications.
public enum Fixtures {
    /// `Tests/Fixtures`.
    public static let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("Fixtures")

    /// Public test vectors (Apple's library fixtures, a real Apple-signed notification, Standard Webhooks',
    /// Stripe's and Paddle's signature cases), carried in `Tests/Fixtures/vectors` with their sources.
    public static let sharedVectors: URL? = directory.appendingPathComponent("vectors")

    public static func path(_ name: String) -> String { directory.appendingPathComponent(name).path }

    public static func text(_ name: String) -> String {
        (try? String(contentsOfFile: path(name), encoding: .utf8)) ?? ""
    }

    /// A certificate of the fixtures as x5c wants it: standard base64 of the DER.
    public static func x5c(_ name: String) -> String {
        Base64.encode((try? Certificate.pem(Array(text(name).utf8)))?.first?.der ?? [])
    }

    public static func privateKey(_ name: String) -> PrivateKey {
        try! PrivateKey(pem: text(name))
    }

    /// 2030-01-01T00:00:00Z: inside every fixture certificate's validity.
    public static let signedDate: Int64 = 1_893_456_000_000

    /// The trusted chain, leaf first.
    public static let appleChain = ["apple/leaf.pem", "apple/intermediate.pem", "apple/root.pem"]

    /// A configuration with one app, `demo`, taking all four stores with the fixtures' roots and keys.
    public static func configuration(
        environments: [String] = ["Sandbox", "Production"], appAppleId: Int64? = 1234, jwks: String? = nil,
        verifyNestedSignatures: Bool? = nil, extraYAML: String = ""
    ) throws -> RelayConfiguration {
        let yaml = """
            apps:
              - key: demo
                projectId: 1
                applicationId: 1
                apple: { bundleId: com.example.app, \(appAppleId.map { "appAppleId: \($0)," } ?? "") environments: \(environments), rootCertificates: [apple/root.pem]\(verifyNestedSignatures.map { ", verifyNestedSignatures: \($0)" } ?? "") }
                google: { packageName: com.example.app, pushAudience: "https://relay.example.com/v1/notifications/google/demo", pushServiceAccount: "pubsub-push@example.iam.gserviceaccount.com", jwks: "\(jwks ?? "google/jwks.json")" }
                stripe: { signingSecrets: ["whsec_old_secret", "whsec_test_secret"] }
                paddle: { secretKeys: ["pdl_ntfset_01h8bzakzx_TESTSECRET"] }
              - key: stripe-only
                projectId: 1
                applicationId: 2
                stripe: { signingSecrets: ["whsec_other"] }
            \(extraYAML)
            """
        return try RelayConfiguration.parse(yaml: yaml, baseDirectory: directory.path, environment: [:])
    }
}

/// Signs App Store–shaped JWSs with a fixture leaf key and chain.
public struct AppleSigner: Sendable {
    public var key: PrivateKey
    public var chain: [String]
    public var header: JSON

    public init(key: String = "apple/leaf.key", chain: [String] = Fixtures.appleChain) {
        self.key = Fixtures.privateKey(key)
        self.chain = chain.map(Fixtures.x5c)
        self.header = ["alg": "ES256", "x5c": .array(self.chain.map(JSON.string))]
    }

    /// A compact JWS of `payload`.
    public func sign(_ payload: JSON) -> String {
        let input = Base64.encodeURL(header.serialized()) + "." + Base64.encodeURL(payload.serialized())
        let signature = try! key.signES256(Array(input.utf8))
        return input + "." + Base64.encodeURL(signature)
    }

    /// A transaction payload of this app.
    public static func transaction(
        originalTransactionId: String = "2000000123456789", environment: String = "Sandbox", bundleId: String = "com.example.app",
        signedDate: Int64 = Fixtures.signedDate
    ) -> JSON {
        [
            "transactionId": "2000000999999999", "originalTransactionId": .string(originalTransactionId),
            "bundleId": .string(bundleId), "productId": "com.example.pro.monthly", "purchaseDate": .integer(signedDate - 1000),
            "expiresDate": .integer(signedDate + 2_592_000_000), "type": "Auto-Renewable Subscription",
            "environment": .string(environment), "signedDate": .integer(signedDate), "price": 9990, "currency": "USD",
            "transactionReason": "PURCHASE", "inAppOwnershipType": "PURCHASED",
        ]
    }

    public static func renewalInfo(environment: String = "Sandbox", signedDate: Int64 = Fixtures.signedDate) -> JSON {
        [
            "originalTransactionId": "2000000123456789", "autoRenewProductId": "com.example.pro.monthly",
            "productId": "com.example.pro.monthly", "autoRenewStatus": 1, "environment": .string(environment),
            "signedDate": .integer(signedDate),
        ]
    }

    /// A SUBSCRIBED notification payload with both nested JWSs signed by this signer.
    public func notificationPayload(
        type: String = "SUBSCRIBED", subtype: String? = "INITIAL_BUY", environment: String = "Sandbox",
        bundleId: String = "com.example.app", appAppleId: Int64? = 1234, signedDate: Int64? = Fixtures.signedDate,
        transaction: JSON? = nil, renewalInfo: JSON? = nil
    ) -> JSON {
        var data: [String: JSON] = [
            "bundleId": .string(bundleId), "environment": .string(environment), "bundleVersion": "1.0", "status": 1,
            "signedTransactionInfo": .string(sign(transaction ?? Self.transaction(environment: environment))),
            "signedRenewalInfo": .string(sign(renewalInfo ?? Self.renewalInfo(environment: environment))),
        ]
        if let appAppleId { data["appAppleId"] = .integer(appAppleId) }
        var payload: [String: JSON] = [
            "notificationType": .string(type), "notificationUUID": "5b6d8e2c-1f0a-4c1e-9a57-3f2f0b6a9c11", "version": "2.0",
            "data": .object(data),
        ]
        if let subtype { payload["subtype"] = .string(subtype) }
        if let signedDate { payload["signedDate"] = .integer(signedDate) }
        return .object(payload)
    }

    /// The request body App Store Server Notifications V2 POSTs.
    public func body(_ payload: JSON) -> [UInt8] {
        JSON.object(["signedPayload": .string(sign(payload))]).serialized()
    }
}

/// Signs Pub/Sub push OIDC tokens with a fixture RSA key, and builds push envelopes.
public struct GooglePushSigner: Sendable {
    public var key: PrivateKey
    public var kid: String

    public init(key: String = "google/push-signing-1.key", kid: String = "relay-test-1") {
        self.key = Fixtures.privateKey(key)
        self.kid = kid
    }

    public static func claims(issuedAt: Int64, overrides: [String: JSON] = [:]) -> JSON {
        var claims: [String: JSON] = [
            "iss": "https://accounts.google.com", "aud": "https://relay.example.com/v1/notifications/google/demo",
            "email": "pubsub-push@example.iam.gserviceaccount.com", "email_verified": true, "azp": "113774264463038321964",
            "sub": "113774264463038321964", "iat": .integer(issuedAt), "exp": .integer(issuedAt + 3600),
        ]
        for (key, value) in overrides { claims[key] = value.isNull ? nil : value }
        return .object(claims)
    }

    public func token(_ claims: JSON, header: JSON? = nil) -> String {
        let header = header ?? ["alg": "RS256", "kid": .string(kid), "typ": "JWT"]
        let input = Base64.encodeURL(header.serialized()) + "." + Base64.encodeURL(claims.serialized())
        return input + "." + Base64.encodeURL(try! key.signRS256(Array(input.utf8)))
    }

    public static func developerNotification(packageName: String = "com.example.app", code: Int64 = 4) -> JSON {
        [
            "version": "1.0", "packageName": .string(packageName), "eventTimeMillis": "1893456000000",
            "subscriptionNotification": [
                "version": "1.0", "notificationType": .integer(code), "purchaseToken": "token-abc", "subscriptionId": "pro_monthly",
            ],
        ]
    }

    public static func envelope(_ notification: JSON, messageId: String = "136969346945") -> [UInt8] {
        JSON.object([
            "message": [
                "attributes": [:], "data": .string(Base64.encode(notification.serialized())), "messageId": .string(messageId),
                "publishTime": "2030-01-01T00:00:00.000Z",
            ],
            "subscription": "projects/example/subscriptions/relay-push",
        ]).serialized()
    }
}

/// Stripe's and Paddle's signature headers, computed as their libraries do.
public enum WebhookSigning {
    public static func stripeHeader(body: [UInt8], secret: String, timestamp: Int64) -> String {
        "t=\(timestamp),v1=\(Digest.hex(Digest.hmacSHA256(key: Array(secret.utf8), message: Array("\(timestamp).".utf8) + body)!))"
    }

    public static func paddleHeader(body: [UInt8], secret: String, timestamp: Int64) -> String {
        "ts=\(timestamp);h1=\(Digest.hex(Digest.hmacSHA256(key: Array(secret.utf8), message: Array("\(timestamp):".utf8) + body)!))"
    }
}
