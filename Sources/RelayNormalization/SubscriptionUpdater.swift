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
    let apps: [String: RelayConfiguration.App]
    let stateStore: any SubscriptionStateStore
    let mapping: NotificationMapping
    let play: [String: any PlayPurchases]
    let stripe: [String: any StripeCharges]
    let paddle: [String: any PaddleReads]
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

    func apply(_ notification: VerifiedNotification, receivedAt: Int64) async throws(NormalizationError) -> [StandardEvent] {
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
        // The user the events will likely need (the one the notification names; else the store reads the stored
        // state's), read with the state where the store can: one read instead of two for most notifications.
        let likelyUser = first.state?.entitledUser
        for _ in 0..<10 {
            let (current, readAhead) = try await backend { () async throws(BackendError) in
                try await stateStore.subscriptionReadingAhead(
                    store: notification.store, originalTransactionId: subject, likelyUser: likelyUser, applicationId: app.applicationId)
            }
            if let id = notification.notificationId, let recent = current?.recentNotifications.last(where: { $0.id == id }),
                let context = AppliedContext(recent.context)
            {
                let applied = mapping.replay(input, recorded: context, subject: subject, mapping: products)
                try await markReplaced(notification.store, applied)
                return applied.events()
            }
            // Whether this pass called a store's API: the user read ahead is then older than that call, and is
            // read again after it, as it always was.
            var calledStore = false
            if !stripeFetched, let eventId = notification.stripeEventId {
                calledStore = true
                notification = try await stripeEvent(eventId, notification, app: app)
                input.notification = notification
                stripeFetched = true
            }
            if !reconciled, let object = notification.reconcileObject {
                calledStore = true
                let charge: JSON?
                (notification, charge) = try await storeObject(object, notification, prior: current, app: app)
                input.notification = notification
                if let charge { input.api = StoreAPIData(charge: charge) }
                reconciled = true
            }
            if !voidedConfirmed {
                calledStore = true
                notification = try await confirmVoided(notification, state: current, app: app)
                input.notification = notification
                voidedConfirmed = true
            }
            if !fetched {
                calledStore = true
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
                calledStore = true
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
                let read: (user: AppUser, active: [SubscriptionState])
                if let readAhead, readAhead.id == user, !calledStore {
                    read = (readAhead.user, readAhead.active)
                } else {
                    read = try await backend { () async throws(BackendError) in
                        try await stateStore.appUserAndOtherActiveSubscriptions(
                            user, applicationId: app.applicationId, excluding: notification.store, originalTransactionId: subject)
                    }
                }
                appUser = read.user
                let active = read.active
                others = active.flatMap { products.entitlements(of: $0) }
                othersAfter = active.filter { $0.store != notification.store || $0.originalTransactionId != step.result.replaces }
                    .flatMap { products.entitlements(of: $0) }
            }
            if let from = transferFrom {
                let (user, active) = try await backend { () async throws(BackendError) in
                    try await stateStore.appUserAndOtherActiveSubscriptions(
                        from, applicationId: app.applicationId, excluding: notification.store, originalTransactionId: subject)
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
    func bind(
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
}
