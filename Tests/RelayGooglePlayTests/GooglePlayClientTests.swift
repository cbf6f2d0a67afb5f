import Foundation
import Logging
import RelayConfig
import RelayCore
import RelayGooglePlay
import RelayHTTPClient
import RelayTestSupport
import RelayVerification
import Testing

/// Google's OAuth token endpoint (`POST /token`) and the Play Developer API (everything else) on one
/// `TestHTTPServer`, each answering by a script that gets the request and its 0-based index among that
/// endpoint's requests.
final class FakeGoogle: Sendable {
    typealias Script = @Sendable (_ request: TestHTTPRequest, _ index: Int) async -> TestHTTPResponse

    let server: TestHTTPServer
    /// The client's clock (seconds since 1970).
    let clock = LockedBox<Int64>(1_900_000_000)

    var tokenURL: String { server.baseURL + "/token" }
    var tokenRequests: [TestHTTPRequest] { server.requests.filter { $0.path == "/token" } }
    var apiRequests: [TestHTTPRequest] { server.requests.filter { $0.path != "/token" } }

    init(token: @escaping Script = FakeGoogle.grant, api: @escaping Script = FakeGoogle.subscription) async throws {
        let counts = LockedBox<[String: Int]>([:])
        server = try await TestHTTPServer { request in
            let endpoint = request.path == "/token" ? "token" : "api"
            let index = counts.withLock { counts -> Int in
                defer { counts[endpoint, default: 0] += 1 }
                return counts[endpoint, default: 0]
            }
            return await (endpoint == "token" ? token : api)(request, index)
        }
    }

    /// The access token the n-th token request is granted.
    static func accessToken(_ index: Int) -> String { "ya29.test-access-token-\(index)" }

    /// A successful grant: `{"access_token", "expires_in": 3599, "token_type": "Bearer"}`.
    static let grant: Script = { _, index in
        json(["access_token": .string(accessToken(index)), "expires_in": 3599, "token_type": "Bearer"])
    }

    static let subscriptionPurchase: JSON = [
        "kind": "androidpublisher#subscriptionPurchaseV2", "regionCode": "US", "startTime": "2030-01-01T00:00:00.000Z",
        "subscriptionState": "SUBSCRIPTION_STATE_ACTIVE", "latestOrderId": "GPA.3345-1234-5678-90123",
        "acknowledgementState": "ACKNOWLEDGEMENT_STATE_ACKNOWLEDGED",
        "externalAccountIdentifiers": ["obfuscatedExternalAccountId": "user-42"],
        "lineItems": [["productId": "pro_monthly", "expiryTime": "2030-02-01T00:00:00.000Z", "offerDetails": ["basePlanId": "monthly"]]],
    ]

    static let subscription: Script = { _, _ in json(subscriptionPurchase) }

    static func json(_ value: JSON, status: Int = 200) -> TestHTTPResponse {
        TestHTTPResponse(status: status, headers: [("Content-Type", "application/json")], body: value.serialized())
    }

    /// Google's API error body.
    static func apiError(_ status: Int, _ code: String, _ message: String) -> TestHTTPResponse {
        json(["error": ["code": .integer(Int64(status)), "message": .string(message), "status": .string(code)]], status: status)
    }

    /// A client of this server with the fixture service account and the fake clock.
    func client(logger: Logger = testLogger()) throws -> GooglePlayClient {
        try GooglePlayClient(
            configuration: try playAPI(baseUrl: server.baseURL, tokenUrl: tokenURL), http: testHTTPClient, logger: logger,
            now: { [clock] in clock.value })
    }

    func stop() async { await server.stop() }
}

let testHTTPClient = HTTPClient(connectTimeout: .seconds(2), timeout: .seconds(10), maxConcurrentTransfers: 8)

/// `playApi` as the configuration parser makes it (relative paths resolve against `Tests/Fixtures`).
func playAPI(baseUrl: String, tokenUrl: String, serviceAccountKey: String = "google/service-account.json") throws -> RelayConfiguration.PlayAPI {
    let yaml = """
        apps:
          - key: play
            projectId: 1
            applicationId: 1
            google:
              packageName: com.example.app
              pushAudience: "https://relay.example.com/v1/notifications/google/play"
              pushServiceAccount: "pubsub-push@example.iam.gserviceaccount.com"
              jwks: google/jwks.json
              playApi: { baseUrl: "\(baseUrl)", tokenUrl: "\(tokenUrl)", serviceAccountKey: "\(serviceAccountKey)" }
        """
    let configuration = try RelayConfiguration.parse(yaml: yaml, baseDirectory: Fixtures.directory.path, environment: [:])
    return try #require(configuration.app("play")?.google?.playApi)
}

