import Foundation
import HTTPTypes
import Hummingbird
import Logging
import RelayConfig
import RelayCore
import RelayCrypto

/// Redeeming web purchases' codes: the poll route's redemption and `POST .../redeem` (docs/web-checkout.md, Codes).
extension LocalBackend {
    /// `poll-redemption-result`: `pending` while Stripe's session is open, `failed` once it expired, and
    /// once complete the redemption of its code for the body's `appUserId` (else `deviceId`), as `redeem`.
    func pollRedemption(_ document: JSON, session: JSON, checkout: CheckoutContext, app: RelayConfiguration.App, context: BackendRequestContext)
        async throws -> Response
    {
        let empty: JSON = ["subscriptions": [], "nonSubscriptions": [], "entitlements": []]
        if session["status"]?.stringValue == "expired" { return json(.ok, ["status": "failed", "codes": [], "entitlements": [], "customerInfo": empty]) }
        guard Self.isPaid(session) else { return json(.ok, ["status": "pending", "codes": [], "entitlements": [], "customerInfo": empty]) }
        var request = document
        if case .object(var members) = request {
            members["appUserId"] = members["appUserId"] ?? checkout.appUserId.map(JSON.string)
            members["deviceId"] = members["deviceId"] ?? checkout.deviceId.map(JSON.string)
            members["aliasId"] = members["aliasId"] ?? checkout.aliasId.map(JSON.string)
            members["codes"] = [["code": .string(checkout.code), "firstRedemption": true]]
            request = .object(members)
        }
        let response = try await redeem(request, app: app, context: context, polled: true)
        return response
    }

