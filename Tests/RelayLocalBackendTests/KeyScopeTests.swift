import Foundation
import Hummingbird
import Logging
import RelayConfig
import RelayCore
import RelayHTTPClient
@testable import RelayLocalBackend
import RelayTestSupport
import ServiceLifecycle
import Synchronization
import Testing

/// The kinds of key a request can carry (docs/contracts.md, "Keys and scopes"). "This app" is `ios`
/// (application 1), the app every request of the table asks about; "another app" is `android`
/// (application 2).
enum KeyKind: String, CaseIterable, Sendable {
    case secret, rotatedSecret, readThis, readOther, publicThis, publicOther, none, unknown

    var authorization: String? {
        switch self {
        case .secret: "Bearer sk_primary_0001"
        case .rotatedSecret: "Bearer sk_rotated_0002"
        case .readThis: "Bearer rk_ios_0003"
        case .readOther: "Bearer rk_android_0004"
        case .publicThis: "Bearer pk_ios_0005"
        case .publicOther: "Bearer pk_android_0006"
        case .none: nil
        // A known key with its last character changed.
        case .unknown: "Bearer sk_primary_0002"
        }
    }
}

/// A local backend with two apps, a user who bought in both, and every kind of key.
final class ScopedBackend: Sendable {
    static let yaml = """
        backend:
          apiKey: "sk_primary_0001"
          apiKeys: ["sk_rotated_0002"]
          listen: "127.0.0.1:0"
          database: "DATABASE"
          readKeys:
            - { key: "rk_ios_0003", apps: [ios] }
            - { key: "rk_android_0004", apps: [android] }
            - { key: "rk_both_0007", apps: [ios, android] }
          publicRateLimit: { requestsPerSecond: RATE, burst: 3 }
        apps:
          - key: ios
            projectId: 1
            applicationId: 1
            publicApiKeys: ["pk_ios_0005"]
            apple: { bundleId: com.example.ios, environments: [Xcode], grandfathering: [{ entitlements: [pro], originalAppVersionBelow: "2.0" }] }
            products:
              - { productId: com.example.pro.monthly, store: APP_STORE, entitlements: [pro] }
          - key: web
            projectId: 1
            applicationId: 3
            stripe: { signingSecrets: ["whsec_web"] }
          - key: android
            projectId: 1
            applicationId: 2
            publicApiKeys: ["pk_android_0006"]
            google: { packageName: com.example.android, pushAudience: "https://relay.example.com/g", pushServiceAccount: "push@example.iam.gserviceaccount.com", jwks: google-jwks.json }
            products:
              - { productId: premium_sub, store: PLAY_STORE, entitlements: [premium] }
        endpoints:
          - { id: hooks-ios, app: ios, url: "https://hooks.example.com/ios?token=secret-token", secrets: ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"] }
          - { id: hooks-android, app: android, url: "https://hooks.example.com/android", secrets: ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"] }
        """

    let url: String
    let database: SubscriptionDatabase
    let backend: LocalBackend
    let metrics = TestMetrics()
    /// The apps whose AppTransactions the route asked to verify.
    let verified = LockedBox<[String]>([])
    /// What the delivery action routes appended (resends and control records).
    let appended = LockedBox<[OutgoingRecord]>([])
    /// Monotonic nanoseconds for the rate limit, stepped by tests.
    let limiterClock = LockedBox<UInt64>(1_000_000_000)
    private let group: ServiceGroup
    private let task: Task<Void, any Error>