@Suite struct GooglePlayClientTests {
    static let packageName = "com.example.app"
    static let serviceAccount = "relay-play@relay-test.iam.gserviceaccount.com"

    // MARK: OAuth

    @Test func theTokenRequestIsASignedJWTBearerGrant() async throws {
        let google = try await FakeGoogle()
        _ = try await google.client().subscription(packageName: Self.packageName, purchaseToken: "token-abc")

        let request = try #require(google.tokenRequests.first)
        #expect(google.tokenRequests.count == 1)
        #expect(request.method == "POST")
        #expect(request.headers["content-type"] == "application/x-www-form-urlencoded")
        let body = String(decoding: request.body, as: UTF8.self)
        let prefix = "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion="
        #expect(body.hasPrefix(prefix))
        var form: [String: String] = [:]
        for pair in body.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map { String($0).removingPercentEncoding ?? "" }
            form[parts[0]] = parts.count > 1 ? parts[1] : ""
        }
        #expect(form["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer")
        let assertion = try #require(form["assertion"])

        let parts = assertion.split(separator: ".", omittingEmptySubsequences: false)
        try #require(parts.count == 3)
        let strict = { (part: Substring) in Base64.decode(Array(part.utf8), alphabet: .url, padding: .forbidden, canonical: true) }
        let header = try JSON.parse(try #require(strict(parts[0])))
        let claims = try JSON.parse(try #require(strict(parts[1])))
        let signature = try #require(strict(parts[2]))
        let publicKey = Fixtures.privateKey("google/service-account.key").publicKey
        #expect(publicKey.verifyRS256(Array("\(parts[0]).\(parts[1])".utf8), signature: signature))

        #expect(header == ["alg": "RS256", "typ": "JWT", "kid": "test-key-1"])
        #expect(claims["iss"] == .string(Self.serviceAccount))
        #expect(claims["scope"] == "https://www.googleapis.com/auth/androidpublisher")
        #expect(claims["aud"] == .string(google.tokenURL))
        #expect(claims["iat"] == .integer(google.clock.value))
        #expect(claims["exp"] == .integer(google.clock.value + 3600))
        #expect(claims.objectValue?.count == 5)
        await google.stop()
    }

    @Test func aKeyFileWithoutKeyIdSendsNoKid() async throws {
        let directory = try TemporaryDirectory()
        var document = try JSON.parse(Fixtures.text("google/service-account.json"))
        if case .object(var members) = document {
            members["private_key_id"] = nil
            document = .object(members)
        }
        let path = try directory.write("no-kid.json", document.serialized())
        let google = try await FakeGoogle()
        let client = try GooglePlayClient(
            configuration: try playAPI(baseUrl: google.server.baseURL, tokenUrl: google.tokenURL, serviceAccountKey: path), http: testHTTPClient,
            logger: testLogger())
        _ = try await client.subscription(packageName: Self.packageName, purchaseToken: "token-abc")
        let body = String(decoding: try #require(google.tokenRequests.first).body, as: UTF8.self)
        let assertion = try #require(body.split(separator: "&").last?.split(separator: "=").last)
        let headerPart = try #require(assertion.split(separator: ".").first)
        let header = try JSON.parse(try #require(Base64.decode(headerPart)))
        #expect(header == ["alg": "RS256", "typ": "JWT"])
        await google.stop()
    }

    // MARK: API requests

    @Test func subscriptionReturnsTheServedPurchaseWithTheBearerToken() async throws {
        let google = try await FakeGoogle()
        let purchase = try await google.client().subscription(packageName: Self.packageName, purchaseToken: "token-abc")
        #expect(purchase == FakeGoogle.subscriptionPurchase)
        let request = try #require(google.apiRequests.first)
        #expect(request.method == "GET")
        #expect(request.path == "/androidpublisher/v3/applications/com.example.app/purchases/subscriptionsv2/tokens/token-abc")
        #expect(request.headers["authorization"] == "Bearer \(FakeGoogle.accessToken(0))")
        #expect(request.headers["accept"] == "application/json")
        await google.stop()
    }

    @Test func pathSegmentsArePercentEncoded() async throws {
        let google = try await FakeGoogle()
        let client = try google.client()
        let token = "abc/def+ghi==.~_-"
        _ = try await client.subscription(packageName: Self.packageName, purchaseToken: token)
        _ = try await client.product(packageName: Self.packageName, productId: "coins 100", purchaseToken: token)
        _ = try await client.subscription(packageName: Self.packageName, purchaseToken: "..")
        #expect(google.apiRequests.map(\.path) == [
            "/androidpublisher/v3/applications/com.example.app/purchases/subscriptionsv2/tokens/abc%2Fdef%2Bghi%3D%3D.~_-",
            "/androidpublisher/v3/applications/com.example.app/purchases/products/coins%20100/tokens/abc%2Fdef%2Bghi%3D%3D.~_-",
            "/androidpublisher/v3/applications/com.example.app/purchases/subscriptionsv2/tokens/%2E%2E",
        ])
        await google.stop()
    }

    @Test func productReturnsTheServedProductPurchase() async throws {
        let purchase: JSON = [
            "kind": "androidpublisher#productPurchase", "purchaseTimeMillis": "1893456000000", "purchaseState": 0, "consumptionState": 0,
            "orderId": "GPA.1234-5678-9012-34567", "purchaseType": 0, "acknowledgementState": 1, "regionCode": "US",
        ]
        let google = try await FakeGoogle(api: { _, _ in FakeGoogle.json(purchase) })
        #expect(try await google.client().product(packageName: Self.packageName, productId: "coins_100", purchaseToken: "t") == purchase)
        #expect(google.apiRequests.first?.path == "/androidpublisher/v3/applications/com.example.app/purchases/products/coins_100/tokens/t")
        await google.stop()
    }

    @Test func aBodyThatIsNotAJSONObjectIsAnInvalidResponse() async throws {
        for body in ["<html>oops</html>", "[1, 2]", "\"text\"", ""] {
            let google = try await FakeGoogle(api: { _, _ in TestHTTPResponse(text: body) })
            let error = await caughtError(StoreAPIError.self) { _ = try await google.client().subscription(packageName: Self.packageName, purchaseToken: "t") }
            #expect(error?.kind == .invalidResponse, "\(body)")
            #expect(error?.isRetriable == false)
            #expect(google.apiRequests.count == 1, "not retried")
            await google.stop()
        }
    }

    // MARK: Token cache

    @Test func theTokenIsCachedUntilSixtySecondsBeforeItExpires() async throws {
        let google = try await FakeGoogle()
        let client = try google.client()
        let start = google.clock.value
        _ = try await client.subscription(packageName: Self.packageName, purchaseToken: "a")
        _ = try await client.subscription(packageName: Self.packageName, purchaseToken: "b")
        #expect(google.tokenRequests.count == 1)
        // Granted for 3599 s at `start`: still used at start + 3538, replaced from start + 3539 on.
        google.clock.withLock { $0 = start + 3538 }
        _ = try await client.product(packageName: Self.packageName, productId: "coins", purchaseToken: "c")
        #expect(google.tokenRequests.count == 1)
        google.clock.withLock { $0 = start + 3539 }
        _ = try await client.subscription(packageName: Self.packageName, purchaseToken: "d")
        #expect(google.tokenRequests.count == 2)
        #expect(google.apiRequests.map { $0.headers["authorization"] } == [0, 0, 0, 1].map { "Bearer \(FakeGoogle.accessToken($0))" })
        await google.stop()
    }

    @Test func concurrentCallersShareOneTokenRequest() async throws {
        let google = try await FakeGoogle(token: { request, index in
            try? await Task.sleep(for: .milliseconds(100))  // keep the request in flight while the others arrive
            return await FakeGoogle.grant(request, index)
        })
        let client = try google.client()
        try await withThrowingTaskGroup(of: JSON.self) { group in
            for number in 0..<10 {
                group.addTask { try await client.subscription(packageName: Self.packageName, purchaseToken: "token-\(number)") }
            }
            for try await purchase in group { #expect(purchase == FakeGoogle.subscriptionPurchase) }
        }
        #expect(google.tokenRequests.count == 1)
        #expect(google.apiRequests.count == 10)
        #expect(Set(google.apiRequests.map { $0.headers["authorization"] }) == ["Bearer \(FakeGoogle.accessToken(0))"])
        await google.stop()
    }

    // MARK: Failures

    @Test func a401RefreshesTheTokenOnceAndRetries() async throws {
        let google = try await FakeGoogle(api: { request, _ in
            request.headers["authorization"] == "Bearer \(FakeGoogle.accessToken(0))"
                ? FakeGoogle.apiError(401, "UNAUTHENTICATED", "Request had invalid authentication credentials.")
                : FakeGoogle.json(FakeGoogle.subscriptionPurchase)
        })
        let client = try google.client()
        #expect(try await client.subscription(packageName: Self.packageName, purchaseToken: "t") == FakeGoogle.subscriptionPurchase)
        #expect(google.tokenRequests.count == 2)
        #expect(google.apiRequests.map { $0.headers["authorization"] } == [0, 1].map { "Bearer \(FakeGoogle.accessToken($0))" })
        // The fresh token is the cached one now.
        _ = try await client.subscription(packageName: Self.packageName, purchaseToken: "t")
        #expect(google.tokenRequests.count == 2)
        await google.stop()
    }

    @Test func a401ThatAFreshTokenDoesNotCureIsRejected() async throws {
        let google = try await FakeGoogle(api: { _, _ in FakeGoogle.apiError(401, "UNAUTHENTICATED", "Request had invalid authentication credentials.") })
        let error = await caughtError(StoreAPIError.self) { _ = try await google.client().subscription(packageName: Self.packageName, purchaseToken: "t") }
        #expect(error?.kind == .rejected)
        #expect(error?.description.contains("HTTP 401") == true)
        #expect(google.tokenRequests.count == 2)
        #expect(google.apiRequests.count == 2)
        await google.stop()
    }

    @Test(arguments: [404, 410])
    func anUnknownOrExpiredPurchaseTokenIsNotFound(status: Int) async throws {
        let google = try await FakeGoogle(api: { _, _ in FakeGoogle.apiError(status, "NOT_FOUND", "The purchase token was not found.") })
        let error = await caughtError(StoreAPIError.self) { _ = try await google.client().subscription(packageName: Self.packageName, purchaseToken: "t") }
        #expect(error?.kind == .notFound)
        #expect(error?.isRetriable == false)
        #expect(google.apiRequests.count == 1)
        await google.stop()
    }

    @Test func aForbiddenRequestIsRejectedWithGooglesReason() async throws {
        let logs = LogRecorder(label: "play-test")
        let message = "The current user has insufficient permissions to perform the requested operation."
        let google = try await FakeGoogle(api: { _, _ in FakeGoogle.apiError(403, "PERMISSION_DENIED", message) })
        let error = try #require(
            await caughtError(StoreAPIError.self) { _ = try await google.client(logger: logs.logger).subscription(packageName: Self.packageName, purchaseToken: "t") })
        #expect(error.kind == .rejected)
        #expect(!error.isRetriable)
        #expect(error.message.contains("HTTP 403"))
        #expect(error.message.contains("PERMISSION_DENIED"))
        #expect(error.message.contains(message))
        #expect(error.message.contains(Self.serviceAccount), "says which account needs access")
        #expect(google.apiRequests.count == 1, "not retried")
        for text in [error.description, logs.text] { expectNoSecrets(text, google) }
        await google.stop()
    }

    @Test func unavailableIsRetriedTwiceWithBackoff() async throws {
        let google = try await FakeGoogle(api: { _, index in
            index < 2 ? TestHTTPResponse(status: 503, text: "busy") : FakeGoogle.json(FakeGoogle.subscriptionPurchase)
        })
        let started = ContinuousClock.now
        #expect(try await google.client().subscription(packageName: Self.packageName, purchaseToken: "t") == FakeGoogle.subscriptionPurchase)
        #expect(ContinuousClock.now - started >= .milliseconds(300), "100 ms, then 200 ms")
        #expect(google.apiRequests.count == 3)
        #expect(google.tokenRequests.count == 1)
        await google.stop()
    }

    @Test(arguments: [503, 500, 429])
    func alwaysUnavailableGivesUpAfterThreeAttempts(status: Int) async throws {
        let google = try await FakeGoogle(api: { _, _ in TestHTTPResponse(status: status, text: "busy") })
        let error = await caughtError(StoreAPIError.self) { _ = try await google.client().subscription(packageName: Self.packageName, purchaseToken: "t") }
        #expect(error?.kind == .unavailable)
        #expect(error?.isRetriable == true)
        #expect(error?.message.contains("HTTP \(status)") == true)
        #expect(google.apiRequests.count == 3)
        await google.stop()
    }

    @Test func aRefusedGrantIsRejectedWithGooglesErrorAndNoSecrets() async throws {
        let logs = LogRecorder(label: "play-test")
        let google = try await FakeGoogle(token: { _, _ in
            FakeGoogle.json(["error": "invalid_grant", "error_description": "Invalid JWT Signature."], status: 400)
        })
        let error = try #require(
            await caughtError(StoreAPIError.self) { _ = try await google.client(logger: logs.logger).subscription(packageName: Self.packageName, purchaseToken: "t") })
        #expect(error.kind == .rejected)
        #expect(error.message.contains("\"invalid_grant\""))
        #expect(error.message.contains("\"Invalid JWT Signature.\""))
        #expect(error.message.contains("HTTP 400"))
        #expect(google.tokenRequests.count == 1, "not retried")
        #expect(google.apiRequests.isEmpty)
        for text in [error.description, logs.text] { expectNoSecrets(text, google) }
        await google.stop()
    }

