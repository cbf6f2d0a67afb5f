public import CoreMetrics
import Foundation
public import Logging
public import RelayConfig
public import RelayCore

/// Why a verified notification produced no events.
public enum NormalizationError: Error, Sendable, CustomStringConvertible {
    /// The notification cannot be normalized as it is (Google: the Play Developer API does not know the
    /// purchase, or refuses us). It goes to the rejected topic with this reason.
    case rejected(Rejection)
    /// The backend or a store API is unreachable: try the record again later.
    case unavailable(String)

    public var description: String {
        switch self {
        case .rejected(let rejection): "rejected: \(rejection)"
        case .unavailable(let message): "unavailable: \(message)"
        }
    }
}

/// Verified store notifications → standardized events (docs/contracts.md, the standardized event), with the
/// subscription's state kept in the backend. The mapping itself is `NotificationMapping` (nothing read or
/// written); this owns what surrounds it:
///
/// 1. **Read** the subscription's stored state (and the application's product mapping).
/// 2. **De-duplicate:** a notification id already in the state's `recentNotifications` changes nothing and
///    yields the same events as the first time, from what was recorded then.
/// 3. **Store facts:** Google's subscription from the Play Developer API; a Stripe refund's charge from
///    Stripe's API. Their failures are classified once for every store (`storeAPIFailure`).
/// 4. **The user's other subscriptions**, for `subscriptionStatus` before and after.
/// 5. **Write** the new state with If-Match; a conflict reads and applies again (at most 10 times). A plan
///    change then marks the subscription it replaced.
public final class SubscriptionUpdater: Sendable {
    private let apps: [String: RelayConfiguration.App]
    let stateStore: any SubscriptionStateStore
    let mapping: NotificationMapping
    private let play: [String: any PlayPurchases]
    private let stripe: [String: any StripeCharges]
    private let paddle: [String: any PaddleReads]
    let logger: Logger
    let counters: NormalizerCounters

    /// The updater of `configuration`'s apps and `money` section.
    public convenience init(
        configuration: RelayConfiguration, stateStore: any SubscriptionStateStore, storeAPIs: StoreAPIs, logger: Logger,
        metrics: any MetricsFactory
    ) throws(ConfigurationError) {
        try self.init(apps: configuration.apps, money: configuration.money, stateStore: stateStore, storeAPIs: storeAPIs, logger: logger, metrics: metrics)
    }

    /// Reads the exchange rates. `storeAPIs` are the Play Developer API and Stripe API clients of the
    /// apps that configure them (`GooglePlayClient.clients(for:)`, `StripeClient.clients(for:)`).
    public init(
        apps: [RelayConfiguration.App], money: RelayConfiguration.Money, stateStore: any SubscriptionStateStore, storeAPIs: StoreAPIs,
        logger: Logger, metrics: any MetricsFactory
    ) throws(ConfigurationError) {
        self.apps = RelayConfiguration.appsByKey(apps)
        self.stateStore = stateStore
        let counters = NormalizerCounters(metrics)
        self.mapping = NotificationMapping(
            events: EventBuilder(money: money, rates: try ExchangeRates.load(path: money.exchangeRates), counters: counters, logger: logger))
        self.play = storeAPIs.play
        self.stripe = storeAPIs.stripe
        self.paddle = storeAPIs.paddle
        self.logger = logger
        self.counters = counters
    }

    /// The standardized events of one verified notification; `receivedAt` is its `relay-received-at`.
    public func normalize(_ notification: VerifiedNotification, receivedAt: Int64) async throws(NormalizationError) -> [StandardEvent] {
        let events = try await apply(notification, receivedAt: receivedAt)
        if let app = apps[notification.app], app.google?.playApi?.acknowledgePurchases == true, notification.store == .google {
            try await acknowledge(notification, app: app)
        }
        return events
    }

