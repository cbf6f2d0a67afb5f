import Foundation
import GRDB
import HTTPTypes
import Hummingbird
import Logging
public import RelayConfig
public import RelayCore
import RelayCrypto

/// The vocabulary of web checkout (docs/web-checkout.md).
public enum WebCheckout {
    /// Metadata on the Checkout Session (and its subscription) the relay creates: the relay's checkout id.
    public static let checkoutMetadataKey = "relay_checkout"
    /// A redemption code: `redemption_` and 32 base32 characters (160 random bits).
    static let codePrefix = "redemption_"
    /// At most this many codes in one redeem request.
    static let maximumCodes = 10
}

/// What the relay seals into a `checkoutContextId` (AES-256-GCM, `v1:<keyId>:<base64url>`): the client
/// can neither read nor change it, and hands it back to the status, confirm, complete and poll routes.
struct CheckoutContext: Equatable {
    var app: String
    var checkoutSessionId: String
    /// The redemption code, in plain: whoever holds the context is the buyer's paywall page.
    var code: String
    var productIdentifier: String
    var appUserId: String?
    var aliasId: String?
    var deviceId: String?
    var createdAt: Int64

    var json: JSON {
        var members: [String: JSON] = [
            "app": .string(app), "checkoutSessionId": .string(checkoutSessionId), "code": .string(code),
            "productIdentifier": .string(productIdentifier), "createdAt": .integer(createdAt),
        ]
        if let appUserId { members["appUserId"] = .string(appUserId) }
        if let aliasId { members["aliasId"] = .string(aliasId) }
        if let deviceId { members["deviceId"] = .string(deviceId) }
        return .object(members)
    }

    init(app: String, checkoutSessionId: String, code: String, productIdentifier: String, appUserId: String?, aliasId: String?, deviceId: String?, createdAt: Int64) {
        self.app = app
        self.checkoutSessionId = checkoutSessionId
        self.code = code
        self.productIdentifier = productIdentifier
        self.appUserId = appUserId
        self.aliasId = aliasId
        self.deviceId = deviceId
        self.createdAt = createdAt
    }

    init?(json: JSON) {
        guard let app = json["app"]?.stringValue, let session = json["checkoutSessionId"]?.stringValue, let code = json["code"]?.stringValue,
            let product = json["productIdentifier"]?.stringValue, let createdAt = json["createdAt"]?.int64Value
        else { return nil }
        self.init(
            app: app, checkoutSessionId: session, code: code, productIdentifier: product, appUserId: json["appUserId"]?.stringValue,
            aliasId: json["aliasId"]?.stringValue, deviceId: json["deviceId"]?.stringValue, createdAt: createdAt)
    }

    /// `v1:<keyId>:<base64url(nonce ‖ ciphertext ‖ tag)>`, sealed with the first of the app's keys; the
    /// prefix is authenticated too.
    func sealed(with keys: [RelayConfiguration.Web.ContextKey]) throws -> String {
        let key = keys[0]
        let prefix = "v1:\(key.id):"
        return prefix + Base64.encodeURL(try AESGCM.seal(json.serialized(), key: key.key, associatedData: Array(prefix.utf8)))
    }

    /// The context sealed in `text` with any of `keys`; nil when it is not one (forged, changed, or sealed
    /// with a key no longer configured).
    static func open(_ text: String, keys: [RelayConfiguration.Web.ContextKey]) -> CheckoutContext? {
        let parts = text.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0] == "v1", let key = keys.first(where: { $0.id == parts[1] }), let sealed = Base64.decode(String(parts[2])),
            let plain = AESGCM.open(sealed, key: key.key, associatedData: Array("v1:\(key.id):".utf8)), let document = try? JSON.parse(plain)
        else { return nil }
        return CheckoutContext(json: document)
    }
}

extension LocalBackend {
    static let checkoutSessionPath = "/subscriptions-api/public/v1/checkout/session"
    static let checkoutStatusPath = "/subscriptions-api/public/v1/checkout/status"
    static let checkoutConfirmPath = "/subscriptions-api/public/v1/checkout/session/confirm"
    static let checkoutCompletePath = "/subscriptions-api/public/v1/checkout/session/complete"
    static let checkoutPollPath = "/subscriptions-api/public/v1/checkout/session/poll-redemption-result"
    static let redeemPath = "/subscriptions-api/public/v1/redeem"