    /// `POST /redeem`: each code's result, then the redeemer's entitlements and customer info (the seed's
    /// `RedeemResponse`). The redeemer is `appUserId`, else `deviceId`, else `aliasId`.
    func redeem(_ document: JSON, app: RelayConfiguration.App, context: BackendRequestContext, polled: Bool = false) async throws -> Response {
        guard let purchases = appPurchases, app.web != nil else { return errorResponse(.notFound, "not_found", "no web checkout") }
        func id(_ key: String) -> String? {
            guard let text = document[key]?.stringValue, Self.isValidId(text) else { return nil }
            return text
        }
        guard let owner = id("appUserId") ?? id("deviceId") ?? id("aliasId") else {
            return errorResponse(.badRequest, "bad_request", "name the redeemer: appUserId, else deviceId (1 to 256 bytes)")
        }
        // An alias is the SDK's id of a user not identified yet: a user, not a device.
        let ownership: JSON = id("appUserId") == nil && id("deviceId") != nil
            ? ["type": "DEVICE", "deviceId": .string(owner)] : ["type": "APP_USER", "appUserId": .string(owner)]
        guard let list = document["codes"]?.arrayValue, (1...WebCheckout.maximumCodes).contains(list.count) else {
            return errorResponse(.badRequest, "bad_request", #"codes must hold 1 to 10 {"code", "firstRedemption"}"#)
        }
        let codes = list.compactMap { $0["code"]?.stringValue ?? $0.stringValue }
        guard codes.count == list.count, codes.allSatisfy({ !$0.isEmpty && $0.utf8.count <= 128 }) else {
            return errorResponse(.badRequest, "bad_request", "each code is a string of 1 to 128 bytes")
        }
        // Guessing codes: every code tried takes a token from the client's bucket.
        let client = context.clientKey ?? BackendAuthentication.bucket(context.peerAddress ?? "unknown")
        for _ in codes {
            if case .limited(let seconds) = redeemLimiter.take(client) {
                var response = errorResponse(.tooManyRequests, "rate_limited", "too many codes tried from this client; try again in \(seconds) s")
                response.headers[.retryAfter] = String(seconds)
                redeemOutcomes.increment([("status", "RATE_LIMITED")])
                return response
            }
        }
        var results: [JSON] = []
        for code in codes {
            let result = try await redeemCode(code, owner: owner, ownership: ownership, app: app, purchases: purchases, logger: context.logger)
            if case .failure(let problem) = result { return problem.response }
            if case .success(let answer) = result {
                redeemOutcomes.increment([("status", answer["status"]?.stringValue ?? "-")])
                results.append(answer)
            }
        }
        let body = try await userEntitlementsJSON(owner, app: app)
        var answer: [String: JSON] = ["codes": .array(results), "entitlements": body["entitlements"] ?? [], "customerInfo": body["customerInfo"] ?? .null]
        if polled { answer["status"] = "complete" }
        return json(.ok, .object(answer))
    }

    /// One code for `owner`: `INVALID_CODE` (unknown, another app's, not paid yet, redeemed by another user,
    /// or a purchase another user has), `CODE_EXPIRED` (past its expiry, not redeemed by this user before),
    /// `EXPIRED_SUBSCRIPTION` (bound, but it gives no access any more), `SUCCESS` (also again for the user
    /// who redeemed it). A response instead when something could not be reached.
    func redeemCode(
        _ code: String, owner: String, ownership: JSON, app: RelayConfiguration.App, purchases: AppPurchases, logger: Logger
    ) async throws -> Result<JSON, RouteProblem> {
        let invalid: JSON = ["status": "INVALID_CODE", "code": .string(code)]
        guard code.hasPrefix(WebCheckout.codePrefix), let stored = try await database.code(code), stored.applicationId == app.applicationId,
            let client = purchases.storeAPIs.stripe[app.key]
        else { return .success(invalid) }
        let mine = try await stored.redeemedBy.asyncMap { try await sameUser($0, owner, applicationId: app.applicationId) } ?? false
        // Single use: once redeemed, the code is that user's (under any of its ids); nobody else's.
        if stored.redeemedBy != nil, !mine { return .success(invalid) }
        if clock() > stored.expiresAt, !mine {
            let expired: JSON = ["resent": false, "obfuscatedEmail": .null]
            return .success(["status": "CODE_EXPIRED", "code": .string(code), "expired": expired])
        }
        let session: JSON
        switch await stripeRead({ () async throws(StoreAPIError) in try await client.checkoutSession(stored.checkoutSessionId) }, logger: logger) {
        case .success(let found): session = found
        case .failure(let problem):
            if problem.response.status == .notFound { return .success(invalid) }
            return .failure(problem)
        }
        // Nothing bought yet (or the payment is still on its way): nothing to redeem.
        guard Self.isPaid(session) else { return .success(invalid) }
        // Single use, decided in one statement: of two redeemers at once, one has it.
        if stored.redeemedBy == nil, let holder = try await database.claim(code, by: owner, at: clock()),
            try await !sameUser(holder, owner, applicationId: app.applicationId)
        {
            return .success(invalid)
        }
        let subscriptionId = Self.stripeId(session["subscription"])
        let subject = subscriptionId ?? Self.stripeId(session["payment_intent"]) ?? stored.checkoutSessionId
        let claim = PurchaseClaim(
            store: .stripe, subject: subject,
            storeUser: session["metadata"]?["app_user_id"]?.stringValue,
            fields: ["checkoutSessionId": .string(stored.checkoutSessionId), "subject": .string(subject)])
        let state: SubscriptionState?
        switch try await bind(claim, to: owner, app: app, purchases: purchases, logger: logger) {
        case .otherApp, .ownedByAnotherUser: return .success(invalid)
        case .notStored: return .failure(RouteProblem(response: errorResponse(.serviceUnavailable, "not_stored", "the redemption could not be stored; try again")))
        case .held(let found), .applied(let found): state = found
        case .pending: state = nil
        }
        let mapping = productMapping(applicationId: app.applicationId)
        let entitlements = state.flatMap { state in mapping?.entitlements(of: state) } ?? []
        let active = state?.isActive(at: clock()) ?? true
        let info: JSON = [
            "ownership": ownership,
            "purchaserInfo": [
                "appUserId": .string(owner), "email": session["customer_details"]?["email"] ?? session["customer_email"] ?? .null,
                "storeIdentifiers": [
                    "store": "STRIPE", "stripeCustomerId": Self.stripeId(session["customer"]).map(JSON.string) ?? .null,
                    "stripeSubscriptionIds": .array(subscriptionId.map { [JSON.string($0)] } ?? []),
                ],
            ],
            "paywallInfo": .null,
            "entitlements": .array(entitlements.sorted().map { identifier -> JSON in ["identifier": .string(identifier), "type": "SERVICE_LEVEL"] }),
        ]
        return .success(["status": active ? "SUCCESS" : "EXPIRED_SUBSCRIPTION", "code": .string(code), "redemptionInfo": info])
    }
}

extension Optional {
    fileprivate func asyncMap<T>(_ transform: (Wrapped) async throws -> T) async rethrows -> T? {
        guard let value = self else { return nil }
        return try await transform(value)
    }
}