    private func apply(_ notification: VerifiedNotification, receivedAt: Int64) async throws(NormalizationError) -> [StandardEvent] {
        guard let app = apps[notification.app] else { return [] }
        var notification = notification
        // A Stripe event `recover stripe` re-ingested: the event itself, from Stripe's API; after the dedup
        // check below for a subscription's event (the record names its subscription, the key the mapping
        // uses too), so a repeat replays what was recorded. Other events (a refund is keyed by what its charge
        // paid for) are read first.
        let stripeSubject = notification.stripeEventId != nil && (notification.type ?? "").hasPrefix("customer.subscription.")
            ? notification.payload.text("subject") : nil
        if let eventId = notification.stripeEventId, stripeSubject == nil { notification = try await stripeEvent(eventId, notification, app: app) }
        var stripeFetched = stripeSubject == nil
        // A voided purchase `recover google` re-ingested: applied only once Google's Voided Purchases API
        // lists it, with what that API and the stored state say (after the dedup check below).
        var voidedConfirmed = !notification.playVoided
        // A subscription `reconcile stripe` found out of step: read from Stripe after the dedup check, and
        // applied as the event Stripe would have sent given the stored state.
        let reconcileSubject = notification.reconcileObject != nil ? notification.payload.text("subject") : nil
        var reconciled = reconcileSubject == nil
        var input = MappingInput(notification: notification, app: app, receivedAt: receivedAt, api: nil)
        // A Stripe or Paddle purchase an app handed over is read from the store's API, as the route did. The
        // route names its subscription (`subject`), so that a repeat replays what was recorded without
        // calling the store; a record without it is read first, to find it.
        let handOverSubject = HandedOverPurchase.readsStoreAPI(notification) ? notification.payload.text("subject") : nil
        var purchaseFetched = handOverSubject != nil ? false : true
        if HandedOverPurchase.readsStoreAPI(notification), handOverSubject == nil {
            input.api = StoreAPIData(purchase: try await fetchPurchase(notification, app: app))
        }

        // Google's subject (the purchase token) is in the notification; its Play data is fetched only
        // after the dedup check below, so a repeat replays what was recorded without calling Google.
        let knownSubject = handOverSubject ?? stripeSubject ?? reconcileSubject
        let first = knownSubject.map { StoreMapping(subject: $0, environment: "PRODUCTION", eventTime: receivedAt) } ?? mapping.map(input, prior: nil)
        if let detail = first.malformed { throw .rejected(Rejection(.malformed, detail)) }
        guard first.recognized else {
            counters.unmapped.increment([("store", notification.store.rawValue)])
            logger.warning(
                "notification type not mapped; no events",
                metadata: [
                    LogKey.notificationStore: "\(notification.store.rawValue)", LogKey.notificationType: "\(notification.type ?? "-")",
                    LogKey.notificationId: "\(notification.notificationId ?? "-")",
                ])
            return []
        }
        // Without a subject there is no state to read; with one, the stored state decides (an invoice
        // names its price only through the subscription the relay already knows).
        guard first.subject != nil || !first.events.isEmpty else { return [] }
        let products = try await backend { () async throws(BackendError) in try await stateStore.productMapping(applicationId: app.applicationId) }
        guard var subject = first.subject else {
            return mapping.events.build(first, input: input, subject: nil, prior: nil, after: nil, others: [], mapping: products)
        }
        // A Stripe refund names its charge, not the subscription it paid for: unless the charge is a one-time
        // purchase the relay keys by its PaymentIntent, Stripe's API says which subscription (when configured).
        if let charge = StripeMapping.refundedChargeId(notification.payload), let client = stripe[app.key] {
            let purchase = try await backend { () async throws(BackendError) in
                try await stateStore.subscription(store: .stripe, originalTransactionId: subject)
            }
            if purchase == nil {
                input.api = StoreAPIData(charge: StripeMapping.trimmedCharge(try await fetchCharge(charge, client: client, app: app)))
                subject = mapping.map(input, prior: nil).subject ?? subject
            }
        }

        var fetched = notification.store != .google
        for _ in 0..<10 {
            let current = try await backend { () async throws(BackendError) in
                try await stateStore.subscription(store: notification.store, originalTransactionId: subject)
            }
            if let id = notification.notificationId, let recent = current?.recentNotifications.last(where: { $0.id == id }),
                let context = AppliedContext(recent.context)
            {
                let applied = mapping.replay(input, recorded: context, subject: subject, mapping: products)
                try await markReplaced(notification.store, applied)
                return applied.events()
            }
            if !stripeFetched, let eventId = notification.stripeEventId {
                notification = try await stripeEvent(eventId, notification, app: app)
                input.notification = notification
                stripeFetched = true
            }
            if !reconciled, let object = notification.reconcileObject {
                let charge: JSON?
                (notification, charge) = try await storeObject(object, notification, prior: current, app: app)
                input.notification = notification
                if let charge { input.api = StoreAPIData(charge: charge) }
                reconciled = true
            }
            if !voidedConfirmed {
                notification = try await confirmVoided(notification, state: current, app: app)
                input.notification = notification
                voidedConfirmed = true
            }
            if !fetched {
                input.api = try await fetchPlay(app: app, notification: notification.payload, known: current != nil)
                // `reconcile google` named the change it saw; Play's answer now must still be that change, or the
                // record is stale (or forged) and applying its type would force a state Play does not have.
                if notification.notificationId?.hasPrefix("reconcile:") == true, let purchase = input.api?.subscription,
                    let code = notification.payload["subscriptionNotification"]?["notificationType"]?.int64Value,
                    !GoogleMapping.reconcileFits(code: code, purchase: purchase)
                {
                    throw .rejected(
                        Rejection(
                            .staleTimestamp,
                            "Play's subscription is \(purchase.text("subscriptionState") ?? "-") now, not what the reconcile record says; run reconcile google again"))
                }
                fetched = true
            }
            if !purchaseFetched {
                input.api = StoreAPIData(purchase: try await fetchPurchase(notification, app: app))
                purchaseFetched = true
            }
            var step = mapping.step(input, prior: current)
            guard step.result.state != nil || !step.result.events.isEmpty else { return [] }
            var transferFrom: String?
            if var purchaser = notification.purchaser, var next = step.next {
                // One app's hand-over never binds another app's subscription (two apps on one Stripe account).
                if let current, current.applicationId != app.applicationId {
                    throw .rejected(Rejection(.unknownApp, "the purchase is a subscription of application \(current.applicationId), not of app \(app.key)"))
                }
                // A web purchase's id is no secret: the user its store names keeps it, whatever the policy.
                if notification.store == .stripe || notification.store == .paddle, step.result.appUserId != nil {
                    purchaser.transferPolicy = RelayConfiguration.TransferPolicy.keep.rawValue
                }
                (step.binding, transferFrom) = try await bind(purchaser, prior: current, next: &next, now: receivedAt, app: app)
                step.next = next
            }
            var others: [String] = []
            // The user's other subscriptions once this notification is applied: without the one it replaces.
            var othersAfter: [String] = []
            var appUser: AppUser?
            if let user = step.user {
                // The user an app linked the store's id to (an alias, a device id), with its other ids and
                // attributes: the events name that user and carry them.
                appUser = try await backend { () async throws(BackendError) in try await stateStore.appUser(user, applicationId: app.applicationId) }
                let active = try await backend { () async throws(BackendError) in
                    try await stateStore.otherActiveSubscriptions(appUserId: user, excluding: notification.store, originalTransactionId: subject)
                }
                others = active.flatMap { products.entitlements(of: $0) }
                othersAfter = active.filter { $0.store != notification.store || $0.originalTransactionId != step.result.replaces }
                    .flatMap { products.entitlements(of: $0) }
            }
            if let from = transferFrom {
                let user = try await backend { () async throws(BackendError) in try await stateStore.appUser(from, applicationId: app.applicationId) }
                let active = try await backend { () async throws(BackendError) in
                    try await stateStore.otherActiveSubscriptions(appUserId: from, excluding: notification.store, originalTransactionId: subject)
                }
                step.binding?.transferredFrom = .init(user: user, others: active.flatMap { products.entitlements(of: $0) })
            }
            let applied = mapping.finish(
                step, input: input, subject: subject, prior: current, others: others, othersAfter: othersAfter, appUser: appUser,
                mapping: products)
            guard let state = applied.write else { return applied.events() }
            let written = try await backend { () async throws(BackendError) in try await stateStore.write(state, ifMatch: current?.version ?? 0) }
            switch written {
            case .written:
                try await markReplaced(notification.store, applied)
                return applied.events()
            case .versionMismatch, .stale:
                counters.writeConflicts.increment()
                continue
            }
        }
        throw .unavailable("subscription \(notification.store.rawValue)/\(subject) kept changing under 10 attempts")
    }