    /// The web checkout routes of Superwall's SDK contract (docs/web-checkout.md), with an app's public key.
    func addCheckoutRoutes(to router: Router<BackendRequestContext>) {
        let backend = self
        route(router, .post, Self.checkoutSessionPath) { request, context, principal in
            try await backend.checkoutRequest(request, context, principal) { app, web, client, document in
                try await backend.createCheckout(
                    document, app: app, web: web, client: client, client: context.clientKey ?? BackendAuthentication.bucket(context.peerAddress ?? "unknown"),
                    logger: context.logger)
            }
        }
        for (path, field) in [
            (Self.checkoutStatusPath, "checkoutId"), (Self.checkoutConfirmPath, "checkoutContextId"), (Self.checkoutCompletePath, "checkoutContextId"),
            (Self.checkoutPollPath, "checkoutContextId"),
        ] {
            route(router, .post, path) { request, context, principal in
                try await backend.checkoutRequest(request, context, principal) { app, web, client, document in
                    guard let text = document[field]?.stringValue, let checkout = CheckoutContext.open(text, keys: web.contextKeys), checkout.app == app.key else {
                        return errorResponse(.badRequest, "invalid_checkout_context", "\(field) is not a checkout context this backend sealed for this app")
                    }
                    let session: JSON
                    switch await backend.stripeRead({ () async throws(StoreAPIError) in try await client.checkoutSession(checkout.checkoutSessionId) }, logger: context.logger) {
                    case .success(let found): session = found
                    case .failure(let problem): return problem.response
                    }
                    switch path {
                    case Self.checkoutStatusPath: return backend.checkoutStatus(session, checkout: checkout, web: web)
                    case Self.checkoutPollPath: return try await backend.pollRedemption(document, session: session, checkout: checkout, app: app, context: context)
                    default: return backend.checkoutResult(session, checkout: checkout, web: web, confirm: path == Self.checkoutConfirmPath)
                    }
                }
            }
        }
        route(router, .post, Self.redeemPath) { request, context, principal in
            try await backend.checkoutRequest(request, context, principal) { app, _, _, document in
                try await backend.redeem(document, app: app, context: context)
            }
        }
    }

    /// What every checkout route starts from: the key's app, with web checkout and Stripe's API
    /// configured, and the body as a JSON object.
    func checkoutRequest(
        _ request: Request, _ context: BackendRequestContext, _ principal: BackendPrincipal,
        _ body: (RelayConfiguration.App, RelayConfiguration.Web, any StripeCharges, JSON) async throws -> Response
    ) async throws -> Response {
        let app: RelayConfiguration.App
        switch userApp(applicationId: request.uri.queryParameters.get("applicationId").map { String($0) }, principal: principal) {
        case .success(let found): app = found
        case .failure(let problem): return problem.response
        }
        guard let web = app.web, let client = appPurchases?.storeAPIs.stripe[app.key] else {
            return errorResponse(.notFound, "not_found", "app \(app.key) has no web checkout (apps[].web with stripe.api), or this process has no record log")
        }
        let bytes = try await request.body.collect(upTo: 64 * 1024)
        guard let document = try? JSON.parse(Array(bytes.readableBytesView)), case .object = document else {
            return errorResponse(.badRequest, "bad_request", "the body must be a JSON object")
        }
        return try await body(app, web, client, document)
    }

    /// A Stripe call of a checkout route: an unknown object is 404 (`what` says which), a refusal 502
    /// `store_refused` (the request or the configuration is wrong: trying again does not help), an
    /// unreachable API 503. Both logged.
    func stripeRead(_ body: () async throws(StoreAPIError) -> JSON, what: String = "this checkout", logger: Logger) async
        -> Result<JSON, RouteProblem>
    {
        do {
            return .success(try await body())
        } catch {
            if error.kind == .notFound { return .failure(RouteProblem(response: errorResponse(.notFound, "not_found", "Stripe does not know \(what)"))) }
            logger.warning("a web checkout's call to Stripe's API failed", metadata: [LogKey.error: "\(error)"])
            if error.kind == .unavailable {
                return .failure(RouteProblem(response: errorResponse(.serviceUnavailable, "store_unavailable", "Stripe's API could not be reached; try again")))
            }
            return .failure(RouteProblem(response: errorResponse(.badGateway, "store_refused", "Stripe refused the request; the relay's log says why")))
        }
    }

