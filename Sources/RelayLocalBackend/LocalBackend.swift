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

    let configuration: RelayConfiguration
    let database: SubscriptionDatabase
    /// The recorded standardized events (the events and revenue routes).
    public let events: EventStore
    private let apiKey: String
    let clock: @Sendable () -> Int64
    /// Each application's products, built once from the configuration (read for every notification).
    private let mappings: [Int: ProductMapping]
    /// Verifies and appends grandfathering grants (the app-transaction route); nil: the route answers 404.
    let appTransactions: AppTransactionGrants?

    /// - Parameters:
    ///   - clock: now in Unix milliseconds (which subscriptions are active).
    ///   - appTransactions: what the app-transaction route needs from outside this module (RelayApp wires it).
    public init(
        configuration: RelayConfiguration, database: SubscriptionDatabase,
        clock: (@Sendable () -> Int64)? = nil, appTransactions: AppTransactionGrants? = nil
    ) throws(ConfigurationError) {
        guard let apiKey = configuration.backend.apiKey, !apiKey.isEmpty else {
            throw ConfigurationError(key: "backend.apiKey", message: "the local backend requires an API key")
        }
        self.configuration = configuration
        self.database = database
        self.events = EventStore(database: database)
        self.apiKey = apiKey
        self.clock = clock ?? { Int64(Date().timeIntervalSince1970 * 1000) }
        self.appTransactions = appTransactions
        self.mappings = Dictionary(grouping: configuration.apps, by: \.applicationId).mapValues { apps in
            // Grandfathering rule i grants product `$grandfathered:i` (AppTransactionMapping writes it).
            let grandfathered = apps.flatMap { app in
                (app.apple?.grandfathering ?? []).enumerated().map { index, rule in
                    ProductMapping.Product(productId: AppTransactionGrant.productId(rule: index), store: "APP_STORE", entitlements: rule.entitlements)
                }
            }
            return ProductMapping(
                products: apps.flatMap(\.products).map { ProductMapping.Product(productId: $0.productId, store: $0.store, entitlements: $0.entitlements) }
                    + grandfathered)
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
        addSubscriptionListRoutes(to: router)
        addAppTransactionRoutes(to: router)
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
        router.get("/subscriptions-api/public/v1/users/:appUserId/entitlements") { request, context in
            guard let user = context.parameters.get("appUserId")?.removingPercentEncoding, !user.isEmpty else {
                return errorResponse(.badRequest, "bad_request", "appUserId is required")
            }
            // The SDK sends its device id too (`?deviceId=`): what was bought on the device before the user
            // logged in counts as theirs. The union, each subscription once.
            var users = [user]
            if let device = request.uri.queryParameters.get("deviceId"), !device.isEmpty, device != user { users.append(device) }
            // An id the backend has never seen (an SDK asking for a fresh install's device id before any
            // purchase) is a user without entitlements: 200 with empty lists, not 404.
            return json(.ok, backend.entitlements(of: try await backend.database.subscriptions(ofUsers: users)).json)
        }
        router.get("/subscriptions-api/public/v1/products") { request, _ in
            // Every application's products, or one application's (`?applicationId=`).
            guard let text = request.uri.queryParameters.get("applicationId") else { return json(.ok, backend.products(applicationId: nil).json) }
            guard let applicationId = Int(text) else { return errorResponse(.badRequest, "bad_request", "applicationId must be an integer") }
            guard backend.productMapping(applicationId: applicationId) != nil else {
                return errorResponse(.notFound, "not_found", "no application \(applicationId)")
            }
            return json(.ok, backend.products(applicationId: applicationId).json)
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

    /// `{"entitlements": [active ones], "customerInfo": {"subscriptions", "nonSubscriptions", "entitlements"}}`
    /// in the SDK's shapes, over these states (CustomerInfoBuilder says how).
    func entitlements(of subscriptions: [SubscriptionState]) -> UserEntitlements {
        CustomerInfoBuilder(mapping: { productMapping(applicationId: $0) }, now: clock()).document(subscriptions)
    }

    /// The configured products with what they unlock, by application id then as configured; one
    /// application's when `applicationId` is given.
    func products(applicationId: Int?) -> ProductCatalog {
        let applications = applicationId.map { [$0] } ?? mappings.keys.sorted()
        return ProductCatalog(
            data: applications.flatMap { application in
                // Grandfathering grants are not products a store sells: the SDK has nothing to load for them.
                (mappings[application]?.products ?? []).filter { !$0.productId.hasPrefix(AppTransactionGrant.productPrefix) }.map { product in
                    CatalogProduct(
                        identifier: product.productId, store: ProductStore(name: product.store), applicationId: application,
                        entitlements: product.entitlements.map(EntitlementIdentifier.init))
                }
            })
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