    /// Binds the subscription a purchase handed over leads to (`PurchaseBinding`): whether the user who
    /// holds it is the purchaser's user is decided by their ids (an alias of the same user is the user).
    /// Returns the binding and, for a transfer, the id of the user who held it.
    private func bind(
        _ purchaser: AppPurchase.Purchaser, prior: SubscriptionState?, next: inout SubscriptionState, now: Int64, app: RelayConfiguration.App
    ) async throws(NormalizationError) -> (PurchaseBinding, String?) {
        var sameUser = true
        if let holder = AppPurchase.holder(of: next), !AppPurchase.sameId(holder, purchaser.appUserId) {
            let held = try await backend { () async throws(BackendError) in try await stateStore.appUser(holder, applicationId: app.applicationId) }
            let buyer = try await backend { () async throws(BackendError) in
                try await stateStore.appUser(purchaser.appUserId, applicationId: app.applicationId)
            }
            sameUser = held.appUserId == buyer.appUserId
        }
        return PurchaseBinding.decide(purchaser: purchaser, prior: prior, next: &next, now: now, sameUser: sameUser)
    }

    /// A backend call whose failure means "try the record again later".
    func backend<Value>(_ body: () async throws(BackendError) -> Value) async throws(NormalizationError) -> Value {
        do {
            return try await body()
        } catch {
            throw .unavailable("\(error)")
        }
    }

