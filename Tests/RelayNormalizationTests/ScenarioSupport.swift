import CoreMetrics
import Foundation
import Logging
import RelayBackend
import RelayConfig
import RelayCore
import RelayGooglePlay
import RelayLocalBackend
import RelayStripe
@testable import RelayNormalization
import RelayTestSupport
import RelayVerification
import ServiceLifecycle
import Testing

/// A scenario file (`Scenarios/<store>/<name>.json`): store notifications in, the expected events out.
///
/// ```json
/// { "description": "...", "store": "apple", "user": "user-1",
///   "stripeApi": false,                                    // default true: the app configures stripe.api
///   "templates": { "tx": { ...shared fields... } },
///   "steps": [
///     { "notification": { "$base": "tx", ...overrides },   // "$base" merges a template under the object
///       "play": { "subscription": {...},                   // Google: the Play Developer API's answers
///                 "tokens": { "<token>": {...} } },        //   (subscriptionsv2 of other purchase tokens)
///       "stripe": { "charge": {...} },                     // Stripe: the API's refunded charge (else 404)
///       "messageId": "m-1",                                // Google: the Pub/Sub message id (dedup key)
///       "receivedAt": 1893456001000,                       // default: the notification's own time + 1 s
///       "expect": [ { "type": "initial_purchase", "data": { ...fields that must match... } } ],
///       "state": { ...fields of the stored subscription state... },
///       "entitlements": ["pro"],                           // the user's active entitlements afterwards
///       "rejected": "purchase_not_found",                  // instead of events: the reject reason
///       "resend": 0, "sameEventsAs": 0 }                   // send step 0 again; expect its exact events
///   ] }
/// ```
///
/// Apple notifications are written decoded: `data.signedTransactionInfo` and `data.signedRenewalInfo`
/// are objects, signed with the fixture PKI by the runner. Google steps give the DeveloperNotification.
/// Stripe and Paddle steps give the event as the store sends it; the runner signs it.
struct Scenario: CustomTestStringConvertible, Sendable {
    var file: String
    var document: JSON

    var testDescription: String { file }

    static let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Scenarios")

    /// The scenarios that also run end to end over HTTP: one per store, and the Play API's failures.
    static let endToEnd: Set<String> = [
        "apple/upgrade-without-prior-state.json", "google/upgrade-replaced-purchase-from-play.json",
        "google/retry-after-apply-while-play-refuses.json", "stripe/refund-without-stripe-api.json", "stripe/duplicates-resend.json",
        "paddle/subscription-charge.json",
    ]

    static var all: [Scenario] {
        let files = (FileManager.default.enumerator(atPath: directory.path)?.compactMap { $0 as? String } ?? [])
            .filter { $0.hasSuffix(".json") }.sorted()
        return files.map { file in
            let bytes = (try? Data(contentsOf: directory.appendingPathComponent(file))).map(Array.init) ?? []
            return Scenario(file: file, document: (try? JSON.parse(bytes)) ?? ["invalid": .string(file)])
        }
    }
}

/// Resolves `"$base": "<template>"` members recursively: the template's members under the object's own.
func resolveTemplates(_ value: JSON, _ templates: [String: JSON]) -> JSON {
    switch value {
    case .object(var members):
        if let base = members.removeValue(forKey: "$base")?.stringValue, let template = templates[base] {
            let resolvedTemplate = resolveTemplates(template, templates)
            var merged = resolvedTemplate.objectValue ?? [:]
            for (key, member) in members {
                if case .object = member, case .object = merged[key] ?? .null {
                    merged[key] = deepMerge(merged[key]!, resolveTemplates(member, templates))
                } else {
                    merged[key] = resolveTemplates(member, templates)
                }
            }
            return .object(merged)
        }
        return .object(members.mapValues { resolveTemplates($0, templates) })
    case .array(let elements):
        return .array(elements.map { resolveTemplates($0, templates) })
    default:
        return value
    }
}