    // MARK: POST checkout/session

    func createCheckout(
        _ document: JSON, app: RelayConfiguration.App, web: RelayConfiguration.Web, client: any StripeCharges, client key: String, logger: Logger
    ) async throws -> Response {
        // Each checkout costs Stripe calls and a stored code: 10 at once a client, then one every 6 seconds.
        if case .limited(let seconds) = checkoutLimiter.take(key) {
            var response = errorResponse(.tooManyRequests, "rate_limited", "too many checkouts from this client; try again in \(seconds) s")
            response.headers[.retryAfter] = String(seconds)
            return response
        }
        if let store = document["store"]?.stringValue, store.lowercased() != "stripe" {
            return errorResponse(.badRequest, "unsupported_store", "web checkout runs on Stripe; store \(store.prefix(32).debugDescription) is not offered")
        }
        guard let productIdentifier = document["productIdentifier"]?.stringValue,
            let product = app.products.first(where: { $0.store == "STRIPE" && $0.productId == productIdentifier }), productIdentifier.hasPrefix("price_")
        else {
            return errorResponse(
                .badRequest, "invalid_product", "productIdentifier must be one of the app's STRIPE products, named by its Stripe price (price_…)")
        }
        // The directive: the first the client allows that the relay offers.
        let allowed = document["allowedCheckoutDirectives"]?.arrayValue?.compactMap(\.stringValue) ?? ["redirect"]
        let offered = web.stripePublishableKey == nil ? ["redirect"] : ["redirect", "embedded"]
        guard let directive = allowed.first(where: offered.contains) else {
            return errorResponse(
                .badRequest, "unsupported_directive",
                "this backend offers \(offered.joined(separator: " and ")) (drawer needs a payment form of your own; see docs/web-checkout.md)")
        }
        let identity = document["context"]?["identity"]
        func id(_ key: String) -> String? {
            guard let text = identity?[key]?.stringValue, Self.isValidId(text) else { return nil }
            return text
        }
        let priceObject: JSON
        switch await stripeRead({ () async throws(StoreAPIError) in try await client.price(product.productId) }, what: "the product's price (check apps[].products)", logger: logger) {
        case .success(let found): priceObject = found
        case .failure(let problem): return problem.response
        }
        let recurring = priceObject["type"]?.stringValue == "recurring" || priceObject["recurring"].map { !$0.isNull } == true
        let now = clock()
        let code = WebCheckout.codePrefix + Self.base32(try SecureRandom.bytes(20))
        let checkoutId = Digest.hex(try SecureRandom.bytes(16))
        var metadata: [(String, String)] = [(WebCheckout.checkoutMetadataKey, checkoutId), ("relay_app", app.key), ("price_id", product.productId)]
        // An identified buyer is named on the purchase: its webhooks name the user from the start.
        if let user = id("appUserId") { metadata.append(("app_user_id", user)) }
        var form: [(String, String)] = [
            ("mode", recurring ? "subscription" : "payment"), ("line_items[0][price]", product.productId), ("line_items[0][quantity]", "1"),
        ]
        for (key, value) in metadata {
            form.append(("metadata[\(key)]", value))
            form.append(((recurring ? "subscription_data" : "payment_intent_data") + "[metadata][\(key)]", value))
        }
        if let user = id("appUserId") { form.append(("client_reference_id", String(user.prefix(200)))) }
        // `stripeCustomerId` is not used: customer ids are no secret (the redeem answer names them), and a
        // client naming someone else's would put that customer's e-mail and cards on its checkout page.
        if let email = identity?["email"]?.stringValue, email.contains("@"), email.utf8.count <= 254 {
            form.append(("customer_email", email))
        }
        if directive == "embedded" {
            form += [("ui_mode", "embedded"), ("return_url", web.returnUrl ?? web.successUrl)]
        } else {
            form.append(("success_url", web.successUrl))
            // Only the configured one: a client's URL on the merchant's Stripe page would be an open redirect.
            if let cancel = web.cancelUrl { form.append(("cancel_url", cancel)) }
        }
        let session: JSON
        switch await stripeRead({ () async throws(StoreAPIError) in try await client.createCheckoutSession(form, idempotencyKey: "relay-checkout-\(checkoutId)") }, logger: logger) {
        case .success(let found): session = found
        case .failure(let problem): return problem.response
        }
        guard let sessionId = session["id"]?.stringValue else {
            return errorResponse(.serviceUnavailable, "store_unavailable", "Stripe's answer named no checkout session; try again")
        }
        try await database.storeCode(
            code, applicationId: app.applicationId, checkoutSessionId: sessionId, createdAt: now, expiresAt: now + Self.milliseconds(web.codeTTL))
        // Codes nobody redeemed, expired a TTL ago: forgotten (bounded storage).
        try await database.pruneCodes(before: now - Self.milliseconds(web.codeTTL))
        let checkout = CheckoutContext(
            app: app.key, checkoutSessionId: sessionId, code: code, productIdentifier: product.productId, appUserId: id("appUserId"),
            aliasId: id("aliasId"), deviceId: id("deviceId"), createdAt: now)
        var answer: [String: JSON] = ["directive": .string(directive), "checkoutSessionId": .string(sessionId)]
        if directive == "embedded" {
            answer["publishableKey"] = web.stripePublishableKey.map(JSON.string) ?? .null
            answer["clientSecret"] = session["client_secret"] ?? .null
        } else {
            answer["checkoutUrl"] = session["url"] ?? .null
        }
        return json(.ok, ["directive": .object(answer), "checkoutContextId": .string(try checkout.sealed(with: web.contextKeys))])
    }