    /// `rate`: the public routes' requests a second per client (0: off), bursts of 3.
    /// - Parameter transferPolicy: `ios`'s `transferPolicy` (default: none configured, so `transfer`).
    init(rate: Double = 0, clientAddressHeader: String? = nil, trustedProxies: String? = nil, transferPolicy: String? = nil) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("scopes"))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try Data("{\"keys\": []}".utf8).write(to: directory.appendingPathComponent("google-jwks.json"))
        var yaml = Self.yaml.replacingOccurrences(of: "DATABASE", with: directory.appendingPathComponent("backend.sqlite").path)
            .replacingOccurrences(of: "RATE", with: String(rate))
        if let clientAddressHeader {
            yaml = yaml.replacingOccurrences(of: "burst: 3 }", with: "burst: 3, clientAddressHeader: \(clientAddressHeader) }")
        }
        if let transferPolicy {
            yaml = yaml.replacingOccurrences(of: "    publicApiKeys: [\"pk_ios_0005\"]", with: "    publicApiKeys: [\"pk_ios_0005\"]\n    transferPolicy: \(transferPolicy)")
        }
        if let trustedProxies {
            yaml = yaml.replacingOccurrences(of: "burst: 3", with: "burst: 3, trustedProxies: \(trustedProxies)")
        }
        let configuration = try RelayConfiguration.parse(yaml: yaml, baseDirectory: directory.path, environment: [:])
        database = try SubscriptionDatabase(path: configuration.backend.database)
        let verified = self.verified
        let limiterClock = self.limiterClock
        let grants = AppTransactionGrants(
            topic: "relay.notifications",
            verify: { app, _ in
                verified.withLock { $0.append(app) }
                return .failure(Rejection(.malformed, "test: AppTransactions of \(app) are not checked here"))
            },
            append: { _ in throw ScopeTestFailure("nothing may be appended") })
        let purchases = AppPurchases(
            topic: "relay.notifications", storeAPIs: StoreAPIs(),
            verifyApple: { app, _ in
                verified.withLock { $0.append(app) }
                return .failure(Rejection(.malformed, "test: transactions of \(app) are not checked here"))
            },
            append: { _ in throw ScopeTestFailure("nothing may be appended") })
        let appended = self.appended
        let actions = DeliveryActions(
            topic: "relay.deliveries", partitions: { 3 }, append: { records in appended.withLock { $0 += records } })
        backend = try LocalBackend(
            configuration: configuration, database: database, clock: { 1_800_000_000_000 }, appTransactions: grants, appPurchases: purchases,
            deliveryActions: actions, metrics: metrics,
            rateLimitClock: { limiterClock.value })
        let ports = AsyncStream.makeStream(of: Int.self)
        let application = backend.application(logger: testLogger()) { port in ports.continuation.yield(port) }
        group = ServiceGroup(services: [application], gracefulShutdownSignals: [], logger: testLogger())
        let group = self.group
        task = Task { try await group.run() }
        var iterator = ports.stream.makeAsyncIterator()
        url = "http://127.0.0.1:\(await iterator.next() ?? 0)"
    }

    /// `shared-user` bought in both apps; each app has one recorded event.
    func storeData() async throws {
        for state in [
            SubscriptionState(
                store: .apple, originalTransactionId: "1000", applicationId: 1, originalAppUserId: "shared-user", appUserIds: ["shared-user"],
                productId: "com.example.pro.monthly", status: .active, expiresAt: 4_000_000_000_000, environment: "PRODUCTION", sourceTimestamp: 1),
            SubscriptionState(
                store: .google, originalTransactionId: "token-2000", applicationId: 2, originalAppUserId: "shared-user", appUserIds: ["shared-user"],
                productId: "premium_sub", status: .active, expiresAt: 4_000_000_000_000, environment: "PRODUCTION", sourceTimestamp: 1),
        ] {
            guard case .written = try await database.write(state, ifMatch: 0) else { throw ScopeTestFailure("\(state.originalTransactionId) not written") }
        }
        _ = try await backend.events.record([
            .init(app: "ios", body: testEvent("e-ios", user: "shared-user", applicationId: 1)),
            .init(
                app: "android",
                body: testEvent("e-android", store: .google, user: "shared-user", subject: "token-2000", product: "premium_sub", price: 4.99, applicationId: 2)),
        ])
        // A webhook attempt for each app's endpoint.
        _ = try await backend.deliveryLog.record(
            [("ios", "e-ios"), ("android", "e-android")].map { app, event in
                DeliveryAttempt(
                    app: app, endpoint: "hooks-\(app)", eventId: event, eventType: "renewal", subject: nil, attempt: 1, outcome: .succeeded,
                    httpStatus: 200, durationMs: 5, error: nil, startedAt: 1_800_000_000_000, finishedAt: 1_800_000_000_005
                ).json.serialized()
            })
    }

    func send(_ method: String, _ path: String, _ kind: KeyKind, body: [UInt8] = [], headers: [(String, String)] = []) async throws -> HTTPClientResponse {
        var all = headers
        if let authorization = kind.authorization { all.append(("Authorization", authorization)) }
        if !body.isEmpty { all.append(("Content-Type", "application/json")) }
        return try await HTTPClient().send(method, url + path, headers: all, body: body)
    }

    func stop() async {
        await group.triggerGracefulShutdown()
        _ = try? await task.value
    }
}

struct ScopeTestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// One request of the table, what it is an instance of, and what each kind of key gets.
struct ScopeCase: Sendable {
    enum Expected: Sendable, Equatable {
        /// 200 (or another 2xx/4xx the route answers within its scope) with exactly these rows.
        case rows(Int, [String])
        case status(Int)
    }

    var route: BackendRoute
    var method: String
    var path: String
    var body: String = ""
    var headers: [(String, String)] = []
    /// The rows of an answer: ids, entitlements, apps, as the route lists them (sorted).
    var rows: @Sendable (_ body: [UInt8]) -> [String]
    var expected: [KeyKind: Expected]

    /// 401 for no key and an unknown key, 403 for the kinds not listed.
    func expectation(_ kind: KeyKind) -> Expected {
        if kind == .none || kind == .unknown { return .status(401) }
        return expected[kind] ?? .status(403)
    }
}

private func json(_ bytes: [UInt8]) -> JSON { (try? JSON.parse(bytes)) ?? .null }
private func strings(_ values: [JSON]?) -> [String] { (values ?? []).compactMap(\.stringValue).sorted() }

/// The active entitlements, then the subscriptions' products, of an entitlements answer.
private func customerInfoRows(_ body: [UInt8]) -> [String] {
    let document = json(body)
    let listed = strings(document["entitlements"]?.arrayValue?.map { $0["identifier"] ?? .null })
    let subscriptions = strings(document["customerInfo"]?["subscriptions"]?.arrayValue?.map { $0["productId"] ?? .null })
    return listed + subscriptions
}