    // MARK: Google Play Developer API

    private func fetchPlay(app: RelayConfiguration.App, notification: JSON, known: Bool) async throws(NormalizationError) -> StoreAPIData? {
        let fetch = GoogleMapping.fetch(for: notification)
        guard fetch != .none else { return nil }
        guard let client = play[app.key], let packageName = app.google?.packageName else {
            throw .rejected(Rejection(.storeAPIRejected, "app \(app.key) has no google.playApi configured; the subscription's state cannot be read"))
        }
        switch fetch {
        case .none:
            return nil
        case .subscription(let token):
            let purchase = try await playCall(app) { () async throws(StoreAPIError) in try await client.subscription(packageName: packageName, purchaseToken: token) }
            var data = StoreAPIData(subscription: purchase)
            if GoogleMapping.isPurchase(notification), let linked = purchase.text("linkedPurchaseToken") {
                if GoogleMapping.replacedProductId(purchase) == nil {
                    data.replacedProductId = try await replacedProduct(linked, client: client, packageName: packageName, app: app)
                }
                data.replacedOwner = try await backend { () async throws(BackendError) in
                    try await stateStore.subscription(store: .google, originalTransactionId: linked)
                }?.ownerAppUserId
            }
            // A token the relay has not seen may continue a subscription `import revenuecat` brought in, which the
            // export keys by its first order id (it carries no purchase token): the token takes it over.
            if !known, let base = GoogleMapping.firstOrderId(purchase), base != token,
                let imported = try await backend({ () async throws(BackendError) in try await stateStore.subscription(store: .google, originalTransactionId: base) })
            {
                // Only what the takeover reads: its key, its users and its payments.
                data.imported = SubscriptionState(
                    store: .google, originalTransactionId: imported.originalTransactionId, applicationId: imported.applicationId,
                    originalAppUserId: imported.originalAppUserId, productId: imported.productId, status: imported.status, environment: imported.environment,
                    sourceTimestamp: imported.sourceTimestamp, transactions: imported.transactions, ownerAppUserId: imported.ownerAppUserId
                ).json
            }
            return data
        case .product(let productId, let token):
            return StoreAPIData(
                product: try await playCall(app) { () async throws(StoreAPIError) in
                    try await client.product(packageName: packageName, productId: productId, purchaseToken: token)
                })
        }
    }

    /// Acknowledges a new purchase Play still holds unacknowledged (`playApi.acknowledgePurchases`), once
    /// its state is stored: a subscription's purchase (SUBSCRIPTION_PURCHASED, also an app's hand-over) or a
    /// one-time product's, when it gives access (an active or grace-period subscription, a purchased
    /// product) and a user has it: a purchase nobody has is left to Play's automatic refund.
    ///
    /// It reads the purchase fresh first, because Play refuses a second acknowledgement and a repeat of the
    /// record must not fail on it; a refusal is read again (acknowledged meanwhile is done). Only a Play
    /// API that cannot be reached makes the record be tried again; a refusal (permissions, a state Play
    /// will not acknowledge) is logged and counted, and the record goes on: its state and events are
    /// already stored, and an acknowledgement is no reason to hold up the partition.
    private func acknowledge(_ notification: VerifiedNotification, app: RelayConfiguration.App) async throws(NormalizationError) {
        guard let client = play[app.key], let packageName = app.google?.packageName else { return }
        let subscription: Bool
        let token: String
        var productId: String?
        switch GoogleMapping.fetch(for: notification.payload) {
        case .subscription(let purchaseToken) where GoogleMapping.isPurchase(notification.payload):
            (subscription, token) = (true, purchaseToken)
        case .product(let product, let purchaseToken):
            (subscription, token, productId) = (false, purchaseToken, product)
        default:
            return
        }
        let state = try await backend { () async throws(BackendError) in try await stateStore.subscription(store: .google, originalTransactionId: token) }
        guard let state, AppPurchase.holder(of: state) != nil else { return }
        func refused(_ error: StoreAPIError) throws(NormalizationError) {
            counters.storeAPIError(error)
            if error.kind == .unavailable { throw .unavailable(error.message) }
            logger.error(
                "Play did not let the relay acknowledge a purchase; the app must acknowledge it within three days",
                metadata: [LogKey.notificationApp: "\(app.key)", LogKey.notificationId: "\(notification.notificationId ?? "-")", LogKey.error: "\(error)"])
        }
        func pending() async throws(NormalizationError) -> String? {
            let purchase: JSON
            do {
                purchase = subscription
                    ? try await client.subscription(packageName: packageName, purchaseToken: token)
                    : try await client.product(packageName: packageName, productId: productId ?? "", purchaseToken: token)
            } catch {
                if error.kind != .notFound { try refused(error) }
                return nil
            }
            if subscription {
                let givesAccess = ["SUBSCRIPTION_STATE_ACTIVE", "SUBSCRIPTION_STATE_IN_GRACE_PERIOD"].contains(purchase.text("subscriptionState") ?? "")
                guard givesAccess, purchase.text("acknowledgementState") == "ACKNOWLEDGEMENT_STATE_PENDING" else { return nil }
                // `purchases.subscriptions.acknowledge` names the subscription's product, not its base plan.
                return purchase["lineItems"]?.arrayValue?.first?.text("productId")
            }
            return purchase.integer("acknowledgementState") == 0 && purchase.integer("purchaseState") == 0 ? productId : nil
        }
        guard let product = try await pending() else { return }
        do {
            try await client.acknowledge(packageName: packageName, productId: product, purchaseToken: token, subscription: subscription)
            counters.acknowledged.increment()
        } catch {
            // Acknowledged meanwhile (by the app, or an earlier try whose answer was lost) is done.
            if try await pending() != nil { try refused(error) }
        }
    }