    @Test func anEchoedAssertionIsBlankedOut() async throws {
        let google = try await FakeGoogle(token: { request, _ in
            let assertion = String(decoding: request.body, as: UTF8.self).split(separator: "=").last.map(String.init) ?? ""
            return FakeGoogle.json(["error": "invalid_grant", "error_description": .string("bad assertion \(assertion)")], status: 400)
        })
        let error = try #require(await caughtError(StoreAPIError.self) { _ = try await google.client().subscription(packageName: Self.packageName, purchaseToken: "t") })
        #expect(error.message.contains("bad assertion [assertion]"))
        expectNoSecrets(error.description, google)
        await google.stop()
    }

    @Test func aFailingTokenEndpointIsUnavailable() async throws {
        let google = try await FakeGoogle(token: { _, _ in TestHTTPResponse(status: 503, text: "busy") })
        let error = await caughtError(StoreAPIError.self) { _ = try await google.client().subscription(packageName: Self.packageName, purchaseToken: "t") }
        #expect(error?.kind == .unavailable)
        #expect(google.tokenRequests.count == 3)
        #expect(google.apiRequests.isEmpty)
        await google.stop()
    }

    @Test func aTokenAnswerWithoutATokenIsAnInvalidResponse() async throws {
        let google = try await FakeGoogle(token: { _, _ in FakeGoogle.json(["expires_in": 3599, "token_type": "Bearer"]) })
        let error = await caughtError(StoreAPIError.self) { _ = try await google.client().subscription(packageName: Self.packageName, purchaseToken: "t") }
        #expect(error?.kind == .invalidResponse)
        #expect(google.apiRequests.isEmpty)
        await google.stop()
    }

