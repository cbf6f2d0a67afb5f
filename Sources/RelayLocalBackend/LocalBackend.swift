import Foundation
import HTTPTypes
public import Hummingbird
public import Logging
import NIOCore
public import RelayConfig
public import RelayCore
public import CoreMetrics

/// The local backend (`revenue-relay run --role backend`, and inside `dev`): the routes of
/// docs/contracts.md (Backend API) over SQLite. Products come from the configuration's `apps[].products`; subscription state
/// is stored with optimistic concurrency (If-Match on the version) and never goes back in source time.
public struct LocalBackend: Sendable {
    public static let internalPrefix = "/subscriptions-api/internal/v1/subscriptions"

    let configuration: RelayConfiguration
    let database: SubscriptionDatabase
    /// The recorded standardized events (the events and revenue routes).
    public let events: EventStore
    /// The recorded webhook attempts (the deliveries route).
    public let deliveryLog: DeliveryLog
    /// Every configured key and whom it stands for.
    let keys: BackendKeys
    /// The console's session cookies.
    let consoleSessions: ConsoleSessions
    /// Console sign-ins per client: 10 at once, then one every 6 seconds.
    let signInLimiter: ClientRateLimiter
    /// The newest rejected notifications (the console's page); nil: the page says it cannot read them.
    let rejectedNotifications: RejectedNotifications?
    /// The public routes' per-client limit (`backend.publicRateLimit`).
    let limiter: ClientRateLimiter
    /// `relay_backend_access_refused_total{status}` (401, 403) and `relay_backend_rate_limited_total{key}`.
    let accessRefusals: LabeledCounters
    private let rateLimited: LabeledCounters
    /// `relay_backend_purchases_total{store, outcome}`: purchases apps handed over, by what the route answered.
    let purchaseOutcomes: LabeledCounters
    /// `relay_backend_redemptions_total{status}`: codes redeemed, by the status answered (and `RATE_LIMITED`).
    let redeemOutcomes: LabeledCounters
    /// Codes tried per client: 10 at once, then one every 6 seconds.
    let redeemLimiter: ClientRateLimiter
    /// Checkouts started per client: 10 at once, then one every 6 seconds.
    let checkoutLimiter: ClientRateLimiter
    let clock: @Sendable () -> Int64
    /// Each application's products, built once from the configuration (read for every notification).
    private let mappings: [Int: ProductMapping]
    /// Verifies and appends grandfathering grants (the app-transaction route); nil: the route answers 404.
    let appTransactions: AppTransactionGrants?
    /// Verifies, reads and appends purchases apps hand over (the purchases route); nil: the route answers 404.
    let appPurchases: AppPurchases?
    /// Appends resends and control records (the delivery action routes); nil: they answer 503.
    let deliveryActions: DeliveryActions?