    /// Finds a re-ingested voided purchase in the Voided Purchases API under the app's package (within
    /// Google's 30 days, from a day before its voided time, at most 20 pages), or rejects the record
    /// (`purchase_not_found`). The notification is then what Google and the stored state say, not what the
    /// record says: the voided time and whether the refund was partial from Google's entry; the product type
    /// from the stored state, else the Play Developer API (a subscription, else a one-time product).
    private func confirmVoided(_ notification: VerifiedNotification, state: SubscriptionState?, app: RelayConfiguration.App)
        async throws(NormalizationError) -> VerifiedNotification
    {
        let voided = notification.payload["voidedPurchaseNotification"]
        guard let client = play[app.key], let packageName = app.google?.packageName else {
            throw .rejected(Rejection(.storeAPIRejected, "app \(app.key) has no google.playApi configured; the voided purchase cannot be confirmed"))
        }
        guard let order = voided?.text("orderId"), let token = voided?.text("purchaseToken"), let voidedAt = notification.payload.integer("eventTimeMillis")
        else {
            throw .rejected(Rejection(.malformed, "the voided purchase names no order, purchase token or time"))
        }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let start = max(voidedAt - 86_400_000, now - 30 * 86_400_000 + 60_000)
        // Google answers a refusal (a start it no longer lists) with 400: the record cannot be confirmed.
        func listed(_ body: () async throws(StoreAPIError) -> JSON) async throws(NormalizationError) -> JSON {
            do {
                return try await body()
            } catch {
                if error.kind == .unavailable { throw storeAPIFailure(error, app: app) ?? .unavailable(error.message) }
                counters.storeAPIError(error)
                throw .rejected(Rejection(.purchaseNotFound, "Google's Voided Purchases API did not answer for order \(order): \(error.message)"))
            }
        }
        var pageToken: String?
        var entry: JSON?
        for _ in 0..<20 where start < now {
            let page = try await listed { () async throws(StoreAPIError) in
                try await client.voidedPurchases(packageName: packageName, startTime: start, endTime: now, pageToken: pageToken)
            }
            entry = page["voidedPurchases"]?.arrayValue?.first { $0.text("orderId") == order && $0.text("purchaseToken") == token }
            pageToken = page["tokenPagination"]?.text("nextPageToken")
            if entry != nil || pageToken == nil { break }
        }
        guard let entry else {
            throw .rejected(Rejection(.purchaseNotFound, "Google's Voided Purchases API does not list order \(order) of this purchase"))
        }
        let productType: Int64
        if let state {
            productType = state.expiresAt == nil && !state.autoRenew ? 2 : 1
        } else {
            do {
                _ = try await client.subscription(packageName: packageName, purchaseToken: token)
                productType = 1
            } catch {
                guard error.kind == .notFound || error.status == 400 else { throw storeAPIFailure(error, app: app) ?? .unavailable(error.message) }
                productType = 2
            }
        }
        var confirmed = notification
        let voidedTime = entry.integer("voidedTimeMillis") ?? voidedAt
        let quantity = entry["voidedQuantity"].map { !$0.isNull } ?? false
        confirmed.payload = [
            "version": "1.0", "packageName": .string(packageName), "eventTimeMillis": .string(String(voidedTime)),
            "voidedPurchaseNotification": [
                "purchaseToken": .string(token), "orderId": .string(order), "productType": .integer(productType), "refundType": .integer(quantity ? 2 : 1),
            ],
        ]
        return confirmed
    }