/// Every route × every kind of key: the status, and which rows come back.
let scopeTable: [ScopeCase] = [
    ScopeCase(
        route: BackendRoute(.get, "/config-api/read/v1-application-id/:applicationId/entitlements/:responseVersion"), method: "GET",
        path: "/config-api/read/v1-application-id/1/entitlements/1",
        rows: { strings(json($0)["products"]?.arrayValue?.map { $0["productId"] ?? .null }) },
        expected: [
            .secret: .rows(200, ["$grandfathered:0", "com.example.pro.monthly"]), .rotatedSecret: .rows(200, ["$grandfathered:0", "com.example.pro.monthly"]),
        ]),
    ScopeCase(
        route: BackendRoute(.get, "/subscriptions-api/internal/v1/subscriptions/:store/:originalTransactionId"), method: "GET",
        path: "/subscriptions-api/internal/v1/subscriptions/apple/1000", rows: { strings([json($0)["originalTransactionId"] ?? .null]) },
        expected: [.secret: .rows(200, ["1000"]), .rotatedSecret: .rows(200, ["1000"])]),
    ScopeCase(
        route: BackendRoute(.get, "/subscriptions-api/internal/v1/subscriptions"), method: "GET",
        path: "/subscriptions-api/internal/v1/subscriptions?store=apple&applicationId=1",
        rows: { strings(json($0)["subscriptions"]?.arrayValue?.map { $0["originalTransactionId"] ?? .null }) },
        expected: [.secret: .rows(200, ["1000"]), .rotatedSecret: .rows(200, ["1000"]), .readThis: .rows(200, ["1000"])]),
    ScopeCase(
        route: BackendRoute(.get, "/subscriptions-api/internal/v1/events"), method: "GET", path: "/subscriptions-api/internal/v1/events?app=ios",
        rows: eventIds,
        expected: [.secret: .rows(200, ["e-ios"]), .rotatedSecret: .rows(200, ["e-ios"]), .readThis: .rows(200, ["e-ios"])]),
    // Without a filter a read key gets its own apps' rows, never another's.
    ScopeCase(
        route: BackendRoute(.get, "/subscriptions-api/internal/v1/events"), method: "GET", path: "/subscriptions-api/internal/v1/events",
        rows: eventIds,
        expected: [
            .secret: .rows(200, ["e-android", "e-ios"]), .rotatedSecret: .rows(200, ["e-android", "e-ios"]), .readThis: .rows(200, ["e-ios"]),
            .readOther: .rows(200, ["e-android"]),
        ]),
    ScopeCase(
        route: BackendRoute(.get, "/subscriptions-api/internal/v1/events"), method: "GET", path: "/subscriptions-api/internal/v1/events",
        headers: [("Accept", "application/x-ndjson")],
        rows: { body in
            String(decoding: body, as: UTF8.self).split(separator: "\n").compactMap { json(Array($0.utf8))["data"]?["id"]?.stringValue }.sorted()
        },
        expected: [
            .secret: .rows(200, ["e-android", "e-ios"]), .rotatedSecret: .rows(200, ["e-android", "e-ios"]), .readThis: .rows(200, ["e-ios"]),
            .readOther: .rows(200, ["e-android"]),
        ]),
    ScopeCase(
        route: BackendRoute(.get, "/subscriptions-api/internal/v1/revenue"), method: "GET",
        path: "/subscriptions-api/internal/v1/revenue?app=ios&groupBy=app", rows: revenueApps,
        expected: [.secret: .rows(200, ["ios"]), .rotatedSecret: .rows(200, ["ios"]), .readThis: .rows(200, ["ios"])]),
    ScopeCase(
        route: BackendRoute(.get, "/subscriptions-api/internal/v1/revenue"), method: "GET", path: "/subscriptions-api/internal/v1/revenue?groupBy=app",
        rows: revenueApps,
        expected: [
            .secret: .rows(200, ["android", "ios"]), .rotatedSecret: .rows(200, ["android", "ios"]), .readThis: .rows(200, ["ios"]),
            .readOther: .rows(200, ["android"]),
        ]),
    // The overview's metrics: the gross of the rows a key reads (ios's event is 9.99, android's 4.99, on 2026-01-01).
    ScopeCase(
        route: BackendRoute(.get, "/subscriptions-api/internal/v1/metrics"), method: "GET",
        path: "/subscriptions-api/internal/v1/metrics?app=ios&since=2026-01-01&until=2026-01-02", rows: metricsGross,
        expected: [.secret: .rows(200, ["9.99"]), .rotatedSecret: .rows(200, ["9.99"]), .readThis: .rows(200, ["9.99"])]),
    ScopeCase(
        route: BackendRoute(.get, "/subscriptions-api/internal/v1/metrics"), method: "GET",
        path: "/subscriptions-api/internal/v1/metrics?since=2026-01-01&until=2026-01-02", rows: metricsGross,
        expected: [
            .secret: .rows(200, ["14.98"]), .rotatedSecret: .rows(200, ["14.98"]), .readThis: .rows(200, ["9.99"]), .readOther: .rows(200, ["4.99"]),
        ]),
    // A customer of one app, with their subscriptions' events: the secret key and that app's read key only.
    ScopeCase(
        route: BackendRoute(.get, "/subscriptions-api/internal/v1/customers/:appUserId"), method: "GET",
        path: "/subscriptions-api/internal/v1/customers/shared-user?applicationId=1", rows: customerRows,
        expected: [.secret: .rows(200, ["1000", "e-ios"]), .rotatedSecret: .rows(200, ["1000", "e-ios"]), .readThis: .rows(200, ["1000", "e-ios"])]),
    // The delivery log: each key reads its apps' attempts.
    ScopeCase(
        route: BackendRoute(.get, "/subscriptions-api/internal/v1/deliveries"), method: "GET", path: "/subscriptions-api/internal/v1/deliveries",
        rows: deliveryApps,
        expected: [
            .secret: .rows(200, ["android", "ios"]), .rotatedSecret: .rows(200, ["android", "ios"]), .readThis: .rows(200, ["ios"]),
            .readOther: .rows(200, ["android"]),
        ]),
    // One user who bought in two apps: each app's public key sees what was bought in it.
    ScopeCase(
        route: BackendRoute(.get, "/subscriptions-api/public/v1/users/:appUserId/entitlements"), method: "GET",
        path: "/subscriptions-api/public/v1/users/shared-user/entitlements",
        rows: customerInfoRows,
        expected: [
            .secret: .rows(200, ["premium", "pro", "com.example.pro.monthly", "premium_sub"]),
            .rotatedSecret: .rows(200, ["premium", "pro", "com.example.pro.monthly", "premium_sub"]),
            .publicThis: .rows(200, ["pro", "com.example.pro.monthly"]), .publicOther: .rows(200, ["premium", "premium_sub"]),
        ]),
    // Which user an id stands for: the worker's question, with the secret key.
    ScopeCase(
        route: BackendRoute(.get, "/subscriptions-api/internal/v1/users/:appUserId"), method: "GET",
        path: "/subscriptions-api/internal/v1/users/shared-user?applicationId=1", rows: { strings([json($0)["appUserId"] ?? .null]) },
        expected: [.secret: .rows(200, ["shared-user"]), .rotatedSecret: .rows(200, ["shared-user"])]),
    // A user's attributes, in the app the key acts for.
    ScopeCase(
        route: BackendRoute(.put, "/subscriptions-api/public/v1/users/:appUserId/attributes"), method: "PUT",
        path: "/subscriptions-api/public/v1/users/shared-user/attributes?applicationId=1", body: #"{"attributes": {"plan": "team"}}"#,
        rows: { body in (json(body)["attributes"]?.objectValue ?? [:]).keys.sorted() },
        expected: [.secret: .rows(200, ["plan"]), .rotatedSecret: .rows(200, ["plan"]), .publicThis: .rows(200, ["plan"])]),
    // Linking ids to a user answers with that user's customer info in the app the key acts for.
    ScopeCase(
        route: BackendRoute(.post, "/subscriptions-api/public/v1/users/:appUserId/aliases"), method: "POST",
        path: "/subscriptions-api/public/v1/users/shared-user/aliases?applicationId=1", body: #"{"aliasIds": ["$SuperwallAlias:scope"]}"#,
        rows: customerInfoRows,
        expected: [
            .secret: .rows(200, ["pro", "com.example.pro.monthly"]), .rotatedSecret: .rows(200, ["pro", "com.example.pro.monthly"]),
            .publicThis: .rows(200, ["pro", "com.example.pro.monthly"]),
        ]),
    ScopeCase(
        route: BackendRoute(.get, "/subscriptions-api/public/v1/products"), method: "GET", path: "/subscriptions-api/public/v1/products",
        rows: productIds,
        expected: [
            .secret: .rows(200, ["com.example.pro.monthly", "premium_sub"]), .rotatedSecret: .rows(200, ["com.example.pro.monthly", "premium_sub"]),
            .publicThis: .rows(200, ["com.example.pro.monthly"]), .publicOther: .rows(200, ["premium_sub"]),
        ]),
    ScopeCase(
        route: BackendRoute(.get, "/subscriptions-api/public/v1/products"), method: "GET", path: "/subscriptions-api/public/v1/products?applicationId=1",
        rows: productIds,
        expected: [
            .secret: .rows(200, ["com.example.pro.monthly"]), .rotatedSecret: .rows(200, ["com.example.pro.monthly"]),
            .publicThis: .rows(200, ["com.example.pro.monthly"]),
        ]),
    // The verifier is reached (and refuses the test's JWS) only for keys that may use this app's rules.
    ScopeCase(
        route: BackendRoute(.post, "/subscriptions-api/public/v1/users/:appUserId/app-transaction"), method: "POST",
        path: "/subscriptions-api/public/v1/users/shared-user/app-transaction?applicationId=1", body: #"{"signedAppTransaction": "e30.e30.sig"}"#,
        rows: { strings([json($0)["error"] ?? .null]) },
        expected: [
            .secret: .rows(400, ["invalid_app_transaction"]), .rotatedSecret: .rows(400, ["invalid_app_transaction"]),
            .publicThis: .rows(400, ["invalid_app_transaction"]),
        ]),
    // A purchase handed over reaches the verifier (which refuses the test's JWS) only for keys that act for this app.
    ScopeCase(
        route: BackendRoute(.post, "/subscriptions-api/public/v1/users/:appUserId/purchases"), method: "POST",
        path: "/subscriptions-api/public/v1/users/shared-user/purchases?applicationId=1", body: #"{"store": "APP_STORE", "signedTransaction": "e30.e30.sig"}"#,
        rows: { strings([json($0)["error"] ?? .null]) },
        expected: [
            .secret: .rows(400, ["invalid_purchase"]), .rotatedSecret: .rows(400, ["invalid_purchase"]), .publicThis: .rows(400, ["invalid_purchase"]),
        ]),
    // Promotional grants are the developer's: the secret key alone gets past the scope (to a refusal of the
    // body, and to a grant this user does not have); an app's public key never grants.
    ScopeCase(
        route: BackendRoute(.post, "/subscriptions-api/internal/v1/users/:appUserId/grants"), method: "POST",
        path: "/subscriptions-api/internal/v1/users/shared-user/grants", body: #"{"app": "ios", "entitlement": "pro"}"#,
        rows: { strings([json($0)["error"] ?? .null]) },
        expected: [.secret: .rows(400, ["bad_request"]), .rotatedSecret: .rows(400, ["bad_request"])]),
    ScopeCase(
        route: BackendRoute(.delete, "/subscriptions-api/internal/v1/users/:appUserId/grants/:grantId"), method: "DELETE",
        path: "/subscriptions-api/internal/v1/users/shared-user/grants/grant_0", rows: { strings([json($0)["error"] ?? .null]) },
        expected: [.secret: .rows(404, ["not_found"]), .rotatedSecret: .rows(404, ["not_found"])]),
    // Web checkout and redemption: the key's app's (this one has no web checkout configured: 404 past the
    // scope); another app's public key naming this application is 403.
    ScopeCase(
        route: BackendRoute(.post, "/subscriptions-api/public/v1/checkout/session"), method: "POST",
        path: "/subscriptions-api/public/v1/checkout/session?applicationId=1", body: #"{"productIdentifier": "price_x"}"#,
        rows: { strings([json($0)["error"] ?? .null]) },
        expected: [.secret: .rows(404, ["not_found"]), .rotatedSecret: .rows(404, ["not_found"]), .publicThis: .rows(404, ["not_found"])]),
    ScopeCase(
        route: BackendRoute(.post, "/subscriptions-api/public/v1/checkout/status"), method: "POST",
        path: "/subscriptions-api/public/v1/checkout/status?applicationId=1", body: #"{"checkoutId": "v1:k:x"}"#,
        rows: { strings([json($0)["error"] ?? .null]) },
        expected: [.secret: .rows(404, ["not_found"]), .rotatedSecret: .rows(404, ["not_found"]), .publicThis: .rows(404, ["not_found"])]),
    ScopeCase(
        route: BackendRoute(.post, "/subscriptions-api/public/v1/checkout/session/confirm"), method: "POST",
        path: "/subscriptions-api/public/v1/checkout/session/confirm?applicationId=1", body: #"{"checkoutContextId": "v1:k:x"}"#,
        rows: { strings([json($0)["error"] ?? .null]) },
        expected: [.secret: .rows(404, ["not_found"]), .rotatedSecret: .rows(404, ["not_found"]), .publicThis: .rows(404, ["not_found"])]),
    ScopeCase(
        route: BackendRoute(.post, "/subscriptions-api/public/v1/checkout/session/complete"), method: "POST",
        path: "/subscriptions-api/public/v1/checkout/session/complete?applicationId=1", body: #"{"checkoutContextId": "v1:k:x"}"#,
        rows: { strings([json($0)["error"] ?? .null]) },
        expected: [.secret: .rows(404, ["not_found"]), .rotatedSecret: .rows(404, ["not_found"]), .publicThis: .rows(404, ["not_found"])]),
    ScopeCase(
        route: BackendRoute(.post, "/subscriptions-api/public/v1/checkout/session/poll-redemption-result"), method: "POST",
        path: "/subscriptions-api/public/v1/checkout/session/poll-redemption-result?applicationId=1", body: #"{"checkoutContextId": "v1:k:x"}"#,
        rows: { strings([json($0)["error"] ?? .null]) },
        expected: [.secret: .rows(404, ["not_found"]), .rotatedSecret: .rows(404, ["not_found"]), .publicThis: .rows(404, ["not_found"])]),
    ScopeCase(
        route: BackendRoute(.post, "/subscriptions-api/public/v1/redeem"), method: "POST",
        path: "/subscriptions-api/public/v1/redeem?applicationId=1", body: #"{"deviceId": "d", "codes": [{"code": "x"}]}"#,
        rows: { strings([json($0)["error"] ?? .null]) },
        expected: [.secret: .rows(404, ["not_found"]), .rotatedSecret: .rows(404, ["not_found"]), .publicThis: .rows(404, ["not_found"])]),
    // Endpoint health: each key sees its apps' endpoints; the host only, never the URL's path or query.
    ScopeCase(
        route: BackendRoute(.get, "/subscriptions-api/internal/v1/endpoints"), method: "GET", path: "/subscriptions-api/internal/v1/endpoints",
        rows: { body in
            let endpoints = json(body)["endpoints"]?.arrayValue ?? []
            return (strings(endpoints.map { $0["id"] ?? .null }) + strings(endpoints.map { $0["host"] ?? .null })).sorted()
        },
        expected: [
            .secret: .rows(200, ["hooks-android", "hooks-ios", "hooks.example.com", "hooks.example.com"]),
            .rotatedSecret: .rows(200, ["hooks-android", "hooks-ios", "hooks.example.com", "hooks.example.com"]),
            .readThis: .rows(200, ["hooks-ios", "hooks.example.com"]), .readOther: .rows(200, ["hooks-android", "hooks.example.com"]),
        ]),
    // Acting on deliveries: the secret key only; a read key sees the log but cannot resend, recover or enable.
    ScopeCase(
        route: BackendRoute(.post, "/subscriptions-api/internal/v1/deliveries/:deliveryId/resend"), method: "POST",
        path: "/subscriptions-api/internal/v1/deliveries/hooks-ios:e-ios:-:1:succeeded/resend", rows: { strings([json($0)["eventId"] ?? .null]) },
        expected: [.secret: .rows(202, ["e-ios"]), .rotatedSecret: .rows(202, ["e-ios"])]),
    ScopeCase(
        route: BackendRoute(.post, "/subscriptions-api/internal/v1/endpoints/:endpointId/recover"), method: "POST",
        path: "/subscriptions-api/internal/v1/endpoints/hooks-ios/recover?since=2020-01-01", rows: { strings([json($0)["endpoint"] ?? .null]) },
        expected: [.secret: .rows(202, ["hooks-ios"]), .rotatedSecret: .rows(202, ["hooks-ios"])]),
    ScopeCase(
        route: BackendRoute(.post, "/subscriptions-api/internal/v1/endpoints/:endpointId/enable"), method: "POST",
        path: "/subscriptions-api/internal/v1/endpoints/hooks-ios/enable", rows: { strings([json($0)["endpoint"] ?? .null]) },
        expected: [.secret: .rows(202, ["hooks-ios"]), .rotatedSecret: .rows(202, ["hooks-ios"])]),
    // The attack of issue 25: a made-up purchase for mallory until 2100. Each kind writes its own id, so
    // the test can tell afterwards which writes happened; last, so the reads above see none of them.
    ScopeCase(
        route: BackendRoute(.put, "/subscriptions-api/internal/v1/subscriptions/:store/:originalTransactionId"), method: "PUT",
        path: "/subscriptions-api/internal/v1/subscriptions/apple/999-KIND", body: malloryState("999-KIND"), headers: [("If-Match", "0")],
        rows: { strings([json($0)["originalTransactionId"] ?? .null]) },
        expected: [.secret: .rows(200, ["999-secret"]), .rotatedSecret: .rows(200, ["999-rotatedSecret"])]),
]