    @Test func aRefusedConnectionIsUnavailable() async throws {
        let closed = try await TestHTTPServer { _ in TestHTTPResponse() }
        let url = closed.baseURL
        await closed.stop()
        let client = try GooglePlayClient(
            configuration: try playAPI(baseUrl: url, tokenUrl: url + "/token"), http: testHTTPClient, logger: testLogger())
        let error = await caughtError(StoreAPIError.self) { _ = try await client.subscription(packageName: Self.packageName, purchaseToken: "t") }
        #expect(error?.kind == .unavailable)
        #expect(error?.isRetriable == true)

        // A token, but the API itself is down.
        let google = try await FakeGoogle()
        let apiDown = try GooglePlayClient(
            configuration: try playAPI(baseUrl: url, tokenUrl: google.tokenURL), http: testHTTPClient, logger: testLogger())
        let apiError = await caughtError(StoreAPIError.self) { _ = try await apiDown.subscription(packageName: Self.packageName, purchaseToken: "t") }
        #expect(apiError?.kind == .unavailable)
        #expect(apiError?.message.contains("could not be reached") == true)
        #expect(google.tokenRequests.count == 1, "the token stays cached across the retries")
        await google.stop()
    }

    // MARK: Configuration

    @Test func aMissingOrBadKeyFileIsAConfigurationError() async throws {
        let directory = try TemporaryDirectory()
        let valid = try JSON.parse(Fixtures.text("google/service-account.json"))
        func variant(_ name: String, _ change: (inout [String: JSON]) -> Void) throws -> String {
            guard case .object(var members) = valid else { return "" }
            change(&members)
            return try directory.write(name, JSON.object(members).serialized())
        }
        let garbageKey = "-----BEGIN PRIVATE KEY-----\nTm90IGEga2V5IGF0IGFsbA==\n-----END PRIVATE KEY-----\n"
        let cases: [(path: String, mentions: [String])] = [
            (directory.path + "/missing.json", ["missing.json", "cannot read"]),
            (try directory.write("text.json", Array("not json".utf8)), ["text.json", "JSON object"]),
            (try variant("user.json") { $0["type"] = "authorized_user" }, ["user.json", "\"type\"", "service_account"]),
            (try variant("no-type.json") { $0["type"] = nil }, ["no-type.json", "\"type\""]),
            (try variant("no-email.json") { $0["client_email"] = nil }, ["no-email.json", "\"client_email\""]),
            (try variant("no-key.json") { $0["private_key"] = nil }, ["no-key.json", "\"private_key\""]),
            (try variant("bad-key.json") { $0["private_key"] = .string(garbageKey) }, ["bad-key.json", "\"private_key\"", "PEM"]),
            (try variant("ec-key.json") { $0["private_key"] = .string(Fixtures.text("apple/leaf.key")) }, ["ec-key.json", "\"private_key\"", "RSA"]),
            (try variant("key-id.json") { $0["private_key_id"] = 7 }, ["key-id.json", "\"private_key_id\""]),
        ]
        for (path, mentions) in cases {
            var configuration = try playAPI(baseUrl: "http://127.0.0.1:9", tokenUrl: "http://127.0.0.1:9/token")
            configuration.serviceAccountKey = path
            let error = await caughtError(StoreAPIError.self) { _ = try GooglePlayClient(configuration: configuration, logger: testLogger()) }
            #expect(error?.kind == .configuration, "\(path)")
            for mention in mentions { #expect(error?.message.contains(mention) == true, "\(path): \(error?.message ?? "") names \(mention)") }
            #expect(error?.message.contains("Tm90IGEga2V5") == false)
            #expect(error?.message.contains("BEGIN") == false)
        }

        var unset = try playAPI(baseUrl: "http://127.0.0.1:9", tokenUrl: "http://127.0.0.1:9/token")
        unset.serviceAccountKey = nil
        let error = await caughtError(StoreAPIError.self) { _ = try GooglePlayClient(configuration: unset, logger: testLogger()) }
        #expect(error?.kind == .configuration)
        #expect(error?.message.contains("serviceAccountKey") == true)
    }

    @Test func theFixtureKeyFileIsAccepted() throws {
        let configuration = try playAPI(baseUrl: "http://127.0.0.1:9", tokenUrl: "http://127.0.0.1:9/token")
        #expect(try GooglePlayClient(configuration: configuration, logger: testLogger()).serviceAccount == Self.serviceAccount)
    }

    // MARK: Helpers

    /// `text` holds no access token, no assertion (or any JWT-looking text) and no private key.
    func expectNoSecrets(_ text: String, _ google: FakeGoogle, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(!text.contains("ya29."), "access token in: \(text)", sourceLocation: sourceLocation)
        #expect(!text.contains("eyJ"), "JWT in: \(text)", sourceLocation: sourceLocation)
        #expect(!text.contains("PRIVATE KEY"), "private key in: \(text)", sourceLocation: sourceLocation)
        for request in google.tokenRequests {
            let assertion = String(decoding: request.body, as: UTF8.self).split(separator: "=").last.map(String.init) ?? "-"
            #expect(!text.contains(assertion), "assertion in: \(text)", sourceLocation: sourceLocation)
        }
    }
}

/// A directory under the system's temporary directory, for key files the tests write; removed with
/// its contents when the last reference goes.
final class TemporaryDirectory {
    let path: String

    init() throws {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("relay-play-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }

    /// Writes `bytes` to `name` and returns the file's path.
    func write(_ name: String, _ bytes: [UInt8]) throws -> String {
        let file = path + "/" + name
        try Data(bytes).write(to: URL(fileURLWithPath: file))
        return file
    }
}