    /// The product of the purchase a plan change replaced: its stored state's, else the Play Developer
    /// API's; nil when Google no longer knows it (the new purchase still counts).
    private func replacedProduct(_ token: String, client: any PlayPurchases, packageName: String, app: RelayConfiguration.App)
        async throws(NormalizationError) -> String?
    {
        let stored = try await backend { () async throws(BackendError) in try await stateStore.subscription(store: .google, originalTransactionId: token) }
        if let stored { return stored.productId }
        do {
            let purchase = try await playCall(app) { () async throws(StoreAPIError) in try await client.subscription(packageName: packageName, purchaseToken: token) }
            return GoogleMapping.productId(ofPurchase: purchase)
        } catch {
            if case .rejected(let rejection) = error, rejection.reason == .purchaseNotFound { return nil }
            throw error
        }
    }

    /// A Play Developer API call: a purchase Google does not know is rejected; anything else as `storeAPIFailure` says.
    private func playCall(_ app: RelayConfiguration.App, _ body: () async throws(StoreAPIError) -> JSON) async throws(NormalizationError) -> JSON {
        do {
            return try await body()
        } catch {
            throw storeAPIFailure(error, app: app) ?? .rejected(Rejection(.purchaseNotFound, error.message))
        }
    }

    /// One classification of store API failures for every store: nil when the store does not know the
    /// object (the caller decides what that means); our side (credentials, console permissions) or a broken
    /// answer is retried, in order, until fixed (rejecting would lose the notification's place in its
    /// subscription's history); an unreachable API is tried again later.
    func storeAPIFailure(_ error: StoreAPIError, app: RelayConfiguration.App) -> NormalizationError? {
        counters.storeAPIError(error)
        switch error.kind {
        case .notFound:
            return nil
        case .rejected, .configuration, .invalidResponse:
            logger.error(
                "the \(error.api.rawValue) refused the request; retrying until it is fixed",
                metadata: [LogKey.notificationApp: "\(app.key)", LogKey.error: "\(error)"])
            return .unavailable(error.message)
        case .unavailable:
            return .unavailable(error.message)
        }
    }

    // MARK: Purchases apps hand over (Stripe, Paddle)

    /// What the store's API answers for a Stripe or Paddle purchase an app handed over (its ids in the
    /// record): `{"subscription"}`, `{"checkoutSession"}` or `{"transaction", "subscription"?}`. A purchase the
    /// store does not know is rejected (`purchase_not_found`); an app without the API is rejected too.
    private func fetchPurchase(_ notification: VerifiedNotification, app: RelayConfiguration.App) async throws(NormalizationError) -> JSON {
        let record = notification.payload
        func call(_ body: () async throws(StoreAPIError) -> JSON) async throws(NormalizationError) -> JSON {
            do {
                return try await body()
            } catch {
                throw storeAPIFailure(error, app: app) ?? .rejected(Rejection(.purchaseNotFound, error.message))
            }
        }
        if notification.store == .stripe {
            guard let client = stripe[app.key] else {
                throw .rejected(Rejection(.storeAPIRejected, "app \(app.key) has no stripe.api configured; the purchase cannot be read"))
            }
            if let id = record.text("subscriptionId") {
                return ["subscription": try await call { () async throws(StoreAPIError) in try await client.subscription(id) }]
            }
            guard let id = record.text("checkoutSessionId") else { throw .rejected(Rejection(.malformed, "the purchase names no Stripe object")) }
            let session = try await call { () async throws(StoreAPIError) in try await client.checkoutSession(id) }
            if session.text("mode") == "subscription", let subscriptionId = session.text("subscription") ?? session["subscription"]?.text("id") {
                return ["subscription": try await call { () async throws(StoreAPIError) in try await client.subscription(subscriptionId) }]
            }
            return ["checkoutSession": HandedOverPurchase.trimmedSession(session)]
        }
        guard let client = paddle[app.key] else {
            throw .rejected(Rejection(.storeAPIRejected, "app \(app.key) has no paddle.api configured; the purchase cannot be read"))
        }
        guard let id = record.text("transactionId") else { throw .rejected(Rejection(.malformed, "the purchase names no Paddle transaction")) }
        let transaction = HandedOverPurchase.trimmedTransaction(try await call { () async throws(StoreAPIError) in try await client.transaction(id) })
        guard let subscriptionId = transaction.text("subscription_id") else { return ["transaction": transaction] }
        return [
            "transaction": transaction, "subscription": try await call { () async throws(StoreAPIError) in try await client.subscription(subscriptionId) },
        ]
    }