    /// - Parameters:
    ///   - clock: now in Unix milliseconds (which subscriptions are active).
    ///   - appTransactions: what the app-transaction route needs from outside this module (RelayApp wires it).
    ///   - appPurchases: what the purchases route needs from outside this module (RelayApp wires it).
    ///   - rateLimitClock: monotonic nanoseconds for the public routes' rate limit (tests step it).
    public init(
        configuration: RelayConfiguration, database: SubscriptionDatabase,
        clock: (@Sendable () -> Int64)? = nil, appTransactions: AppTransactionGrants? = nil, appPurchases: AppPurchases? = nil,
        deliveryActions: DeliveryActions? = nil, rejectedNotifications: RejectedNotifications? = nil, metrics: any MetricsFactory = NOOPMetricsHandler.instance, rateLimitClock: (@Sendable () -> UInt64)? = nil
    ) throws(ConfigurationError) {
        guard !configuration.backend.secretKeys.isEmpty else {
            throw ConfigurationError(key: "backend.apiKey", message: "the local backend requires a secret key (backend.apiKey)")
        }
        self.configuration = configuration
        self.database = database
        self.events = EventStore(database: database)
        self.deliveryLog = DeliveryLog(
            database: database, retentionMilliseconds: configuration.backend.deliveryLog.retention.wholeMilliseconds,
            maxAttempts: configuration.backend.deliveryLog.maxAttempts, clock: clock)
        self.keys = BackendKeys(configuration)
        let limit = configuration.backend.publicRateLimit
        self.limiter = ClientRateLimiter(ratePerSecond: limit.requestsPerSecond, burst: limit.burst, now: rateLimitClock)
        self.accessRefusals = LabeledCounters(label: "relay_backend_access_refused_total", factory: metrics)
        self.rateLimited = LabeledCounters(label: "relay_backend_rate_limited_total", factory: metrics)
        self.purchaseOutcomes = LabeledCounters(label: "relay_backend_purchases_total", factory: metrics)
        self.redeemOutcomes = LabeledCounters(label: "relay_backend_redemptions_total", factory: metrics)
        self.redeemLimiter = ClientRateLimiter.guessing(now: rateLimitClock)
        self.checkoutLimiter = ClientRateLimiter.guessing(now: rateLimitClock)
        self.clock = clock ?? { Int64(Date().timeIntervalSince1970 * 1000) }
        self.appTransactions = appTransactions
        self.appPurchases = appPurchases
        self.deliveryActions = deliveryActions
        self.rejectedNotifications = rejectedNotifications
        self.consoleSessions = ConsoleSessions(configuration)
        self.signInLimiter = ClientRateLimiter.guessing(now: rateLimitClock)
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
        let listen = configuration.backend.listen
        return Application(
            router: router(), configuration: .init(address: .hostname(listen.host, port: listen.port), serverName: nil),
            onServerRunning: { channel in await onListening(channel.localAddress?.port ?? listen.port) }, logger: logger)
    }

