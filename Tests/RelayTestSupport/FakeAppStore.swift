import Foundation
public import Logging
public import RelayAppStoreAPI
public import RelayCore
public import RelayCrypto
public import RelayHTTPClient

/// The App Store Server API on a `TestHTTPServer`. Like Apple, it answers 401 to any request whose
/// bearer token is not an ES256 JWT signed by the test key with the documented header and claims,
/// checked here independently of the client's signer; the rest is up to each test's script, which
/// gets the request and its 0-based index among the authorized ones.
public final class FakeAppStore: Sendable {
    public typealias Script = @Sendable (_ request: TestHTTPRequest, _ index: Int) async -> TestHTTPResponse

    public static let keyId = "TESTKEY123"
    public static let issuerId = "57246542-96fe-1a63-e053-0824d011072a"
    public static let bundleId = "com.example.app"
    /// The `.p8` stand-in: the fixtures' EC P-256 key (PKCS#8 PEM, as App Store Connect downloads it).
    public static let keyFile = "apple/leaf.key"

    public let server: TestHTTPServer
    /// The clock of both the client and the fake server (seconds since 1970).
    public let clock: LockedBox<Int64>
    /// Why tokens were refused, in order.
    public let refusals: LockedBox<[String]>

    public var baseURL: String { server.baseURL }
    public var requests: [TestHTTPRequest] { server.requests }

    /// - Parameter systemClock: check tokens against the system clock instead of `clock`: for clients
    ///   on the system clock (the relay's commands), whose tokens would look expired or not yet valid.
    public init(systemClock: Bool = false, _ script: @escaping Script) async throws {
        let publicKey = Fixtures.privateKey(Self.keyFile).publicKey
        let clock = LockedBox<Int64>(1_900_000_000), refusals = LockedBox<[String]>([])
        let authorized = LockedBox(0)
        self.clock = clock
        self.refusals = refusals
        server = try await TestHTTPServer { request in
            if let problem = Self.tokenProblem(request.headers["authorization"], publicKey: publicKey, now: systemClock ? Self.systemNow : clock.value) {
                refusals.withLock { $0.append(problem) }
                return TestHTTPResponse(status: 401, text: "Unauthenticated\n\nRequest ID: TEST.0.0")
            }
            let index = authorized.withLock { count -> Int in
                defer { count += 1 }
                return count
            }
            return await script(request, index)
        }
    }

    /// Nil when `authorization` is `Bearer <JWT>` with header {alg ES256, kid, typ JWT}, a valid ES256
    /// signature by `publicKey`, and claims iss, bid, aud as configured, iat not in the future, exp in
    /// the future and at most an hour after iat; else what is wrong.
    public static func tokenProblem(_ authorization: String?, publicKey: PublicKey, now: Int64) -> String? {
        guard let authorization, authorization.hasPrefix("Bearer ") else { return "no bearer token" }
        let parts = authorization.dropFirst("Bearer ".count).split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else { return "not a compact JWS" }
        let strict = { (part: Substring) in Base64.decode(Array(part.utf8), alphabet: .url, padding: .forbidden, canonical: true) }
        guard let headerBytes = strict(parts[0]), let header = try? JSON.parse(headerBytes) else { return "header is not base64url JSON" }
        guard let claimBytes = strict(parts[1]), let claims = try? JSON.parse(claimBytes) else { return "claims are not base64url JSON" }
        guard let signature = strict(parts[2]), signature.count == 64 else { return "signature is not 64 raw bytes" }
        guard header == ["alg": "ES256", "kid": .string(keyId), "typ": "JWT"] else { return "header \(header.text)" }
        guard publicKey.verifyES256(Array("\(parts[0]).\(parts[1])".utf8), rawSignature: signature) else { return "bad signature" }
        guard claims["aud"] == "appstoreconnect-v1" else { return "aud" }
        guard claims["iss"] == .string(issuerId) else { return "iss" }
        guard claims["bid"] == .string(bundleId) else { return "bid" }
        guard let iat = claims["iat"]?.int64Value, let exp = claims["exp"]?.int64Value else { return "iat/exp not integers" }
        guard iat <= now else { return "iat in the future" }
        guard exp > now else { return "expired" }
        guard exp - iat <= 3600 else { return "lifetime over an hour" }
        return nil
    }