let eventIds: @Sendable ([UInt8]) -> [String] = { strings(json($0)["events"]?.arrayValue?.map { $0["data"]?["id"] ?? .null }) }
private let revenueApps: @Sendable ([UInt8]) -> [String] = { strings(json($0)["rows"]?.arrayValue?.map { $0["app"] ?? .null }) }
private let metricsGross: @Sendable ([UInt8]) -> [String] = { body in
    (json(body)["days"]?.arrayValue ?? []).compactMap { $0["grossUsd"]?.doubleValue.map { String(format: "%.2f", $0) } }
}
private let customerRows: @Sendable ([UInt8]) -> [String] = { body in
    let document = json(body)
    return (strings(document["subscriptions"]?.arrayValue?.map { $0["originalTransactionId"] ?? .null })
        + strings(document["events"]?.arrayValue?.map { $0["data"]?["id"] ?? .null })).sorted()
}
private let deliveryApps: @Sendable ([UInt8]) -> [String] = { strings(json($0)["deliveries"]?.arrayValue?.map { $0["app"] ?? .null }).sorted() }
private let productIds: @Sendable ([UInt8]) -> [String] = { strings(json($0)["data"]?.arrayValue?.map { $0["identifier"] ?? .null }) }

/// A lifetime purchase until 2100 for `mallory`, as the attacker sent it.
private func malloryState(_ id: String) -> String {
    String(
        decoding: SubscriptionState(
            store: .apple, originalTransactionId: id, applicationId: 1, originalAppUserId: "mallory", appUserIds: ["mallory"],
            productId: "com.example.pro.monthly", status: .active, expiresAt: 4_102_444_800_000, environment: "PRODUCTION", sourceTimestamp: 5
        ).json.serialized(), as: UTF8.self)
}

