import CoreMetrics
import HTTPTypes
public import Hummingbird
import NIOCore
import RelayConfig
import RelayCore

/// Who presented the request's key (docs/contracts.md, "Keys and scopes").
public enum BackendPrincipal: Sendable, Equatable {
    /// `backend.apiKey` or one of `backend.apiKeys`: every route, every app.
    case secret
    /// One of `backend.readKeys`: the read routes, for these apps' rows only.
    case read(apps: Set<String>, applicationIds: Set<Int>)
    /// One of an app's `publicApiKeys`: the public routes, for this app only.
    case publicApp(key: String, applicationId: Int)

    /// The app keys whose rows this key reaches; nil: every app.
    public var apps: Set<String>? {
        switch self {
        case .secret: nil
        case .read(let apps, _): apps
        case .publicApp(let key, _): [key]
        }
    }

    /// The application ids whose rows (subscription states, products) this key reaches; nil: every one.
    public var applicationIds: Set<Int>? {
        switch self {
        case .secret: nil
        case .read(_, let ids): ids
        case .publicApp(_, let id): [id]
        }
    }

    /// The kind, for metrics labels and messages (never the key).
    public var kind: String {
        switch self {
        case .secret: "secret"
        case .read: "read"
        case .publicApp: "public"
        }
    }
}

/// Which kinds of key a route admits.
public enum RouteScope: String, Sendable, CaseIterable {
    /// The secret key only: writes, the worker's reads, anything that spans every app.
    case secret
    /// The secret key, and read keys (rows of their apps only).
    case read
    /// The secret key, and public keys (their app's rows only).
    case `public`

    func admits(_ principal: BackendPrincipal) -> Bool {
        switch (self, principal) {
        case (_, .secret): true
        case (.read, .read): true
        case (.public, .publicApp): true
        default: false
        }
    }
}

/// A route: its method and its path as registered (`:name` for a parameter).
public struct BackendRoute: Sendable, Hashable, CustomStringConvertible {
    public var method: HTTPRequest.Method
    public var path: String

    public init(_ method: HTTPRequest.Method, _ path: String) {
        self.method = method
        self.path = path
    }

    public var description: String { "\(method.rawValue) \(path)" }
}

extension LocalBackend {
    static let subscriptionPath = "\(internalPrefix)/:store/:originalTransactionId"
    static let entitlementsPath = "/subscriptions-api/public/v1/users/:appUserId/entitlements"
    static let productsPath = "/subscriptions-api/public/v1/products"
    static let appTransactionPath = "/subscriptions-api/public/v1/users/:appUserId/app-transaction"
    static let aliasesPath = "/subscriptions-api/public/v1/users/:appUserId/aliases"
    static let userPath = "/subscriptions-api/internal/v1/users/:appUserId"
    static let attributesPath = "/subscriptions-api/public/v1/users/:appUserId/attributes"
    static let configPath = "/config-api/read/v1-application-id/:applicationId/entitlements/:responseVersion"

    /// Every route the backend serves and the keys it admits: the one place a route's scope is decided.
    /// Registering a route that is not listed here stops the process at startup, and a test compares this
    /// table with the routes the router holds and with its own table of expected answers per kind of key.
    public static let routeScopes: [BackendRoute: RouteScope] = [
        // The worker's product mapping (Superwall's config API).
        BackendRoute(.get, configPath): .secret,
        // Subscription state: read and written by the worker.
        BackendRoute(.get, subscriptionPath): .secret,
        BackendRoute(.put, subscriptionPath): .secret,
        // Analytics: the rows of the read key's apps.
        BackendRoute(.get, internalPrefix): .read,
        BackendRoute(.get, eventsPath): .read,
        BackendRoute(.get, revenuePath): .read,
        BackendRoute(.get, metricsPath): .read,
        BackendRoute(.get, customerPath): .read,
        BackendRoute(.get, deliveriesPath): .read,
        BackendRoute(.get, endpointsPath): .read,
        // Acting on deliveries: the secret key only (a read key sees, it does not act).
        BackendRoute(.post, deliveryResendPath): .secret,
        BackendRoute(.post, endpointRecoverPath): .secret,
        BackendRoute(.post, endpointEnablePath): .secret,
        // What an app asks with the key it embeds: its own users and products.
        BackendRoute(.get, entitlementsPath): .public,
        BackendRoute(.get, productsPath): .public,
        BackendRoute(.post, appTransactionPath): .public,
        BackendRoute(.post, aliasesPath): .public,
        BackendRoute(.put, attributesPath): .public,
        BackendRoute(.post, purchasesPath): .public,
        // Web checkout and redemption codes (Superwall's SDK contract).
        BackendRoute(.post, checkoutSessionPath): .public,
        BackendRoute(.post, checkoutStatusPath): .public,
        BackendRoute(.post, checkoutConfirmPath): .public,
        BackendRoute(.post, checkoutCompletePath): .public,
        BackendRoute(.post, checkoutPollPath): .public,
        BackendRoute(.post, redeemPath): .public,
        // Promotional grants: the developer's, with the secret key.
        BackendRoute(.post, grantsPath): .secret,
        BackendRoute(.delete, grantPath): .secret,
        // The worker: which user an id stands for, so its events name the user.
        BackendRoute(.get, userPath): .secret,
    ]