    /// Every route behind the authentication middleware, each with its scope from `routeScopes`.
    public func router() -> Router<BackendRequestContext> {
        let router = Router(context: BackendRequestContext.self)
        let limit = configuration.backend.publicRateLimit
        router.add(
            middleware: BackendAuthentication(
                keys: keys, limiter: limiter, clientAddressHeader: limit.clientAddressHeader.flatMap { HTTPField.Name($0) },
                trustedProxies: limit.trustedProxies.isEmpty ? nil : ClientAddressResolver(trustedProxies: limit.trustedProxies),
                refusals: accessRefusals, rateLimited: rateLimited))
        addEventRoutes(to: router)
        addSubscriptionListRoutes(to: router)
        addAppTransactionRoutes(to: router)
        addAliasRoutes(to: router)
        addCustomerRoutes(to: router)
        addEndpointRoutes(to: router)
        addConsoleRoutes(to: router)
        addDeliveryRoutes(to: router)
        addPurchaseRoutes(to: router)
        addGrantRoutes(to: router)
        addCheckoutRoutes(to: router)
        let backend = self
        route(router, .get, Self.configPath) { _, context, _ in
            guard let text = context.parameters.get("applicationId"), let applicationId = Int(text) else {
                return errorResponse(.badRequest, "bad_request", "applicationId must be an integer")
            }
            guard let mapping = backend.productMapping(applicationId: applicationId) else {
                return errorResponse(.notFound, "not_found", "no application \(applicationId)")
            }
            return json(.ok, mapping.json)
        }
        route(router, .get, Self.subscriptionPath) { _, context, _ in
            guard let (store, id) = backend.subscriptionKey(context) else { return badSubscriptionPath }
            guard let state = try await backend.database.subscription(store: store, originalTransactionId: id) else {
                return errorResponse(.notFound, "not_found", "no state for \(store.rawValue)/\(id)")
            }
            return json(.ok, serialized: state.serialized(), etag: state.version)
        }
        route(router, .put, Self.subscriptionPath) { request, context, _ in
            guard let (store, id) = backend.subscriptionKey(context) else { return badSubscriptionPath }
            guard let ifMatchText = request.headers[.ifMatch], let ifMatch = Int64(ifMatchText.trimmingCharacters(in: CharacterSet(charactersIn: "\" "))),
                ifMatch >= 0
            else {
                return errorResponse(.badRequest, "bad_request", "If-Match: <version> is required (0 when no state exists yet)")
            }
            let body = try await request.body.collect(upTo: 1 << 20)
            let state: SubscriptionState
            do {
                // Parsed whole, so what is stored is always the relay's own form, whoever formatted the body.
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
                return json(.ok, serialized: stored.serialized(), etag: stored.version)
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
        route(router, .get, Self.entitlementsPath) { request, context, principal in
            guard let user = Self.pathUserId(context, bounded: false) else { return Self.badPathUserId(bounded: false) }
            // The SDK sends its device id too (`?deviceId=`): what was bought on the device before the user
            // logged in counts as theirs. The union, each subscription once.
            var users = [user]
            if let device = request.uri.queryParameters.get("deviceId").map({ String($0) }), !device.isEmpty, device != user {
                guard !AppUser.hasControlCharacters(device) else { return errorResponse(.badRequest, "bad_request", "deviceId has control characters") }
                users.append(device)
            }
            // Any id of a user (`aliases`) stands for all of them, in each app the key reaches.
            users = try await backend.allUserIds(users, applicationIds: principal.applicationIds)
            // An id the backend has never seen (an SDK asking for a fresh install's device id before any
            // purchase) is a user without entitlements: 200 with empty lists, not 404.
            // A public key sees its own app's purchases only: one user id that bought in two apps shows
            // each app what was bought in it.
            var subscriptions = try await backend.database.subscriptions(ofUsers: users)
            if let allowed = principal.applicationIds { subscriptions.removeAll { !allowed.contains($0.applicationId) } }
            return json(.ok, backend.entitlements(of: subscriptions).json)
        }
        route(router, .get, Self.productsPath) { request, _, principal in
            // Every application's products, or one application's (`?applicationId=`); a public key's
            // app's only.
            guard let text = request.uri.queryParameters.get("applicationId") else {
                return json(.ok, backend.products(applicationId: principal.applicationIds.flatMap(\.first)).json)
            }
            guard let applicationId = Int(text) else { return errorResponse(.badRequest, "bad_request", "applicationId must be an integer") }
            if let allowed = principal.applicationIds, !allowed.contains(applicationId) {
                return backend.forbidden("this key reaches its own application's products only")
            }
            guard backend.productMapping(applicationId: applicationId) != nil else {
                return errorResponse(.notFound, "not_found", "no application \(applicationId)")
            }
            return json(.ok, backend.products(applicationId: applicationId).json)
        }
        return router
    }

    /// The path's store and id (percent-decoded: ids may hold any character), or nil when invalid.
    private func subscriptionKey(_ context: BackendRequestContext) -> (Store, String)? {
        guard let text = context.parameters.get("store"), let store = Store(rawValue: text),
            let id = context.parameters.get("originalTransactionId")?.removingPercentEncoding, !id.isEmpty
        else { return nil }
        return (store, id)
    }

    /// The application's products from the configuration, or nil when no app has this id.
    public func productMapping(applicationId: Int) -> ProductMapping? {
        mappings[applicationId]
    }

    /// What the entitlements route answers for `appUserId` (with the secret key: every app's purchases).
    public func entitlements(appUserId: String) async throws -> UserEntitlements {
        entitlements(of: try await database.subscriptions(ofUsers: [appUserId]))
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

func json(_ status: HTTPResponse.Status, _ value: JSON, etag: Int64? = nil) -> Response {
    json(status, serialized: value.serialized(), etag: etag)
}

/// A JSON body already serialized (a subscription state's stored form, whose contexts stay unparsed).
func json(_ status: HTTPResponse.Status, serialized: [UInt8], etag: Int64? = nil) -> Response {
    var headers: HTTPFields = [.contentType: "application/json"]
    if let etag { headers[.eTag] = "\(etag)" }
    return Response(status: status, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: serialized)))
}

private let badSubscriptionPath = errorResponse(
    .badRequest, "bad_request", "the path must be /subscriptions-api/internal/v1/subscriptions/{apple|google|stripe|paddle}/{originalTransactionId}")

func errorResponse(_ status: HTTPResponse.Status, _ code: String, _ detail: String) -> Response {
    json(status, ["error": .string(code), "detail": .string(detail)])
}