    static func milliseconds(_ duration: Duration) -> Int64 {
        duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000
    }

    /// Lower-case RFC 4648 base32 without padding.
    static func base32(_ bytes: [UInt8]) -> String {
        let alphabet = Array("abcdefghijklmnopqrstuvwxyz234567")
        var text = ""
        var buffer = 0
        var bits = 0
        for byte in bytes {
            buffer = (buffer << 8) | Int(byte)
            bits += 8
            while bits >= 5 {
                text.append(alphabet[(buffer >> (bits - 5)) & 31])
                bits -= 5
            }
        }
        if bits > 0 { text.append(alphabet[(buffer << (5 - bits)) & 31]) }
        return text
    }

    // MARK: status, confirm, complete

    func redemptionURL(_ checkout: CheckoutContext, web: RelayConfiguration.Web) -> String {
        web.redemptionUrl.replacingOccurrences(of: "{code}", with: checkout.code)
    }

    /// `{"status": "pending" | "completed" | "abandoned", "paymentStatus", "redemptionUrl"?}` from Stripe's session.
    func checkoutStatus(_ session: JSON, checkout: CheckoutContext, web: RelayConfiguration.Web) -> Response {
        let status = switch session["status"]?.stringValue {
        case "complete" where Self.isPaid(session): "completed"
        case "expired": "abandoned"
        default: "pending"
        }
        var answer: [String: JSON] = ["status": .string(status), "paymentStatus": session["payment_status"] ?? .null]
        if status == "completed" { answer["redemptionUrl"] = .string(redemptionURL(checkout, web: web)) }
        return json(.ok, .object(answer))
    }

    /// `complete`: `{"redemptionUrl"}`; `confirm`: `{"customerId", "subscriptionId", "redemptionUrl"}`. 409
    /// `not_completed` while Stripe's session is not complete.
    func checkoutResult(_ session: JSON, checkout: CheckoutContext, web: RelayConfiguration.Web, confirm: Bool) -> Response {
        guard Self.isPaid(session) else {
            return errorResponse(.conflict, "not_completed", "the checkout is \(session["status"]?.stringValue ?? "unknown") at Stripe, not complete")
        }
        var answer: [String: JSON] = ["redemptionUrl": .string(redemptionURL(checkout, web: web))]
        if confirm {
            answer["customerId"] = Self.stripeId(session["customer"]).map(JSON.string) ?? .null
            answer["subscriptionId"] = Self.stripeId(session["subscription"]).map(JSON.string) ?? .null
        }
        return json(.ok, .object(answer))
    }

    /// Whether the checkout is complete and paid: a delayed payment method (a bank debit) completes the
    /// session unpaid, and it is bought only once the payment succeeds.
    static func isPaid(_ session: JSON) -> Bool {
        session["status"]?.stringValue == "complete" && session["payment_status"]?.stringValue != "unpaid"
    }

    /// A Stripe reference: the id, whether Stripe sent it as a string or an expanded object.
    static func stripeId(_ value: JSON?) -> String? {
        value?.stringValue ?? value?["id"]?.stringValue
    }
}