    // MARK: Stripe API

    /// The event `recover stripe` named, read from Stripe's API with the app's key, as the notification
    /// its webhook would have been. Stripe not knowing it (for this key) rejects the record.
    private func stripeEvent(_ id: String, _ notification: VerifiedNotification, app: RelayConfiguration.App) async throws(NormalizationError)
        -> VerifiedNotification
    {
        guard let client = stripe[app.key] else {
            throw .rejected(Rejection(.storeAPIRejected, "app \(app.key) has no stripe.api configured; the re-ingested event cannot be read"))
        }
        let event: JSON
        do {
            event = try await client.event(id)
        } catch {
            throw storeAPIFailure(error, app: app) ?? .rejected(Rejection(.purchaseNotFound, error.message))
        }
        guard event["id"]?.stringValue == id else { throw .rejected(Rejection(.malformed, "Stripe answered another event for \(id)")) }
        var verified = VerifiedNotification(
            store: .stripe, app: notification.app, payload: event, notificationId: id, type: event["type"]?.stringValue,
            environment: event["livemode"]?.boolValue.map { $0 ? "PRODUCTION" : "SANDBOX" })
        verified.stripeEventId = nil
        return verified
    }

    /// The object `reconcile` or `import` named (`VerifiedNotification.reconcileObject`), read from the
    /// store's API with the app's key, as the event the store would have sent for it: a Stripe subscription,
    /// paid invoice or refunded charge (`StripeMapping.storeObjectEvent`), a Paddle subscription or completed
    /// transaction (`PaddleMapping.storeObjectEvent`), with the refunded charge's trimmed answer for the refund
    /// mapping. The store not knowing it (for this key), or an object of another subscription or not in the
    /// state its record says (an unpaid invoice), rejects the record.
    private func storeObject(_ id: String, _ notification: VerifiedNotification, prior: SubscriptionState?, app: RelayConfiguration.App)
        async throws(NormalizationError) -> (VerifiedNotification, charge: JSON?)
    {
        let subject = notification.payload.text("subject")
        let kind = notification.payload.text("import")
        func read(id wanted: String? = nil, _ call: () async throws(StoreAPIError) -> JSON) async throws(NormalizationError) -> JSON {
            let object: JSON
            do {
                object = try await call()
            } catch {
                throw storeAPIFailure(error, app: app) ?? .rejected(Rejection(.purchaseNotFound, error.message))
            }
            let wanted = wanted ?? id
            guard object["id"]?.stringValue == wanted else { throw .rejected(Rejection(.malformed, "the store answered another object for \(wanted)")) }
            return object
        }
        var firstInvoice: JSON?
        func refuse(_ what: String) -> NormalizationError { .rejected(Rejection(.malformed, "\(id) is not \(what) of \(subject ?? "-")")) }
        let event: JSON
        var charge: JSON?
        var environment: String?
        if notification.store == .paddle {
            guard let client = paddle[app.key] else {
                throw .rejected(Rejection(.storeAPIRejected, "app \(app.key) has no paddle.api configured; \(id) cannot be read"))
            }
            if id.hasPrefix("txn_") {
                let transaction = try await read { () async throws(StoreAPIError) in try await client.transaction(id) }
                guard transaction.text("subscription_id") == subject, transaction.text("status") == "completed" else { throw refuse("a completed transaction") }
                event = PaddleMapping.storeObjectEvent(HandedOverPurchase.trimmedTransaction(transaction), prior: prior, id: notification.notificationId ?? id, kind: kind)
            } else if id.hasPrefix("adj_") {
                let adjustment = try await read { () async throws(StoreAPIError) in try await client.adjustment(id) }
                guard adjustment.text("subscription_id") == subject, adjustment.text("status") == "approved" else { throw refuse("an approved adjustment") }
                event = PaddleMapping.storeObjectEvent(PaddleMapping.trimmedAdjustment(adjustment), prior: prior, id: notification.notificationId ?? id, kind: kind)
            } else {
                guard id == subject else { throw refuse("the subscription") }
                let subscription = try await read { () async throws(StoreAPIError) in try await client.subscription(id) }
                event = PaddleMapping.storeObjectEvent(subscription, prior: prior, id: notification.notificationId ?? id, kind: kind)
            }
        } else {
            guard let client = stripe[app.key] else {
                throw .rejected(Rejection(.storeAPIRejected, "app \(app.key) has no stripe.api configured; \(id) cannot be read"))
            }
            let object: JSON
            if id.hasPrefix("in_") {
                object = try await read { () async throws(StoreAPIError) in try await client.invoice(id) }
                guard (object.text("subscription") ?? object["subscription"]?.text("id")) == subject, object.text("status") == "paid" else {
                    throw refuse("a paid invoice")
                }
            } else if id.hasPrefix("ch_") {
                object = try await read { () async throws(StoreAPIError) in try await client.charge(id) }
                let invoice = object.present("invoice")
                guard (invoice?.text("subscription") ?? invoice?["subscription"]?.text("id")) == subject, (object.integer("amount_refunded") ?? 0) > 0 else {
                    throw refuse("a refunded charge")
                }
                charge = StripeMapping.trimmedCharge(object)
            } else {
                guard id == subject else { throw refuse("the subscription") }
                object = try await read { () async throws(StoreAPIError) in try await client.subscription(id) }
                // An imported purchase is its first invoice's payment, for that invoice's period.
                if kind == "created", let first = notification.payload.text("firstInvoice") {
                    let invoice = try await read(id: first) { () async throws(StoreAPIError) in try await client.invoice(first) }
                    guard (invoice.text("subscription") ?? invoice["subscription"]?.text("id")) == subject else { throw refuse("the first invoice") }
                    firstInvoice = invoice
                }
            }
            event = StripeMapping.storeObjectEvent(object, prior: prior, id: notification.notificationId ?? id, kind: kind, firstInvoice: firstInvoice)
            environment = object["livemode"]?.boolValue.map { $0 ? "PRODUCTION" : "SANDBOX" }
        }
        var verified = VerifiedNotification(
            store: notification.store, app: notification.app, payload: event, notificationId: notification.notificationId,
            type: event["type"]?.stringValue ?? event["event_type"]?.stringValue, environment: environment)
        verified.reconcileObject = nil
        return (verified, charge)
    }