    public static func key(pem: String = Fixtures.text(FakeAppStore.keyFile), keyId: String = FakeAppStore.keyId) throws -> AppStoreConnectKey {
        try AppStoreConnectKey(pem: pem, keyId: keyId, issuerId: issuerId, bundleId: bundleId)
    }

    /// A client of this server with the fake clock and short retry delays.
    public func client(
        key: AppStoreConnectKey? = nil, retry: AppStoreServerClient.RetryPolicy = FakeAppStore.fastRetries, logger: Logger = testLogger()
    ) throws -> AppStoreServerClient {
        try AppStoreServerClient(
            key: key ?? Self.key(), environment: .sandbox, baseURL: baseURL + "/", http: Self.http, retry: retry, logger: logger,
            now: { [clock] in clock.value })
    }

    public static let fastRetries = AppStoreServerClient.RetryPolicy(delays: [.milliseconds(10), .milliseconds(20)], maximumRetryAfter: .seconds(5))

    public static func json(_ value: JSON, status: Int = 200, headers: [(String, String)] = []) -> TestHTTPResponse {
        TestHTTPResponse(status: status, headers: [("Content-Type", "application/json")] + headers, body: value.serialized())
    }

    /// Apple's error body.
    public static func appleError(_ status: Int, _ code: Int64, _ message: String, headers: [(String, String)] = []) -> TestHTTPResponse {
        json(["errorCode": .integer(code), "errorMessage": .string(message)], status: status, headers: headers)
    }

    public func stop() async { await server.stop() }
}

extension FakeAppStore {
    /// The HTTP client of `client()`.
    public static let http = HTTPClient(connectTimeout: .seconds(2), timeout: .seconds(10), maxConcurrentTransfers: 8)

    /// The current time, seconds since 1970: the clock for a fake the relay's own commands call.
    public static var systemNow: Int64 { Int64(Date().timeIntervalSince1970) }

    /// A request target split into its path and its decoded query parameters as (name, value), in order.
    public static func target(_ request: TestHTTPRequest) -> (path: String, query: [(String, String)]) {
        let parts = request.path.split(separator: "?", maxSplits: 1)
        let query = parts.count > 1
            ? parts[1].split(separator: "&").map { item -> (String, String) in
                let pair = item.split(separator: "=", maxSplits: 1).map { String($0).removingPercentEncoding ?? "" }
                return (pair[0], pair.count > 1 ? pair[1] : "")
            } : []
        return (String(parts[0]), query)
    }

    /// A JWSTransaction payload of the fixtures' app, signed by `signer` (the test Apple chain).
    public static func transaction(
        transactionId: String, originalTransactionId: String, productId: String = "com.example.pro.monthly",
        type: String = "Auto-Renewable Subscription", purchaseDate: Int64, expiresDate: Int64? = nil, signedDate: Int64,
        environment: String = "Sandbox", ownership: String = "PURCHASED", revocationDate: Int64? = nil, revocationReason: Int64? = nil,
        price: Int64 = 9990
    ) -> JSON {
        var object: [String: JSON] = [
            "transactionId": .string(transactionId), "originalTransactionId": .string(originalTransactionId), "bundleId": .string(bundleId),
            "productId": .string(productId), "purchaseDate": .integer(purchaseDate), "originalPurchaseDate": .integer(purchaseDate),
            "type": .string(type), "environment": .string(environment), "signedDate": .integer(signedDate), "price": .integer(price),
            "currency": "USD", "storefront": "USA", "transactionReason": "PURCHASE", "inAppOwnershipType": .string(ownership), "quantity": 1,
        ]
        if let expiresDate { object["expiresDate"] = .integer(expiresDate) }
        if let revocationDate { object["revocationDate"] = .integer(revocationDate) }
        if let revocationReason { object["revocationReason"] = .integer(revocationReason) }
        return .object(object)
    }
}
