import Foundation
import Hummingbird
import Logging
public import RelayConfig
public import RelayCore

/// What the purchases and grants routes need from outside this module, wired by RelayApp: Apple's signature
/// checks (RelayVerification, which the backend does not import), the stores' APIs, and the record log.
public struct AppPurchases: Sendable {
    /// Verifies a StoreKit 2 signed transaction for an app key with the app's Apple rules; the decoded
    /// transaction or why it is refused.
    public typealias VerifyApple = @Sendable (_ app: String, _ signedTransaction: String) -> Result<JSON, Rejection>
    /// Appends a record to the log and returns once it is acknowledged.
    public typealias Append = @Sendable (_ record: OutgoingRecord) async throws -> Void

    let verifyApple: VerifyApple
    let storeAPIs: StoreAPIs
    let append: Append
    /// `relay.notifications` (the configured name).
    let topic: String
    /// How long the route waits for the worker to apply the purchase before it answers 202.
    let wait: Duration

    public init(topic: String, storeAPIs: StoreAPIs, wait: Duration = .seconds(5), verifyApple: @escaping VerifyApple, append: @escaping Append) {
        self.topic = topic
        self.storeAPIs = storeAPIs
        self.wait = wait
        self.verifyApple = verifyApple
        self.append = append
    }
}

/// A purchase the route has read from its store: the subscription it is, the user the store carried for
/// it, and the record body's store fields.
struct PurchaseClaim {
    var store: Store
    /// The subscription's key (Apple's originalTransactionId, Google's purchase token, ...).
    var subject: String
    /// The app user id the store carried (Apple's appAccountToken, ...), when it did.
    var storeUser: String?
    /// The record body's store fields (`AppPurchase`).
    var fields: [String: JSON]
    /// Apple: the transaction handed over (a state that records it needs nothing more).
    var transactionId: String?
}

/// Why a purchase cannot be taken: an answer, not an error of the route.
struct PurchaseRefusal: Error {
    var response: Response

    /// 400 `invalid_purchase` with a reason code (the verifier's, or the route's own) and a detail.
    static func invalid(_ reason: String, _ detail: String) -> PurchaseRefusal {
        PurchaseRefusal(
            response: json(.badRequest, ["error": "invalid_purchase", "reason": .string(reason), "detail": .string(Rejection(.malformed, detail).detail)]))
    }
}

extension LocalBackend {
    static let purchasesPath = "/subscriptions-api/public/v1/users/:appUserId/purchases"

    /// `POST /subscriptions-api/public/v1/users/{id}/purchases`: the app hands over a purchase it just made
    /// or restored (docs/identity.md).
    ///
    /// - `{"store": "APP_STORE", "signedTransaction": "<JWS>"}`: StoreKit 2's `jwsRepresentation`, verified
    ///   with the app's Apple rules;
    /// - `{"store": "PLAY_STORE", "productId", "purchaseToken"}`: read from the Play Developer API under the
    ///   app's package (a subscription, else a one-time product);
    /// - `{"store": "STRIPE", "checkoutSessionId" | "subscriptionId"}`: read from Stripe's API (`stripe.api`);
    /// - `{"store": "PADDLE", "transactionId"}`: read from Paddle's API (`paddle.api`).
    ///
    /// The purchase goes through the pipeline as the store's own notification would: a record
    /// (`relay-source: app-purchase`) on `relay.notifications`, which the worker verifies again, applies by
    /// the same state rules (a payment already recorded sends no second event) and binds to the user by the
    /// app's `transferPolicy`. The route waits for that, up to a bound:
    /// - 200 with the entitlements route's body for the user, once applied;
    /// - 202 with what is known when the worker did not apply it within the wait (it will);
    /// - 400 `invalid_purchase` with `reason` and `detail`; 409 `owned_by_another_user` under `keep` when
    ///   another user has the purchase (the answer names no user); 503 when the log or a store's API could
    ///   not be reached (try again).
    func addPurchaseRoutes(to router: Router<BackendRequestContext>) {
        let backend = self
        route(router, .post, Self.purchasesPath) { request, context, principal in
            var store = "unknown"
            let response = try await backend.takePurchase(request, context, principal, store: &store)
            let outcome = switch response.status.code {
            case 200: "applied"
            case 202: "pending"
            case 409: "owned_by_another_user"
            case 503: "unavailable"
            default: "refused"
            }
            backend.purchaseOutcomes.increment([("store", store), ("outcome", outcome)])
            return response
        }
    }