    /// Registers `handler` for a route of `routeScopes`; it runs only for a key the route's scope admits
    /// (403 `forbidden` otherwise) and gets that key's principal for filtering rows.
    func route(
        _ router: Router<BackendRequestContext>, _ method: HTTPRequest.Method, _ path: String,
        _ handler: @escaping @Sendable (Request, BackendRequestContext, BackendPrincipal) async throws -> Response
    ) {
        guard let scope = Self.routeScopes[BackendRoute(method, path)] else {
            preconditionFailure("\(method.rawValue) \(path) has no scope in LocalBackend.routeScopes: decide who may call it there")
        }
        let backend = self
        router.on(RouterPath(path), method: method) { request, context in
            // The authentication middleware ran first: a request without a known key never gets here.
            guard let principal = context.principal else { return unauthorizedResponse }
            guard scope.admits(principal) else {
                return backend.forbidden("a \(principal.kind) key does not reach this route; \(scope.requirement)")
            }
            return try await handler(request, context, principal)
        }
    }

    /// 403 `forbidden`: a known key outside its scope (a route it does not reach, or another app's rows),
    /// counted. The detail names the kind of key, never the key.
    func forbidden(_ detail: String) -> Response {
        accessRefusals.increment([("status", "403")])
        return errorResponse(.forbidden, "forbidden", detail)
    }
}

extension RouteScope {
    /// What the route needs, for a 403's detail.
    var requirement: String {
        switch self {
        case .secret: "it needs the secret key (backend.apiKey)"
        case .read: "it needs the secret key or a read key (backend.readKeys)"
        case .public: "it needs the secret key or the app's public key (apps[].publicApiKeys)"
        }
    }
}

let unauthorizedResponse = errorResponse(
    .unauthorized, "unauthorized", "Authorization: Bearer <key> is required, with a key this backend knows (secret, read or an app's public key)")

/// The backend's keys, resolved in constant time: every configured key is compared with what the
/// request presents over the same fixed length (`RelayConfiguration.Backend.maximumKeyLength` bytes),
/// whichever matches, so timing tells nothing about how much of a key was right, nor how long keys are.
struct BackendKeys: Sendable {
    private let entries: [(key: [UInt8], principal: BackendPrincipal)]

    init(_ configuration: RelayConfiguration) {
        let applicationIds = Dictionary(configuration.apps.map { ($0.key, $0.applicationId) }, uniquingKeysWith: { first, _ in first })
        var entries: [(key: [UInt8], principal: BackendPrincipal)] = []
        for key in configuration.backend.secretKeys { entries.append((Array(key.utf8), .secret)) }
        for readKey in configuration.backend.readKeys {
            entries.append((Array(readKey.key.utf8), .read(apps: Set(readKey.apps), applicationIds: Set(readKey.apps.compactMap { applicationIds[$0] }))))
        }
        for app in configuration.apps {
            for key in app.publicApiKeys { entries.append((Array(key.utf8), .publicApp(key: app.key, applicationId: app.applicationId))) }
        }
        self.entries = entries
    }

    /// The principal of `Authorization: Bearer <key>`, or nil for none or an unknown key.
    func principal(authorization: String?) -> BackendPrincipal? {
        // The scheme is case-insensitive (RFC 9110, section 11.1).
        guard let authorization, authorization.utf8.count > 7, authorization.utf8.prefix(7).map({ $0 | 0x20 }).elementsEqual("bearer ".utf8)
        else { return nil }
        let given = Array(authorization.utf8.dropFirst(7))
        // Longer than any key can be: no key, and no need to compare.
        guard given.count <= RelayConfiguration.Backend.maximumKeyLength else { return nil }
        var found: BackendPrincipal?
        for entry in entries where Self.equal(given, entry.key) { found = entry.principal }
        return found
    }