/// `overlay`'s members over `base`'s, recursively for objects; `null` removes a member.
func deepMerge(_ base: JSON, _ overlay: JSON) -> JSON {
    guard case .object(var merged) = base, case .object(let members) = overlay else { return overlay }
    for (key, member) in members {
        if member.isNull {
            merged[key] = nil
        } else if case .object = member, let existing = merged[key], case .object = existing {
            merged[key] = deepMerge(existing, member)
        } else {
            merged[key] = member
        }
    }
    return .object(merged)
}

/// Where `actual` differs from the pattern `expected`: objects match by the expected members only
/// (a missing actual member is null), arrays element by element with equal length, numbers by exact value.
func mismatches(_ expected: JSON, _ actual: JSON?, path: String = "$") -> [String] {
    let actual = actual ?? .null
    switch expected {
    case .object(let members):
        guard case .object = actual else { return ["\(path): expected an object, got \(actual.text)"] }
        return members.keys.sorted().flatMap { mismatches(members[$0]!, actual[$0], path: "\(path).\($0)") }
    case .array(let elements):
        guard let list = actual.arrayValue, list.count == elements.count else {
            return ["\(path): expected \(expected.text), got \(actual.text)"]
        }
        return zip(elements, list).enumerated().flatMap { mismatches($0.element.0, $0.element.1, path: "\(path)[\($0.offset)]") }
    case .integer, .number:
        // Exactly: 3.49 must not arrive as 3.4899999999999998 (integers and doubles of one value are equal).
        guard let want = expected.doubleValue, let got = actual.doubleValue, want == got else {
            return ["\(path): expected \(expected.text), got \(actual.text)"]
        }
        return []
    default:
        return expected == actual ? [] : ["\(path): expected \(expected.text), got \(actual.text)"]
    }
}

/// The real pipeline pieces a scenario runs through: the verifier, the subscription updater, and the
/// local backend's rules over SQLite.
///
/// - `.inProcess` (most scenarios): no HTTP. The updater writes the backend's database directly
///   (`LocalStateStore`, as a relay with the backend role does), and the store APIs answer what the
///   step says from memory, failing as the real clients classify HTTP failures.
/// - `.http` (a few scenarios end to end, and the updater's own tests): the local backend serves its
///   routes on 127.0.0.1 and the updater reaches it through `BackendClient`; the Play Developer API and
///   Stripe's API are fakes on 127.0.0.1 reached by the real clients.
final class ScenarioHarness: Sendable {
    enum Transport: Sendable {
        case inProcess
        case http
    }

    let configuration: RelayConfiguration
    let verifier: NotificationVerifier
    let normalizer: SubscriptionUpdater
    let client: BackendClient
    private let backend: LocalBackend
    private let database: SubscriptionDatabase
    /// The folder of the database file, removed by `stop()`.
    private let directory: URL
    let transport: Transport
    /// The receive time of the current step: the backend's clock and the Play API's answers follow it.
    let now = LockedBox<Int64>(Fixtures.signedDate)
    let play = LockedBox<JSON>(.null)
    let stripe = LockedBox<JSON>(.null)
    /// Over HTTP only: the local backend's routes and the fake store APIs.
    private let backendGroup: ServiceGroup?
    private let backendTask: Task<Void, any Error>?
    private let playServer: TestHTTPServer?

    static let apiKey = "scenario-key"
    static let stripeKey = "rk_test_scenario"