    private func takePurchase(_ request: Request, _ context: BackendRequestContext, _ principal: BackendPrincipal, store label: inout String)
        async throws -> Response
    {
        guard let purchases = appPurchases else {
            return errorResponse(.notFound, "not_found", "this backend process does not take purchases (it has no record log)")
        }
        let (user, app, document): (String, RelayConfiguration.App, JSON?)
        switch try await userRequest(request, context, principal) {
        case .success(let found): (user, app, document) = found
        case .failure(let problem): return problem.response
        }
        guard let document, case .object = document, let store = document["store"]?.stringValue else {
            return errorResponse(
                .badRequest, "bad_request", #"the body must be {"store": "APP_STORE" | "PLAY_STORE" | "STRIPE" | "PADDLE", ...the store's fields}"#)
        }
        if ["APP_STORE", "PLAY_STORE", "STRIPE", "PADDLE"].contains(store) { label = store }
        let claim: PurchaseClaim
        do {
            // The secret key (support, with the buyer's Checkout Session) may hand over a web checkout's purchase.
            var trusted = false
            if case .secret = principal { trusted = true }
            claim = try await read(store: store, document, app: app, purchases: purchases, logger: context.logger, trusted: trusted)
        } catch {
            return error.response
        }
        switch try await bind(claim, to: user, app: app, purchases: purchases, logger: context.logger) {
        case .otherApp: return PurchaseRefusal.invalid(RejectReason.unknownApp.rawValue, "this purchase is another app's").response
        case .ownedByAnotherUser: return ownedByAnotherUser
        case .notStored: return errorResponse(.serviceUnavailable, "not_stored", "the purchase could not be stored; try again")
        case .held, .applied: return try await userEntitlements(user, app: app, status: .ok)
        case .pending: return try await userEntitlements(user, app: app, status: .accepted)
        }
    }

    /// What binding a purchase to a user came to.
    enum Binding: Equatable {
        /// The user had it already, and the state knows it: nothing was stored.
        case held(SubscriptionState)
        /// Applied by the worker within the wait, bound to the user.
        case applied(SubscriptionState)
        /// Stored; the worker did not apply it within the wait.
        case pending
        /// Another user has it, and it does not move (`keep`, or a web purchase its store names the user of).
        case ownedByAnotherUser
        /// The subscription is another app's.
        case otherApp
        /// The log did not take the record.
        case notStored
    }

    /// Binds a purchase read from its store to `user`: decides against who has it now (the stored
    /// subscription's user, else the one the store carried) by the app's policy, appends the hand-over
    /// for the worker, and waits for it to be applied (`AppPurchases.wait`).
    func bind(_ claim: PurchaseClaim, to user: String, app: RelayConfiguration.App, purchases: AppPurchases, logger: Logger) async throws
        -> Binding
    {
        let stored = try await database.subscription(store: claim.store, originalTransactionId: claim.subject)
        // Two apps sharing a Stripe or Paddle account: one app's key never reaches the other's purchases.
        if let stored, stored.applicationId != app.applicationId { return .otherApp }
        let holder = stored.map { AppPurchase.holder(of: $0) } ?? claim.storeUser.flatMap { SubscriptionState.isAnonymous($0) ? nil : $0 }
        if let holder, try await !sameUser(holder, user, applicationId: app.applicationId) {
            // A web purchase's id is no secret (a Checkout Session's is in the success URL): the user the
            // store names for it keeps it, whatever the policy. App Store and Play purchases move by it.
            let webStoreNamed = [.stripe, .paddle].contains(claim.store) && claim.storeUser.map { AppPurchase.sameId($0, holder) } == true
            if app.transferPolicy == .keep || webStoreNamed { return .ownedByAnotherUser }
        } else if let stored, let holder, holder == user || !AppPurchase.sameId(holder, user),
            claim.transactionId.map({ stored.lastTransactionId == $0 || stored.transaction($0) != nil }) ?? true
        {
            // The user has it already, and the state knows the purchase: nothing to apply (an app handing
            // over on every launch appends nothing).
            return .held(stored)
        }
        let purchaser = AppPurchase.Purchaser(appUserId: user, transferPolicy: app.transferPolicy.rawValue, purchaseId: UUID().uuidString.lowercased())
        let notification = RawNotification(
            store: claim.store, app: app.key, receivedAtMilliseconds: clock(), body: JSON.object(claim.fields.merging(purchaser.members) { $1 }).serialized(),
            requestHeaders: [:], source: AppPurchase.source)
        do {
            try await purchases.append(notification.record(topic: purchases.topic, subject: claim.subject))
        } catch {
            // The log's error names broker internals: logged, not answered.
            logger.error(
                "appending a purchase an app handed over failed",
                metadata: [LogKey.notificationStore: "\(claim.store.rawValue)", LogKey.notificationApp: "\(app.key)", LogKey.error: "\(error)"])
            return .notStored
        }
        let applied = try await waitForApplied(
            AppPurchase.notificationId(purchaser.purchaseId), store: claim.store, subject: claim.subject, within: purchases.wait)
        guard let applied else { return .pending }
        if let holder = AppPurchase.holder(of: applied), try await !sameUser(holder, user, applicationId: app.applicationId) {
            // Another user's under `keep` (a hand-over of the other user came first): applied, not bound.
            return .ownedByAnotherUser
        }
        return .applied(applied)
    }

    /// The entitlements route's body for every id of the user `id` stands for, in the app.
    func userEntitlements(_ id: String, app: RelayConfiguration.App, status: HTTPResponse.Status) async throws -> Response {
        json(status, try await userEntitlementsJSON(id, app: app))
    }

    func userEntitlementsJSON(_ id: String, app: RelayConfiguration.App) async throws -> JSON {
        let (_, ids) = try await database.userIds(of: id, applicationId: app.applicationId)
        var subscriptions = try await database.subscriptions(ofUsers: ids)
        subscriptions.removeAll { $0.applicationId != app.applicationId }
        return entitlements(of: subscriptions).json
    }

    private var ownedByAnotherUser: Response {
        errorResponse(
            .conflict, "owned_by_another_user",
            "this purchase belongs to another user of this app, and the app's transferPolicy is keep; it was not given to this user")
    }

    /// Whether two ids stand for the same user of an application (one is the other, or both are linked to one user).
    func sameUser(_ first: String, _ second: String, applicationId: Int) async throws -> Bool {
        if AppPurchase.sameId(first, second) { return true }
        let (one, _) = try await database.userIds(of: first, applicationId: applicationId)
        let (other, _) = try await database.userIds(of: second, applicationId: applicationId)
        return one == other
    }

    // MARK: Reading a purchase from its store

    private func read(store: String, _ document: JSON, app: RelayConfiguration.App, purchases: AppPurchases, logger: Logger, trusted: Bool)
        async throws(PurchaseRefusal) -> PurchaseClaim
    {
        switch store {
        case "APP_STORE": return try readApple(document, app: app, purchases: purchases)
        case "PLAY_STORE": return try await readGoogle(document, app: app, purchases: purchases, logger: logger)
        case "STRIPE": return try await readStripe(document, app: app, purchases: purchases, logger: logger, trusted: trusted)
        case "PADDLE": return try await readPaddle(document, app: app, purchases: purchases, logger: logger)
        default:
            throw PurchaseRefusal(
                response: errorResponse(.badRequest, "bad_request", "store \(store.prefix(32).debugDescription) is not one of APP_STORE, PLAY_STORE, STRIPE, PADDLE"))
        }
    }

    private func readApple(_ document: JSON, app: RelayConfiguration.App, purchases: AppPurchases) throws(PurchaseRefusal) -> PurchaseClaim {
        guard app.apple != nil else { throw .invalid(RejectReason.unknownApp.rawValue, "app \(app.key) takes no App Store purchases (no apple section)") }
        guard let signed = document["signedTransaction"]?.stringValue, !signed.isEmpty else {
            throw PurchaseRefusal(
                response: errorResponse(.badRequest, "bad_request", #"an APP_STORE purchase is {"store": "APP_STORE", "signedTransaction": "<StoreKit 2 jwsRepresentation>"}"#))
        }
        switch purchases.verifyApple(app.key, signed) {
        case .failure(let rejection):
            throw .invalid(rejection.reason.rawValue, rejection.detail)
        case .success(let transaction):
            guard let subject = transaction["originalTransactionId"]?.stringValue else {
                throw .invalid(RejectReason.malformed.rawValue, "signedTransaction names no originalTransactionId")
            }
            return PurchaseClaim(
                store: .apple, subject: subject, storeUser: transaction["appAccountToken"]?.stringValue, fields: ["signedTransaction": .string(signed)],
                transactionId: transaction["transactionId"]?.stringValue)
        }
    }

    private func readGoogle(_ document: JSON, app: RelayConfiguration.App, purchases: AppPurchases, logger: Logger) async throws(PurchaseRefusal)
        -> PurchaseClaim
    {
        guard let google = app.google else {
            throw .invalid(RejectReason.unknownApp.rawValue, "app \(app.key) takes no Google Play purchases (no google section)")
        }
        guard let client = purchases.storeAPIs.play[app.key] else {
            throw .invalid(RejectReason.storeAPIRejected.rawValue, "app \(app.key) has no google.playApi configured; its purchases cannot be read")
        }
        guard let productId = document["productId"]?.stringValue, !productId.isEmpty, productId.utf8.count <= 256,
            let token = document["purchaseToken"]?.stringValue, !token.isEmpty, token.utf8.count <= 4096
        else {
            throw PurchaseRefusal(
                response: errorResponse(.badRequest, "bad_request", #"a PLAY_STORE purchase is {"store": "PLAY_STORE", "productId", "purchaseToken"}"#))
        }
        func unavailable(_ error: StoreAPIError) -> PurchaseRefusal {
            logger.warning(
                "reading a purchase from the Play Developer API failed",
                metadata: [LogKey.notificationStore: "google", LogKey.notificationApp: "\(app.key)", LogKey.error: "\(error)"])
            return PurchaseRefusal(response: errorResponse(.serviceUnavailable, "store_unavailable", "the Play Developer API could not be read; try again"))
        }
        // A subscription, else a one-time product (`purchases.products.get` needs the product id).
        do {
            let purchase = try await client.subscription(packageName: google.packageName, purchaseToken: token)
            let products = purchase["lineItems"]?.arrayValue?.compactMap { $0["productId"]?.stringValue } ?? []
            guard products.contains(productId) else {
                throw PurchaseRefusal.invalid(
                    "wrong_product", "the purchase token is for \(products.isEmpty ? "no product" : products.joined(separator: ", ")), not \(productId)")
            }
            return PurchaseClaim(
                store: .google, subject: token, storeUser: purchase["externalAccountIdentifiers"]?["obfuscatedExternalAccountId"]?.stringValue,
                fields: ["productId": .string(productId), "purchaseToken": .string(token), "kind": "subscription"])
        } catch let refusal as PurchaseRefusal {
            throw refusal
        } catch let error as StoreAPIError where error.kind == .notFound {
            // Not a subscription: a one-time product, or unknown.
        } catch let error as StoreAPIError {
            throw unavailable(error)
        } catch {
            throw PurchaseRefusal(response: errorResponse(.serviceUnavailable, "store_unavailable", "the Play Developer API could not be read; try again"))
        }
        do {
            let purchase = try await client.product(packageName: google.packageName, productId: productId, purchaseToken: token)
            return PurchaseClaim(
                store: .google, subject: token, storeUser: purchase["obfuscatedExternalAccountId"]?.stringValue,
                fields: ["productId": .string(productId), "purchaseToken": .string(token), "kind": "product"])
        } catch {
            guard error.kind == .notFound else { throw unavailable(error) }
            throw .invalid(
                RejectReason.purchaseNotFound.rawValue,
                "Google Play does not know this purchase token for product \(productId) in \(google.packageName): it is wrong or belongs to another app")
        }
    }

    /// A Stripe purchase: `{"subscriptionId"}` or `{"checkoutSessionId"}` (a completed session; a
    /// subscription-mode session's subscription). Keyed as Stripe's own notifications key it: the
    /// subscription, or a payment's PaymentIntent.
    private func readStripe(_ document: JSON, app: RelayConfiguration.App, purchases: AppPurchases, logger: Logger, trusted: Bool)
        async throws(PurchaseRefusal) -> PurchaseClaim
    {
        guard app.stripe != nil else { throw .invalid(RejectReason.unknownApp.rawValue, "app \(app.key) takes no Stripe purchases (no stripe section)") }
        guard let client = purchases.storeAPIs.stripe[app.key] else {
            throw .invalid(RejectReason.storeAPIRejected.rawValue, "app \(app.key) has no stripe.api configured; its purchases cannot be read")
        }
        let subscriptionId = Self.storeId(document["subscriptionId"])
        let sessionId = Self.storeId(document["checkoutSessionId"])
        guard (subscriptionId == nil) != (sessionId == nil) else {
            throw PurchaseRefusal(
                response: errorResponse(.badRequest, "bad_request", #"a STRIPE purchase is {"store": "STRIPE", "checkoutSessionId"} or {"store": "STRIPE", "subscriptionId"}"#))
        }
        let read = { (body: () async throws(StoreAPIError) -> JSON) async throws(PurchaseRefusal) -> JSON in
            try await Self.storeRead(body, store: "Stripe", logger: logger, app: app)
        }
        // A purchase made through the relay's own web checkout is brought into the app with its redemption
        // code (`POST .../redeem`), never by its ids with an app's key: those are in URLs and receipts. The
        // secret key may (support helping a buyer whose code expired or was lost).
        func madeHere(_ object: JSON) throws(PurchaseRefusal) {
            guard trusted || object["metadata"]?[WebCheckout.checkoutMetadataKey]?.stringValue == nil else {
                throw .invalid("redeem_with_code", "this purchase was made through web checkout: redeem its code (POST /subscriptions-api/public/v1/redeem)")
            }
        }
        if let subscriptionId {
            let subscription = try await read { () async throws(StoreAPIError) in try await client.subscription(subscriptionId) }
            try madeHere(subscription)
            return PurchaseClaim(
                store: .stripe, subject: subscriptionId, storeUser: subscription["metadata"]?["app_user_id"]?.stringValue,
                fields: ["subscriptionId": .string(subscriptionId), "subject": .string(subscriptionId)])
        }
        let session = try await read { () async throws(StoreAPIError) in try await client.checkoutSession(sessionId!) }
        try madeHere(session)
        guard session["status"]?.stringValue == "complete" else {
            throw .invalid("not_completed", "the Checkout Session is \(session["status"]?.stringValue ?? "of no status"), not complete: nothing was bought yet")
        }
        let sessionUser = session["metadata"]?["app_user_id"]?.stringValue ?? session["client_reference_id"]?.stringValue
        var fields: [String: JSON] = ["checkoutSessionId": .string(sessionId!)]
        if session["mode"]?.stringValue == "subscription" {
            guard let subscriptionId = session["subscription"]?.stringValue ?? session["subscription"]?["id"]?.stringValue else {
                throw .invalid(RejectReason.purchaseNotFound.rawValue, "the subscription Checkout Session names no subscription")
            }
            let subscription = try await read { () async throws(StoreAPIError) in try await client.subscription(subscriptionId) }
            fields["subject"] = .string(subscriptionId)
            return PurchaseClaim(
                store: .stripe, subject: subscriptionId, storeUser: subscription["metadata"]?["app_user_id"]?.stringValue ?? sessionUser, fields: fields)
        }
        guard session["mode"]?.stringValue == "payment", session["payment_status"]?.stringValue == "paid" else {
            throw .invalid("not_completed", "the Checkout Session is not a paid payment or a subscription")
        }
        let subject = session["payment_intent"]?.stringValue ?? session["payment_intent"]?["id"]?.stringValue ?? sessionId!
        fields["subject"] = .string(subject)
        return PurchaseClaim(store: .stripe, subject: subject, storeUser: sessionUser, fields: fields)
    }

    /// A Paddle purchase: `{"transactionId"}` of a completed (or paid) transaction; its subscription's when
    /// it has one. Keyed as Paddle's own notifications key it: the subscription, else the transaction.
    private func readPaddle(_ document: JSON, app: RelayConfiguration.App, purchases: AppPurchases, logger: Logger) async throws(PurchaseRefusal)
        -> PurchaseClaim
    {
        guard app.paddle != nil else { throw .invalid(RejectReason.unknownApp.rawValue, "app \(app.key) takes no Paddle purchases (no paddle section)") }
        guard let client = purchases.storeAPIs.paddle[app.key] else {
            throw .invalid(RejectReason.storeAPIRejected.rawValue, "app \(app.key) has no paddle.api configured; its purchases cannot be read")
        }
        guard let transactionId = Self.storeId(document["transactionId"]) else {
            throw PurchaseRefusal(response: errorResponse(.badRequest, "bad_request", #"a PADDLE purchase is {"store": "PADDLE", "transactionId"}"#))
        }
        let transaction = try await Self.storeRead({ () async throws(StoreAPIError) in try await client.transaction(transactionId) }, store: "Paddle", logger: logger, app: app)
        guard ["completed", "paid"].contains(transaction["status"]?.stringValue ?? "") else {
            throw .invalid("not_completed", "the transaction is \(transaction["status"]?.stringValue ?? "of no status"), not completed: nothing was bought yet")
        }
        let subject = transaction["subscription_id"]?.stringValue ?? transactionId
        return PurchaseClaim(
            store: .paddle, subject: subject, storeUser: transaction["custom_data"]?["app_user_id"]?.stringValue,
            fields: ["transactionId": .string(transactionId), "subject": .string(subject)])
    }

    /// A store id from the body: a string of 1 to 256 bytes without control characters.
    private static func storeId(_ value: JSON?) -> String? {
        guard let text = value?.stringValue, isValidId(text) else { return nil }
        return text
    }

    /// One read of a web store's API: what the store does not know is 400 `purchase_not_found`; anything
    /// else (unreachable, our key refused) is logged and 503.
    private static func storeRead(_ body: () async throws(StoreAPIError) -> JSON, store: String, logger: Logger, app: RelayConfiguration.App)
        async throws(PurchaseRefusal) -> JSON
    {
        do {
            return try await body()
        } catch {
            if error.kind == .notFound {
                throw .invalid(RejectReason.purchaseNotFound.rawValue, "\(store) does not know this purchase for app \(app.key): it is wrong or of another account")
            }
            logger.warning(
                "reading a purchase from the \(store) API failed",
                metadata: [LogKey.notificationApp: "\(app.key)", LogKey.error: "\(error)"])
            throw PurchaseRefusal(response: errorResponse(.serviceUnavailable, "store_unavailable", "the \(store) API could not be read; try again"))
        }
    }
}
