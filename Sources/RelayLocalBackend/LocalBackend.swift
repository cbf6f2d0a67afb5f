import Foundation
import HTTPTypes
public import Hummingbird
public import Logging
import NIOCore
public import RelayConfig
public import RelayCore

/// The local backend (`revenue-relay run --role backend`, and inside `dev`): the four routes of
/// docs/contracts.md (Backend API) over SQLite. Products come from the configuration's `apps[].products`; subscription state
/// is stored with optimistic concurrency (If-Match on the version) and never goes back in source time.
public struct LocalBackend: Sendable {
    public static let internalPrefix = "/subscriptions-api/internal/v1/subscriptions"

    private let configuration: RelayConfiguration
    private let database: SubscriptionDatabase
    /// The recorded standardized events (the events and revenue routes).
    public let events: EventStore
    private let apiKey: String
    private let clock: @Sendable () -> Int64
    /// Each application's products, built once from the configuration (read for every notification).
    private let mappings: [Int: ProductMapping]

    /// - Parameter clock: now in Unix milliseconds (which subscriptions are active).
    public init(
        configuration: RelayConfiguration, database: SubscriptionDatabase,
        clock: (@Sendable () -> Int64)? = nil
    ) throws(ConfigurationError) {
        guard let apiKey = configuration.backend.apiKey, !apiKey.isEmpty else {
            throw ConfigurationError(key: "backend.apiKey", message: "the local backend requires an API key")
        }
        self.configuration = configuration
        self.database = database
        self.events = EventStore(database: database)
        self.apiKey = apiKey
        self.clock = clock ?? { Int64(Date().timeIntervalSince1970 * 1000) }
        self.mappings = Dictionary(grouping: configuration.apps, by: \.applicationId).mapValues { apps in
            ProductMapping(
                products: apps.flatMap(\.products).map { ProductMapping.Product(productId: $0.productId, store: $0.store, entitlements: $0.entitlements) })
        }
    }

    /// The HTTP application serving the routes on `backend.listen` (port 0 picks one; `onListening` gets it).
    public func application(logger: Logger, onListening: @escaping @Sendable (Int) async -> Void) -> some ApplicationProtocol {
        let router = Router()
        router.add(middleware: BearerAuthentication(apiKey: apiKey))
        addRoutes(to: router)
        let listen = configuration.backend.listen
        return Application(
            router: router, configuration: .init(address: .hostname(listen.host, port: listen.port), serverName: nil),
            onServerRunning: { channel in await onListening(channel.localAddress?.port ?? listen.port) }, logger: logger)
    }

    func addRoutes(to router: Router<BasicRequestContext>) {
        addEventRoutes(to: router)
        let backend = self
        router.get("/config-api/read/v1-application-id/:applicationId/entitlements/:responseVersion") { _, context in
            guard let text = context.parameters.get("applicationId"), let applicationId = Int(text) else {
                return errorResponse(.badRequest, "bad_request", "applicationId must be an integer")
            }
            guard let mapping = backend.productMapping(applicationId: applicationId) else {
                return errorResponse(.notFound, "not_found", "no application \(applicationId)")
            }
            return json(.ok, mapping.json)
        }
        router.get("\(Self.internalPrefix)/:store/:originalTransactionId") { _, context in
            guard let (store, id) = backend.subscriptionKey(context) else { return badSubscriptionPath }
            guard let state = try await backend.database.subscription(store: store, originalTransactionId: id) else {
                return errorResponse(.notFound, "not_found", "no state for \(store.rawValue)/\(id)")
            }
            return json(.ok, state.json, etag: state.version)
        }
        router.put("\(Self.internalPrefix)/:store/:originalTransactionId") { request, context in
            guard let (store, id) = backend.subscriptionKey(context) else { return badSubscriptionPath }
            guard let ifMatchText = request.headers[.ifMatch], let ifMatch = Int64(ifMatchText.trimmingCharacters(in: CharacterSet(charactersIn: "\" "))),
                ifMatch >= 0
            else {
                return errorResponse(.badRequest, "bad_request", "If-Match: <version> is required (0 when no state exists yet)")
            }
            let body = try await request.body.collect(upTo: 1 << 20)
            let state: SubscriptionState
            do {
                state = try SubscriptionState(json: try JSON.parse(Array(body.readableBytesView)))
            } catch let decoding as WireDecodingError {
                return errorResponse(.badRequest, "bad_request", "\(decoding)")
            } catch {
                return errorResponse(.badRequest, "bad_request", "the body is not JSON")
            }
            guard state.store == store, state.originalTransactionId == id else {
                return errorResponse(.badRequest, "bad_request", "the body's store and originalTransactionId must match the path")
            }
            switch try await backend.database.write(state, ifMatch: ifMatch) {
            case .written(let stored):
                return json(.ok, stored.json, etag: stored.version)
            case .versionMismatch(let current):
                return json(
                    .preconditionFailed,
                    ["error": "version_mismatch", "detail": .string("the stored version is \(current?.version ?? 0); read it again and re-apply"),
                     "current": current?.json ?? .null])
            case .stale(let current):
                return json(
                    .conflict,
                    ["error": "stale_write", "detail": .string("the stored state is from a newer notification (sourceTimestamp \(current.sourceTimestamp))"),
                     "current": current.json])
            }
        }
        router.get("/subscriptions-api/public/v1/users/:appUserId/entitlements") { _, context in
            guard let user = context.parameters.get("appUserId")?.removingPercentEncoding, !user.isEmpty else {
                return errorResponse(.badRequest, "bad_request", "appUserId is required")
            }
            // An id the backend has never seen (an SDK asking for a fresh install's device id before any
            // purchase) is a user without entitlements: 200 with empty lists, not 404.
            return json(.ok, backend.entitlements(of: try await backend.database.subscriptions(ofUser: user)))
        }
    }