@Suite struct KeyScopeTests {
    @Test func everyRouteAnswersEveryKindOfKeyWithinItsScope() async throws {
        let backend = try await ScopedBackend()
        try await backend.storeData()
        var failures: [String] = []
        for scopeCase in scopeTable {
            for kind in KeyKind.allCases {
                let path = scopeCase.path.replacingOccurrences(of: "KIND", with: kind.rawValue)
                let body = Array(scopeCase.body.replacingOccurrences(of: "KIND", with: kind.rawValue).utf8)
                let response = try await backend.send(scopeCase.method, path, kind, body: body, headers: scopeCase.headers)
                let got: ScopeCase.Expected
                switch scopeCase.expectation(kind) {
                case .rows(_, let expected):
                    got = .rows(response.status, scopeCase.rows(response.body))
                    // The table lists rows in the order the extractor sorts groups; compare as sets.
                    if case .rows(let status, let rows) = got, case .rows(let wantedStatus, _) = scopeCase.expectation(kind),
                        status == wantedStatus, Set(rows) == Set(expected)
                    {
                        continue
                    }
                case .status(let status):
                    got = .status(response.status)
                    if response.status == status {
                        let error = json(response.body)["error"]?.stringValue
                        if error == (status == 401 ? "unauthorized" : "forbidden") { continue }
                    }
                }
                failures.append("\(scopeCase.method) \(path) with \(kind): expected \(scopeCase.expectation(kind)), got \(got) \(String(decoding: response.body.prefix(300), as: UTF8.self))")
            }
        }
        #expect(failures.isEmpty, "\(failures.joined(separator: "\n"))")
        // Only the secret keys' writes happened: mallory has nothing.
        #expect(try await backend.database.subscription(store: .apple, originalTransactionId: "999-secret") != nil)
        #expect(try await backend.database.subscription(store: .apple, originalTransactionId: "999-rotatedSecret") != nil)
        for kind in KeyKind.allCases where kind != .secret && kind != .rotatedSecret {
            #expect(try await backend.database.subscription(store: .apple, originalTransactionId: "999-\(kind.rawValue)") == nil, "\(kind) wrote")
        }
        // The app-transaction and purchases routes reached the verifier for this app only (three keys each),
        // never with another app's rules.
        #expect(backend.verified.value == Array(repeating: "ios", count: 6))
        // Only the secret keys acted: a resend each, and an enable each to all three partitions (the recover
        // found nothing failed).
        let appended = backend.appended.value
        #expect(appended.filter { $0.headers.first(named: "relay-replayed-from") != nil }.count == 2)
        let controls = appended.filter { $0.headers.first(named: DeliveryControl.header)?.stringValue == "enable" }
        #expect(controls.compactMap(\.partition).sorted() == [0, 0, 1, 1, 2, 2])
        #expect(appended.count == 8)
        await backend.stop()
    }