    /// - Parameter stripeAPI: whether the app configures `stripe.api`.
    init(stripeAPI: Bool = true, transport: Transport = .http) async throws {
        self.transport = transport
        let play = self.play
        let stripe = self.stripe
        playServer = transport == .inProcess ? nil : try await TestHTTPServer { request in
            if request.path.hasPrefix("/stripe/v1/charges/") {
                // Stripe's API: the key and the pinned version the client must send, then the step's charge.
                guard request.headers["authorization"] == "Bearer \(Self.stripeKey)", request.headers["stripe-version"] == "2024-06-20" else {
                    return TestHTTPResponse(status: 401, text: #"{"error": {"type": "invalid_request_error"}}"#)
                }
                let charge = stripe.value["charge"]
                guard let charge, !charge.isNull, request.path.contains(charge["id"]?.stringValue ?? "-"), request.path.contains("expand") else {
                    return TestHTTPResponse(status: 404, text: #"{"error": {"type": "invalid_request_error", "code": "resource_missing"}}"#)
                }
                return TestHTTPResponse(body: charge.serialized())
            }
            if request.path.hasSuffix("/token") {
                return TestHTTPResponse(text: #"{"access_token": "play-token", "expires_in": 3600, "token_type": "Bearer"}"#)
            }
            let answers = play.value
            if let status = answers["$status"]?.int64Value {  // a failing Play API, for the error tests
                return TestHTTPResponse(status: Int(status), text: #"{"error": {"code": \#(status), "message": "test"}}"#)
            }
            // "tokens": {token: SubscriptionPurchaseV2} answers for other purchase tokens (a replaced purchase).
            let token = request.path.split(separator: "/").last.map(String.init)?.removingPercentEncoding ?? ""
            let document = request.path.contains("/subscriptionsv2/")
                ? answers["tokens"]?[token] ?? answers["subscription"] : answers["product"]
            guard let document, !document.isNull else {
                return TestHTTPResponse(status: 404, text: #"{"error": {"code": 404, "message": "The purchase token was not found."}}"#)
            }
            return TestHTTPResponse(body: document.serialized())
        }
        directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("scenario"))
        let database = directory.appendingPathComponent("backend.sqlite").path
        configuration = try RelayConfiguration.parse(
            yaml: Self.yaml(database: database, playURL: playServer?.baseURL ?? "http://127.0.0.1:9", stripeAPI: stripeAPI),
            baseDirectory: Fixtures.directory.path,
            environment: [:])
        let now = self.now
        let subscriptions = try SubscriptionDatabase(path: database)
        let backend = try LocalBackend(configuration: configuration, database: subscriptions, clock: { now.value })
        self.backend = backend
        self.database = subscriptions
        var backendConfiguration = configuration.backend
        if transport == .http {
            let ports = AsyncStream.makeStream(of: Int.self)
            let application = backend.application(logger: testLogger()) { port in ports.continuation.yield(port) }
            let group = ServiceGroup(services: [application], gracefulShutdownSignals: [], logger: testLogger())
            backendGroup = group
            backendTask = Task { try await group.run() }
            var iterator = ports.stream.makeAsyncIterator()
            backendConfiguration.url = "http://127.0.0.1:\(await iterator.next() ?? 0)"
        } else {
            backendGroup = nil
            backendTask = nil
        }
        client = BackendClient(
            configuration: backendConfiguration, retry: .init(retries: 2, initialDelay: .milliseconds(10)), logger: testLogger(),
            metrics: NOOPMetricsHandler.instance)
        verifier = try NotificationVerifier(configuration: configuration, logger: testLogger())
        switch transport {
        case .http:
            normalizer = try SubscriptionUpdater(
                configuration: configuration, stateStore: BackendStateStore(client: client), storeAPIs: try testStoreAPIs(configuration),
                logger: testLogger(), metrics: NOOPMetricsHandler.instance)
        case .inProcess:
            let fakes = StoreAPIs(
                play: ["demo": MemoryPlay(answers: play)], stripe: stripeAPI ? ["demo": MemoryStripe(answers: stripe)] : [:])
            normalizer = try SubscriptionUpdater(
                configuration: configuration, stateStore: LocalStateStore(backend: backend, database: subscriptions), storeAPIs: fakes,
                logger: testLogger(), metrics: NOOPMetricsHandler.instance)
        }
    }

    /// The updater's state store: the local backend's database (in process) or its routes (over HTTP).
    var stateStore: any SubscriptionStateStore {
        switch transport {
        case .http: BackendStateStore(client: client)
        case .inProcess: LocalStateStore(backend: backend, database: database)
        }
    }

    /// Links ids to a user in application 1, as `POST .../users/{user}/aliases` does.
    func link(_ aliases: [String], to user: String) async throws {
        _ = try await database.link(aliases: aliases, to: user, applicationId: 1, policy: .transfer, now: now.value)
    }

    /// Sets a user's attributes in application 1, as `PUT .../users/{id}/attributes` does.
    func setAttributes(_ attributes: [String: JSON], of user: String) async throws {
        _ = try await database.setAttributes(attributes, of: user, applicationId: 1, now: now.value)
    }

    /// Stores a state as it is (a subscription the relay saw before).
    func store(_ state: SubscriptionState) async throws {
        _ = try await database.write(state, ifMatch: 0)
    }

    /// The stored state of a subscription, as the backend holds it.
    func subscription(store: Store, originalTransactionId: String) async throws -> SubscriptionState? {
        switch transport {
        case .http: try await client.subscription(store: store, originalTransactionId: originalTransactionId)
        case .inProcess: try await database.subscription(store: store, originalTransactionId: originalTransactionId)
        }
    }

    /// The user's active entitlement identifiers, as the entitlements route answers.
    func activeEntitlements(appUserId: String) async throws -> [String] {
        let answer: JSON? =
            switch transport {
            case .http: try await client.entitlements(appUserId: appUserId)
            case .inProcess: try await backend.entitlements(appUserId: appUserId).json
            }
        return answer?["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue }.sorted() ?? []
    }

    func stop() async {
        await backendGroup?.triggerGracefulShutdown()
        _ = try? await backendTask?.value
        await playServer?.stop()
        // Thousands of scenario runs would otherwise leave their databases in the temporary folder.
        try? FileManager.default.removeItem(at: directory)
    }

    static func yaml(database: String, playURL: String, stripeAPI: Bool) -> String {
        let stripeAPIConfiguration = stripeAPI ? ", api: { baseUrl: \"\(playURL)/stripe\", secretKey: \"\(stripeKey)\" }" : ""
        return """
        backend: { url: "http://127.0.0.1:1", apiKey: "\(apiKey)", database: "\(database)", listen: "127.0.0.1:0", entitlementsTTL: 60s }
        apps:
          - key: demo
            projectId: 1
            applicationId: 1
            apple: { bundleId: com.example.app, appAppleId: 1234, environments: [Sandbox, Production], rootCertificates: [apple/root.pem] }
            google:
              packageName: com.example.app
              pushAudience: "https://relay.example.com/v1/notifications/google/demo"
              pushServiceAccount: "pubsub-push@example.iam.gserviceaccount.com"
              jwks: google/jwks.json
              playApi: { baseUrl: "\(playURL)", tokenUrl: "\(playURL)/token", serviceAccountKey: google/service-account.json }
            stripe: { signingSecrets: ["whsec_test_secret"]\(stripeAPIConfiguration) }
            paddle: { secretKeys: ["pdl_ntfset_scenario_secret"] }
            products:
              - { productId: com.example.pro.monthly, store: APP_STORE, entitlements: [pro] }
              - { productId: com.example.pro.yearly, store: APP_STORE, entitlements: [pro] }
              - { productId: com.example.premium.monthly, store: APP_STORE, entitlements: [pro, premium] }
              - { productId: com.example.lifetime, store: APP_STORE, entitlements: [lifetime] }
              - { productId: pro_monthly, store: PLAY_STORE, entitlements: [pro] }
              - { productId: premium_monthly, store: PLAY_STORE, entitlements: [pro] }
              - { productId: "premium_monthly:monthly", store: PLAY_STORE, entitlements: [pro, premium] }
              - { productId: lifetime, store: PLAY_STORE, entitlements: [lifetime] }
              - { productId: "tier:monthly", store: PLAY_STORE, entitlements: [pro, tier_monthly] }
              - { productId: "tier:yearly", store: PLAY_STORE, entitlements: [pro, tier_yearly] }
              - { productId: price_pro_monthly, store: STRIPE, entitlements: [pro] }
              - { productId: prod_premium, store: STRIPE, entitlements: [pro, premium] }
              - { productId: price_lifetime, store: STRIPE, entitlements: [lifetime] }
              - { productId: pri_pro_monthly, store: PADDLE, entitlements: [pro] }
              - { productId: pro_premium, store: PADDLE, entitlements: [pro, premium] }
              - { productId: pri_lifetime, store: PADDLE, entitlements: [lifetime] }
        money: { exchangeRates: exchange-rates.json }
        """
    }

    /// The request the store would send for `notification`, received at `receivedAt`.
    func request(store: Store, notification: JSON, messageId: String?, receivedAt: Int64) -> RawNotification {
        var headers: [String: String] = [:]
        let body: [UInt8]
        switch store {
        case .apple:
            let signer = AppleSigner()
            var payload = notification
            if case .object(var members) = payload, case .object(var data) = members["data"] ?? .null {
                for key in ["signedTransactionInfo", "signedRenewalInfo"] {
                    if let nested = data[key], case .object = nested { data[key] = .string(signer.sign(nested)) }
                }
                members["data"] = .object(data)
                payload = .object(members)
            }
            body = signer.body(payload)
        case .google:
            body = GooglePushSigner.envelope(notification, messageId: messageId ?? "0")
            let signer = GooglePushSigner()
            headers["authorization"] = "Bearer " + signer.token(GooglePushSigner.claims(issuedAt: receivedAt / 1000))
        case .stripe:
            body = notification.serialized()
            headers["stripe-signature"] = WebhookSigning.stripeHeader(body: body, secret: "whsec_test_secret", timestamp: receivedAt / 1000)
        case .paddle:
            body = notification.serialized()
            headers["paddle-signature"] = WebhookSigning.paddleHeader(body: body, secret: "pdl_ntfset_scenario_secret", timestamp: receivedAt / 1000)
        case .promotional:
            body = notification.serialized()
        }
        return RawNotification(
            store: store, app: "demo", receivedAtMilliseconds: receivedAt, body: body, requestHeaders: headers,
            source: store == .promotional ? PromotionalGrant.source : nil)
    }

    /// The notification's own time (Unix ms), for the default receive time.
    static func eventTime(store: Store, _ notification: JSON) -> Int64? {
        switch store {
        case .apple: notification["signedDate"]?.int64Value
        case .google: notification["eventTimeMillis"]?.stringValue.flatMap { Int64($0) } ?? notification["eventTimeMillis"]?.int64Value
        case .stripe: notification["created"]?.int64Value.map { $0 * 1000 }
        case .paddle: Timestamp.milliseconds(notification["occurred_at"]?.stringValue)
        case .promotional: notification["at"]?.int64Value
        }
    }
}

/// The real store API clients of `configuration` (pointed at the tests' fake servers), as the relay
/// builds them.
func testStoreAPIs(_ configuration: RelayConfiguration) throws -> StoreAPIs {
    StoreAPIs(
        play: try GooglePlayClient.clients(for: configuration, logger: testLogger()),
        stripe: StripeClient.clients(for: configuration, logger: testLogger()))
}

/// The Play Developer API from memory: the step's answers, failing as `GooglePlayClient` classifies the
/// HTTP failure a `$status` stands for (404/410 not found, other 4xx refused, 5xx and 429 unavailable).
struct MemoryPlay: PlayPurchases {
    let answers: LockedBox<JSON>

    func subscription(packageName: String, purchaseToken: String) async throws(StoreAPIError) -> JSON {
        let answers = answers.value
        try Self.fail(answers)
        guard let document = answers["tokens"]?[purchaseToken] ?? answers["subscription"], !document.isNull else {
            throw StoreAPIError(.play, kind: .notFound, message: "The purchase token was not found.", status: 404)
        }
        return document
    }

    func product(packageName: String, productId: String, purchaseToken: String) async throws(StoreAPIError) -> JSON {
        let answers = answers.value
        try Self.fail(answers)
        guard let document = answers["product"], !document.isNull else {
            throw StoreAPIError(.play, kind: .notFound, message: "The purchase token was not found.", status: 404)
        }
        return document
    }

    func voidedPurchases(packageName: String, startTime: Int64, endTime: Int64, pageToken: String?) async throws(StoreAPIError) -> JSON {
        ["voidedPurchases": []]
    }

    /// Scenarios do not acknowledge (their apps leave `acknowledgePurchases` off).
    func acknowledge(packageName: String, productId: String, purchaseToken: String, subscription: Bool) async throws(StoreAPIError) {
        throw StoreAPIError(.play, kind: .rejected, message: "scenarios do not acknowledge purchases", status: 400)
    }

    private static func fail(_ answers: JSON) throws(StoreAPIError) {
        guard let status = answers["$status"]?.int64Value.map(Int.init) else { return }
        let kind: StoreAPIError.Kind =
            switch status {
            case 404, 410: .notFound
            case 429, 500...: .unavailable
            case 400..<500: .rejected
            default: .invalidResponse
            }
        throw StoreAPIError(.play, kind: kind, message: "test", status: status)
    }
}

/// Stripe's API from memory: the step's refunded charge, else 404.
struct MemoryStripe: StripeCharges {
    let answers: LockedBox<JSON>

    func charge(_ id: String) async throws(StoreAPIError) -> JSON {
        guard let charge = answers.value["charge"], !charge.isNull, charge["id"]?.stringValue == id else {
            throw StoreAPIError(.stripe, kind: .notFound, message: "No such charge", status: 404)
        }
        return charge
    }

    func subscription(_ id: String) async throws(StoreAPIError) -> JSON {
        guard let object = answers.value["subscription"], !object.isNull, object["id"]?.stringValue == id else {
            throw StoreAPIError(.stripe, kind: .notFound, message: "No such subscription", status: 404)
        }
        return object
    }

    func checkoutSession(_ id: String) async throws(StoreAPIError) -> JSON {
        guard let object = answers.value["checkoutSession"], !object.isNull, object["id"]?.stringValue == id else {
            throw StoreAPIError(.stripe, kind: .notFound, message: "No such checkout session", status: 404)
        }
        return object
    }

    func price(_ id: String) async throws(StoreAPIError) -> JSON {
        throw StoreAPIError(.stripe, kind: .notFound, message: "No such price", status: 404)
    }

    func invoice(_ id: String) async throws(StoreAPIError) -> JSON {
        throw StoreAPIError(.stripe, kind: .notFound, message: "No such invoice", status: 404)
    }

    func subscriptions(createdFrom: Int64?, startingAfter: String?) async throws(StoreAPIError) -> JSON { ["data": [], "has_more": false] }

    func invoices(subscription: String, startingAfter: String?) async throws(StoreAPIError) -> JSON { ["data": [], "has_more": false] }

    func charges(customer: String, startingAfter: String?) async throws(StoreAPIError) -> JSON { ["data": [], "has_more": false] }

    func events(createdFrom: Int64, createdBefore: Int64, types: [String], startingAfter: String?) async throws(StoreAPIError) -> JSON {
        ["data": [], "has_more": false]
    }

    func event(_ id: String) async throws(StoreAPIError) -> JSON {
        throw StoreAPIError(.stripe, kind: .notFound, message: "No such event", status: 404)
    }

    func createCheckoutSession(_ form: [(String, String)], idempotencyKey: String) async throws(StoreAPIError) -> JSON {
        throw StoreAPIError(.stripe, kind: .rejected, message: "scenarios create no checkout sessions", status: 400)
    }
}