    /// Compares `maximumKeyLength` bytes whatever the lengths (both at most that long), without an early
    /// exit: the time is the same for every key and every guess.
    static func equal(_ given: [UInt8], _ expected: [UInt8]) -> Bool {
        var difference = UInt8(given.count == expected.count ? 0 : 1)
        for index in 0..<RelayConfiguration.Backend.maximumKeyLength {
            let left = index < given.count ? given[index] : 0
            let right = index < expected.count ? expected[index] : 0
            difference |= left ^ right
        }
        return difference == 0
    }
}

/// The local backend's request context: Hummingbird's storage, the client's address (for the public
/// routes' rate limit) and, once the authentication middleware ran, who presented the key.
public struct BackendRequestContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    /// The TCP peer's IP address.
    public let peerAddress: String?
    /// Nil until the authentication middleware resolved the key.
    public var principal: BackendPrincipal?
    /// The client's rate-limit key (an IPv4 address, an IPv6 /64), set by the middleware for public and
    /// unknown keys: what the redeem route's guessing limit counts by.
    public var clientKey: String?

    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        peerAddress = source.channel.remoteAddress?.ipAddress
    }
}

/// Every request needs a key the backend knows (401 `unauthorized` otherwise, also for paths that do
/// not exist, so the routes cannot be mapped without one). A request with a public key, or without a
/// known key, takes a token from its client's bucket first: 429 with `Retry-After` when it is empty, so
/// a public key copied out of an app cannot exhaust the backend, nor can anyone guess keys quickly.
package struct BackendAuthentication: RouterMiddleware {
    package typealias Context = BackendRequestContext
    let keys: BackendKeys
    let limiter: ClientRateLimiter
    let clientAddressHeader: HTTPField.Name?
    /// With `backend.publicRateLimit.trustedProxies`: the header is believed only from them.
    let trustedProxies: ClientAddressResolver?
    let refusals: LabeledCounters
    let rateLimited: LabeledCounters

    package func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        // The console checks its own session (and rate-limits its sign-in by the client this resolves); its
        // pages never take a key.
        if LocalBackend.isConsole(request.uri.path) {
            var context = context
            context.clientKey = clientAddress(request, context)
            return try await next(request, context)
        }
        let principal = keys.principal(authorization: request.headers[.authorization])
        switch principal {
        case .secret, .read:
            break
        case .publicApp, nil:
            let client = clientAddress(request, context)
            if case .limited(let seconds) = limiter.take(client) {
                rateLimited.increment([("key", principal == nil ? "none" : "public")])
                var response = errorResponse(
                    .tooManyRequests, "rate_limited", "too many requests from this client; try again in \(seconds) s (backend.publicRateLimit)")
                response.headers[.retryAfter] = String(seconds)
                return response
            }
        }
        guard let principal else {
            refusals.increment([("status", "401")])
            return unauthorizedResponse
        }
        var context = context
        context.principal = principal
        if case .publicApp = principal { context.clientKey = clientAddress(request, context) }
        return try await next(request, context)
    }

    /// Behind `trustedProxies`: the header read from the right past them (`ClientAddressResolver`). Else the
    /// configured header's last entry (the one the operator's proxy added), else the TCP peer. An IPv6
    /// address by its /64, which one subscriber usually holds whole.
    private func clientAddress(_ request: Request, _ context: Context) -> String {
        if let trustedProxies {
            let header = clientAddressHeader ?? HTTPField.Name("X-Forwarded-For")!
            let client = trustedProxies.client(peer: context.peerAddress, forwardedFor: request.headers[values: header])
            return client?.clientKey ?? Self.bucket(context.peerAddress ?? "unknown")
        }
        if let clientAddressHeader, let value = request.headers[clientAddressHeader],
            let last = value.split(separator: ",").last?.trimmingCharacters(in: .whitespaces), !last.isEmpty
        {
            return Self.bucket(last)
        }
        return Self.bucket(context.peerAddress ?? "unknown")
    }

    /// The rate limit's client key of an address: an IPv4 address as it is, an IPv6 address by its first
    /// 64 bits (`2001:db8:1:2::/64`), so one subscriber's 2^64 addresses share one bucket.
    package static func bucket(_ address: String) -> String {
        IPAddress(address)?.clientKey ?? address
    }
}