    /// Adding a route without deciding its scope fails here: every route the router holds is in the one
    /// scope table, and the test table above exercises each of them.
    @Test func everyRegisteredRouteHasAScopeAndARowInTheTable() async throws {
        let backend = try await ScopedBackend()
        // The console's pages check their own session (ConsoleTests), not a key.
        let registered = Set(
            backend.backend.router().routes.map { BackendRoute($0.method, normalized($0.path.description)) }.filter { !LocalBackend.isConsole($0.path) })
        #expect(registered == Set(LocalBackend.routeScopes.keys), "registered \(registered.sorted { $0.description < $1.description })")
        #expect(Set(scopeTable.map(\.route)) == registered)
        // The table's expectations agree with the declared scopes.
        for scopeCase in scopeTable {
            let scope = try #require(LocalBackend.routeScopes[scopeCase.route])
            let admitted = Set(KeyKind.allCases.filter { if case .status = scopeCase.expectation($0) { return false } else { return true } })
            switch scope {
            case .secret: #expect(admitted == [.secret, .rotatedSecret], "\(scopeCase.path)")
            case .read: #expect(admitted.isSubset(of: [.secret, .rotatedSecret, .readThis, .readOther]) && admitted.contains(.readThis), "\(scopeCase.path)")
            case .public: #expect(admitted.isSubset(of: [.secret, .rotatedSecret, .publicThis, .publicOther]) && admitted.contains(.publicThis), "\(scopeCase.path)")
            }
        }
        await backend.stop()
    }