    /// The refunded charge with its invoice; nil when Stripe does not know it (the refund then stands alone).
    private func fetchCharge(_ id: String, client: any StripeCharges, app: RelayConfiguration.App) async throws(NormalizationError) -> JSON? {
        do {
            return try await client.charge(id)
        } catch {
            if let failure = storeAPIFailure(error, app: app) { throw failure }
            return nil
        }
    }
}

extension EventDraft {
    /// Whether money moves with this event: a purchase, a renewal, a refund or its reversal. Other events
    /// (a product_change too, as Superwall documents: the purchase or renewal beside it carries the money)
    /// carry a price of 0; a money event whose amount the store does not report carries null.
    var movesMoney: Bool {
        switch type {
        case .initialPurchase, .renewal, .nonRenewingPurchase, .refundReversed: true
        case .cancellation: cancelReason == Reason.customerSupport
        default: false
        }
    }
}

/// The normalizer's metrics, each made once (the event builder counts events and missing rates).
struct NormalizerCounters: Sendable {
    let unmapped: LabeledCounters
    let writeConflicts: LabeledCounters
    let events: LabeledCounters
    let exchangeRateMissing: LabeledCounters
    let playAPIErrors: LabeledCounters
    let stripeAPIErrors: LabeledCounters
    let paddleAPIErrors: LabeledCounters
    /// `relay_play_purchases_acknowledged_total`: purchases the relay acknowledged (`playApi.acknowledgePurchases`).
    let acknowledged: LabeledCounters

    init(_ factory: any MetricsFactory) {
        unmapped = LabeledCounters(label: "relay_notifications_unmapped_total", factory: factory)
        writeConflicts = LabeledCounters(label: "relay_backend_write_conflicts_total", factory: factory)
        events = LabeledCounters(label: "relay_events_total", factory: factory)
        exchangeRateMissing = LabeledCounters(label: "relay_exchange_rate_missing_total", factory: factory)
        playAPIErrors = LabeledCounters(label: "relay_play_api_errors_total", factory: factory)
        stripeAPIErrors = LabeledCounters(label: "relay_stripe_api_errors_total", factory: factory)
        paddleAPIErrors = LabeledCounters(label: "relay_paddle_api_errors_total", factory: factory)
        acknowledged = LabeledCounters(label: "relay_play_purchases_acknowledged_total", factory: factory)
    }

    /// Counts a store API failure under its API's metric.
    func storeAPIError(_ error: StoreAPIError) {
        switch error.api {
        case .play: playAPIErrors.increment([("kind", error.kind.rawValue)])
        case .stripe: stripeAPIErrors.increment([("kind", error.kind.rawValue)])
        case .paddle: paddleAPIErrors.increment([("kind", error.kind.rawValue)])
        case .appStore: break
        }
    }
}