    /// The path's store and id (percent-decoded: ids may hold any character), or nil when invalid.
    private func subscriptionKey(_ context: BasicRequestContext) -> (Store, String)? {
        guard let text = context.parameters.get("store"), let store = Store(rawValue: text),
            let id = context.parameters.get("originalTransactionId")?.removingPercentEncoding, !id.isEmpty
        else { return nil }
        return (store, id)
    }

    /// The application's products from the configuration, or nil when no app has this id.
    public func productMapping(applicationId: Int) -> ProductMapping? {
        mappings[applicationId]
    }

    /// `{"entitlements": [active ones], "customerInfo": {"subscriptions", "nonSubscriptions", "entitlements"}}`.
    func entitlements(of subscriptions: [SubscriptionState]) -> JSON {
        let now = clock()
        struct Grant {
            var active = false
            var productIds: [String] = []
            var expiresAt: Int64?
        }
        var grants: [String: Grant] = [:]
        var subscriptionList: [JSON] = []
        for subscription in subscriptions {
            let active = subscription.isActive(at: now)
            let mapping = productMapping(applicationId: subscription.applicationId) ?? ProductMapping(products: [])
            let entitlements = mapping.entitlements(of: subscription)
            for identifier in entitlements {
                var grant = grants[identifier] ?? Grant()
                grant.active = grant.active || active
                if !grant.productIds.contains(subscription.productId) { grant.productIds.append(subscription.productId) }
                if let expiry = subscription.gracePeriodExpiresAt ?? subscription.expiresAt { grant.expiresAt = max(grant.expiresAt ?? expiry, expiry) }
                grants[identifier] = grant
            }
            var entry = subscription.json.objectValue ?? [:]
            entry["recentNotifications"] = nil  // the worker's bookkeeping, not the customer's
            entry["isActive"] = .bool(active)
            entry["willRenew"] = .bool(subscription.autoRenew && active)
            entry["entitlements"] = .array(entitlements.map(JSON.string))
            subscriptionList.append(.object(entry))
        }
        let identifiers = grants.keys.sorted()
        return [
            "entitlements": .array(identifiers.filter { grants[$0]!.active }.map { ["identifier": .string($0), "type": "SERVICE_LEVEL"] }),
            "customerInfo": [
                "subscriptions": .array(subscriptionList),
                "nonSubscriptions": [],
                "entitlements": .array(identifiers.map { identifier in
                    let grant = grants[identifier]!
                    return [
                        "identifier": .string(identifier), "type": "SERVICE_LEVEL", "isActive": .bool(grant.active),
                        "productIds": .array(grant.productIds.map(JSON.string)), "expiresAt": grant.expiresAt.map(JSON.integer) ?? .null,
                    ]
                }),
            ],
        ]
    }
}

/// Every route needs `Authorization: Bearer <backend.apiKey>`; anything else is 401.
struct BearerAuthentication: RouterMiddleware {
    typealias Context = BasicRequestContext
    let apiKey: String

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let expected = Array("Bearer \(apiKey)".utf8)
        let given = Array((request.headers[.authorization] ?? "").utf8)
        // Compare without an early exit on the first differing byte.
        var difference = UInt8(given.count == expected.count ? 0 : 1)
        for index in 0..<min(given.count, expected.count) { difference |= given[index] ^ expected[index] }
        guard difference == 0 else {
            return errorResponse(.unauthorized, "unauthorized", "Authorization: Bearer <backend API key> is required")
        }
        return try await next(request, context)
    }
}

func json(_ status: HTTPResponse.Status, _ value: JSON, etag: Int64? = nil) -> Response {
    var headers: HTTPFields = [.contentType: "application/json"]
    if let etag { headers[.eTag] = "\(etag)" }
    return Response(status: status, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: value.serialized())))
}

private let badSubscriptionPath = errorResponse(
    .badRequest, "bad_request", "the path must be /subscriptions-api/internal/v1/subscriptions/{apple|google|stripe|paddle}/{originalTransactionId}")

func errorResponse(_ status: HTTPResponse.Status, _ code: String, _ detail: String) -> Response {
    json(status, ["error": .string(code), "detail": .string(detail)])
}