    /// Refusals for another app's rows are counted like refusals of a route; a read key for two apps reads
    /// both, and no third; a device id cannot pull another app's purchases into a public key's answer;
    /// the scheme's case does not matter.
    @Test func rowRefusalsAreCountedAndReadKeysOverSeveralAppsReadThoseOnly() async throws {
        let backend = try await ScopedBackend()
        try await backend.storeData()
        _ = try await backend.backend.events.record([.init(app: "web", body: testEvent("e-web", store: .stripe, user: "shared-user", subject: "sub_web", product: "price_web", applicationId: 3))])
        for path in [
            "/subscriptions-api/internal/v1/events?app=android", "/subscriptions-api/internal/v1/revenue?app=android",
            "/subscriptions-api/internal/v1/subscriptions?store=google&applicationId=2",
        ] {
            #expect(try await backend.send("GET", path, .readThis).status == 403, "\(path)")
        }
        #expect(try await backend.send("GET", "/subscriptions-api/public/v1/products?applicationId=2", .publicThis).status == 403)
        #expect(backend.metrics.value(of: "relay_backend_access_refused_total", ["403"]) == 4)

        let both = try await HTTPClient().send("GET", backend.url + "/subscriptions-api/internal/v1/events", headers: [("Authorization", "Bearer rk_both_0007")])
        #expect(eventIds(both.body) == ["e-android", "e-ios"])
        let all = try await backend.send("GET", "/subscriptions-api/internal/v1/events", .secret)
        #expect(eventIds(all.body) == ["e-android", "e-ios", "e-web"])
        let web = try await HTTPClient().send("GET", backend.url + "/subscriptions-api/internal/v1/events?app=web", headers: [("Authorization", "Bearer rk_both_0007")])
        #expect(web.status == 403)

        // The Android purchase belongs to a device id too: the iOS key still sees iOS's purchases only.
        var device = try #require(try await backend.database.subscription(store: .google, originalTransactionId: "token-2000"))
        device.appUserIds.append("$SuperwallDevice:D1")
        _ = try await backend.database.write(device, ifMatch: device.version)
        let answer = try await backend.send("GET", "/subscriptions-api/public/v1/users/nobody/entitlements?deviceId=%24SuperwallDevice%3AD1", .publicThis)
        #expect(json(answer.body)["entitlements"] == [])
        let other = try await backend.send("GET", "/subscriptions-api/public/v1/users/nobody/entitlements?deviceId=%24SuperwallDevice%3AD1", .publicOther)
        #expect(json(other.body)["entitlements"]?.arrayValue?.count == 1)

        let lower = try await HTTPClient().send("GET", backend.url + "/subscriptions-api/public/v1/products", headers: [("Authorization", "bearer pk_ios_0005")])
        #expect(lower.status == 200)
        await backend.stop()
    }

    @Test func anIPv6ClientIsLimitedByItsSlash64() {
        #expect(BackendAuthentication.bucket("203.0.113.7") == "203.0.113.7")
        #expect(BackendAuthentication.bucket("2001:db8:1:2:aaaa::1") == "2001:db8:1:2::/64")
        #expect(BackendAuthentication.bucket("2001:0db8:0001:0002:ffff:ffff:ffff:ffff") == "2001:db8:1:2::/64")
        #expect(BackendAuthentication.bucket("[2001:db8::1%eth0]") == "2001:db8::/64")
        #expect(BackendAuthentication.bucket("::1") == "::/64")
    }

    /// Hummingbird prints a parameter as `{name}`; the table writes it as registered, `:name`.
    private func normalized(_ path: String) -> String {
        let text = path.replacingOccurrences(of: "{", with: ":").replacingOccurrences(of: "}", with: "")
        return text.hasPrefix("/") ? text : "/" + text
    }

    @Test func aPathThatDoesNotExistNeedsAKnownKeyToBeTold() async throws {
        let backend = try await ScopedBackend()
        #expect(try await backend.send("GET", "/subscriptions-api/internal/v1/nothing-here", .none).status == 401)
        #expect(try await backend.send("GET", "/subscriptions-api/internal/v1/nothing-here", .unknown).status == 401)
        #expect(try await backend.send("GET", "/subscriptions-api/internal/v1/nothing-here", .secret).status == 404)
        // The scheme is required; a key alone is not a bearer token.
        let bare = try await HTTPClient().send("GET", backend.url + "/subscriptions-api/public/v1/products", headers: [("Authorization", "pk_ios_0005")])
        #expect(bare.status == 401)
        // Answers never echo the key.
        let refused = try await backend.send("GET", "/subscriptions-api/internal/v1/events", .publicThis)
        #expect(refused.status == 403)
        #expect(!String(decoding: refused.body, as: UTF8.self).contains("pk_ios_0005"))
        #expect(backend.metrics.value(of: "relay_backend_access_refused_total", ["401"]) == 3)
        #expect(backend.metrics.value(of: "relay_backend_access_refused_total", ["403"]) == 1)
        await backend.stop()
    }

    /// A public key copied out of the app cannot exhaust the backend: one client gets its burst, then
    /// 429 with Retry-After; guessing keys counts against the same bucket; the secret key is never limited.
    @Test func publicRoutesAreRateLimitedPerClient() async throws {
        let backend = try await ScopedBackend(rate: 1)
        let products = "/subscriptions-api/public/v1/products"
        for _ in 0..<2 { #expect(try await backend.send("GET", products, .publicThis).status == 200) }
        #expect(try await backend.send("GET", products, .unknown).status == 401)
        let limited = try await backend.send("GET", products, .publicThis)
        #expect(limited.status == 429)
        #expect(limited.header("Retry-After") == "1")
        #expect(json(limited.body)["error"] == "rate_limited")
        // Guessing keys is limited too, before any route runs.
        #expect(try await backend.send("GET", products, .unknown).status == 429)
        // The relay's own roles and BI tools are not: they hold server keys.
        for _ in 0..<10 {
            #expect(try await backend.send("GET", products, .secret).status == 200)
            #expect(try await backend.send("GET", "/subscriptions-api/internal/v1/events", .readThis).status == 200)
        }
        // A second later one token has come back.
        backend.limiterClock.withLock { $0 += 1_000_000_000 }
        #expect(try await backend.send("GET", products, .publicThis).status == 200)
        #expect(try await backend.send("GET", products, .publicThis).status == 429)
        #expect(backend.metrics.value(of: "relay_backend_rate_limited_total", ["public"]) == 2)
        #expect(backend.metrics.value(of: "relay_backend_rate_limited_total", ["none"]) == 1)
        await backend.stop()
    }

    /// Behind the operator's proxy, the client is the last address the proxy added, not the proxy.
    @Test func theClientAddressComesFromTheConfiguredProxyHeader() async throws {
        let backend = try await ScopedBackend(rate: 1, clientAddressHeader: "X-Forwarded-For")
        let products = "/subscriptions-api/public/v1/products"
        for _ in 0..<3 { #expect(try await backend.send("GET", products, .publicThis, headers: [("X-Forwarded-For", "203.0.113.7")]).status == 200) }
        #expect(try await backend.send("GET", products, .publicThis, headers: [("X-Forwarded-For", "203.0.113.7")]).status == 429)
        // Another client behind the same proxy has its own bucket; a spoofed first entry changes nothing.
        #expect(try await backend.send("GET", products, .publicThis, headers: [("X-Forwarded-For", "198.51.100.9")]).status == 200)
        #expect(try await backend.send("GET", products, .publicThis, headers: [("X-Forwarded-For", "1.2.3.4, 203.0.113.7")]).status == 429)
        await backend.stop()
    }

    /// With `trustedProxies`, the header counts only from them: a client that writes its own
    /// `X-Forwarded-For` straight to the backend buys no new bucket; through a trusted proxy, each client
    /// the proxy names has its own, and entries a client wrote in front are ignored.
    @Test func theClientAddressHeaderIsBelievedOnlyFromTrustedProxies() async throws {
        let products = "/subscriptions-api/public/v1/products"
        let untrusted = try await ScopedBackend(rate: 1, trustedProxies: #"["10.0.0.0/8"]"#)
        for address in ["203.0.113.1", "203.0.113.2", "203.0.113.3"] {
            #expect(try await untrusted.send("GET", products, .publicThis, headers: [("X-Forwarded-For", address)]).status == 200)
        }
        #expect(
            try await untrusted.send("GET", products, .publicThis, headers: [("X-Forwarded-For", "203.0.113.4")]).status == 429,
            "the peer (127.0.0.1) is not a trusted proxy: one client, whatever it claims")
        await untrusted.stop()

        let proxied = try await ScopedBackend(rate: 1, trustedProxies: #"["127.0.0.1"]"#)
        for _ in 0..<3 { #expect(try await proxied.send("GET", products, .publicThis, headers: [("X-Forwarded-For", "203.0.113.7")]).status == 200) }
        #expect(try await proxied.send("GET", products, .publicThis, headers: [("X-Forwarded-For", "203.0.113.7")]).status == 429)
        #expect(try await proxied.send("GET", products, .publicThis, headers: [("X-Forwarded-For", "198.51.100.9")]).status == 200)
        #expect(try await proxied.send("GET", products, .publicThis, headers: [("X-Forwarded-For", "1.2.3.4, 203.0.113.7")]).status == 429)
        await proxied.stop()
    }
}
