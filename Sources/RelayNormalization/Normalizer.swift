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

/// Verified store notifications → standardized events (docs/contracts.md, the standardized event), with the subscription's
/// state kept in the backend:
///
/// 1. Google: fetch the subscription's real state from the Play Developer API.
/// 2. Map the notification with the store's table (`AppleMapping`, `GoogleMapping`, `StripeMapping`,
///    `PaddleMapping`) against the stored state.
/// 3. Write the new state with If-Match (a 412 reads and maps again); a notification older than the
///    stored state leaves it as it is (`sourceTimestamp` never goes back) but still yields its events.
/// 4. The user's `subscriptionStatus` before and after (this subscription plus the user's other active
///    ones, through the product mapping); `subscription_status_did_change` when it differs.
///
/// A notification id already in the state's `recentNotifications` changes nothing and yields the same
/// events as the first time, from what was recorded then.
public final class Normalizer: Sendable {
    /// How many applied notification ids a state remembers.
    public static let recentNotificationLimit = 16

    private let apps: [String: RelayConfiguration.App]
    let stateStore: any SubscriptionStateStore
    private let events: EventBuilder
    private let play: [String: any PlayPurchases]
    private let stripe: [String: any StripeCharges]
    let logger: Logger
    let counters: NormalizerCounters

    /// The normalizer of `configuration`'s apps and `money` section.
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
        self.events = EventBuilder(money: money, rates: try ExchangeRates.load(path: money.exchangeRates), counters: counters, logger: logger)
        self.play = storeAPIs.play
        self.stripe = storeAPIs.stripe
        self.logger = logger
        self.counters = counters
    }

    /// The standardized events of one verified notification; `receivedAt` is its `relay-received-at`.
    public func normalize(_ notification: VerifiedNotification, receivedAt: Int64) async throws(NormalizationError) -> [StandardEvent] {
        guard let app = apps[notification.app] else { return [] }
        var input = MappingInput(notification: notification, app: app, receivedAt: receivedAt, api: nil)

        // Google's subject (the purchase token) is in the notification; its Play data is fetched only
        // after the dedup check below, so a repeat replays what was recorded without calling Google.
        let first = map(input, prior: nil)
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
        let mapping = try await backend { () async throws(BackendError) in try await stateStore.productMapping(applicationId: app.applicationId) }
        guard var subject = first.subject else {
            return events.build(first, input: input, subject: nil, prior: nil, after: nil, others: [], mapping: mapping)
        }
        // A Stripe refund names its charge, not the subscription it paid for: unless the charge is a one-time
        // purchase the relay keys by its PaymentIntent, Stripe's API says which subscription (when configured).
        if let charge = StripeMapping.refundedChargeId(notification.payload), let client = stripe[app.key] {
            let purchase = try await backend { () async throws(BackendError) in
                try await stateStore.subscription(store: .stripe, originalTransactionId: subject)
            }
            if purchase == nil {
                input.api = StoreAPIData(charge: StripeMapping.trimmedCharge(try await fetchCharge(charge, client: client, app: app)))
                subject = map(input, prior: nil).subject ?? subject
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
                // Seen before: the same events, from what was recorded when it was applied.
                var replay = input
                replay.receivedAt = context.receivedAt
                replay.api = context.api
                let again = mapAgainst(replay, prior: context.prior)
                let after = merge(context.prior, again) ?? context.prior
                // A crash may have come between this state's write and the replaced one's: done again, once.
                if let replaced = again.replaces, let after, Self.beginsAccess(prior: context.prior, after: after) {
                    try await markReplaced(store: notification.store, replaced, by: after, productId: again.replacedProductId, at: again.eventTime)
                }
                return events.build(
                    again, input: replay, subject: subject, prior: context.prior, after: after, others: context.others,
                    othersAfter: context.othersAfter, sequence: context.sequence, mapping: mapping)
            }
            if !fetched {
                input.api = try await fetchPlay(app: app, notification: notification.payload)
                fetched = true
            }
            let result = mapAgainst(input, prior: current)
            guard result.state != nil || !result.events.isEmpty else { return [] }
            var next = merge(current, result)
            let user = (next ?? current)?.entitlementUserIds.first
            var others: [String] = []
            // The user's other subscriptions once this notification is applied: without the one it replaces.
            var othersAfter: [String] = []
            if let user, !user.hasPrefix("$RelayAnonymous:") {
                let active = try await backend { () async throws(BackendError) in
                    try await stateStore.otherActiveSubscriptions(appUserId: user, excluding: notification.store, originalTransactionId: subject)
                }
                others = active.flatMap { mapping.entitlements(of: $0) }
                othersAfter = active.filter { $0.store != notification.store || $0.originalTransactionId != result.replaces }
                    .flatMap { mapping.entitlements(of: $0) }
            }
            // A notification with events but no state change is still remembered in a stored state,
            // so that a repeat yields these events rather than ones built from a later state; its payments
            // are recorded there (a late Paddle charge), for a later refund to find.
            if next == nil, var state = current, notification.notificationId != nil, !result.events.isEmpty {
                Self.record(payments: result.events, in: &state)
                next = state
            }
            // The lapse marker: cleared when access is back, set by the lapse's expiration.
            if var state = next {
                if state.grantsAccess {
                    state.expirationSent = false
                } else if result.events.contains(where: { $0.type == .expiration }) {
                    state.expirationSent = true
                }
                next = state
            }
            guard var state = next else {
                return events.build(
                    result, input: input, subject: subject, prior: current, after: current, others: others, othersAfter: othersAfter, mapping: mapping)
            }
            if let id = notification.notificationId {
                let context = AppliedContext(
                    receivedAt: receivedAt, prior: current, others: others, othersAfter: othersAfter, api: input.api,
                    transactionsRead: result.transactionsRead, sequence: (current?.version ?? 0) + 1)
                state.recentNotifications.append(.init(id: id, context: context.json))
                state.recentNotifications = Array(state.recentNotifications.suffix(Self.recentNotificationLimit))
            }
            let written = try await backend { () async throws(BackendError) in try await stateStore.write(state, ifMatch: current?.version ?? 0) }
            switch written {
            case .written:
                if let replaced = result.replaces, Self.beginsAccess(prior: current, after: state) {
                    try await markReplaced(store: notification.store, replaced, by: state, productId: result.replacedProductId, at: result.eventTime)
                }
                // The version this write gave the state: the subscription's sequence number.
                return events.build(
                    result, input: input, subject: subject, prior: current, after: state, others: others, othersAfter: othersAfter,
                    sequence: (current?.version ?? 0) + 1, mapping: mapping)
            case .versionMismatch, .stale:
                counters.writeConflicts.increment()
                continue
            }
        }
        throw .unavailable("subscription \(notification.store.rawValue)/\(subject) kept changing under 10 attempts")
    }

    /// A backend call whose failure means "try the record again later".
    func backend<Value>(_ body: () async throws(BackendError) -> Value) async throws(NormalizationError) -> Value {
        do {
            return try await body()
        } catch {
            throw .unavailable("\(error)")
        }
    }

    // MARK: Mapping and state

    private func map(_ input: MappingInput, prior: SubscriptionState?) -> StoreMapping {
        switch input.notification.store {
        case .apple:
            // A grandfathering grant from the local backend, else an App Store notification.
            input.notification.type == AppTransactionGrant.notificationType
                ? AppTransactionMapping.map(input, prior: prior) : AppleMapping.map(input, prior: prior)
        case .google: GoogleMapping.map(input, prior: prior)
        case .stripe: StripeMapping.map(input, prior: prior)
        case .paddle: PaddleMapping.map(input, prior: prior, environment: input.app.paddle?.environment ?? "PRODUCTION")
        }
    }

    /// Maps against the stored state, unless the notification is older than it: what a late
    /// notification means cannot be read off a newer state (a late Paddle update diffed against it
    /// would invent a product change back), so it is mapped on its own, and `merge` keeps the newer state.
    ///
    /// One expiration per lapse: once an `expiration` went out for a lapse (`expirationSent`: an account
    /// hold, a pause, a grace period running out, a last failed payment, or the store's expiration), the
    /// store's later expiration of the same lapse sends none. A late notification's expiration is dropped
    /// when the stored, newer state has access again (that lapse is over) or its lapse already had one; its
    /// billing issue still counts (it happened).
    private func mapAgainst(_ input: MappingInput, prior: SubscriptionState?) -> StoreMapping {
        var input = input
        input.history = prior?.transactions ?? []
        var mapping = map(input, prior: prior)
        if let prior, mapping.eventTime < prior.sourceTimestamp {
            input.late = true
            mapping = map(input, prior: nil)
            if prior.grantsAccess || prior.expirationSent { mapping.events.removeAll { $0.type == .expiration } }
            Self.dropReplacedNews(prior, &mapping)
            return mapping
        }
        if prior?.expirationSent == true { mapping.events.removeAll { $0.type == .expiration } }
        Self.dropReplacedNews(prior, &mapping)
        return mapping
    }


    /// The state to store after `mapping`, or nil when nothing changes. An older notification leaves a
    /// newer stored state as it is.
    private func merge(_ current: SubscriptionState?, _ mapping: StoreMapping) -> SubscriptionState? {
        guard var state = mapping.state else { return nil }
        state.recentNotifications = current?.recentNotifications ?? []
        state.transactions = current?.transactions ?? []
        state.expirationSent = current?.expirationSent ?? false
        state.replacedBy = current?.replacedBy
        state.version = current?.version ?? 0
        if let current {
            if mapping.eventTime < current.sourceTimestamp {
                state = current
            } else {
                for id in current.appUserIds where !state.appUserIds.contains(id) { state.appUserIds.append(id) }
                if state.originalAppUserId == nil { state.originalAppUserId = current.originalAppUserId }
            }
        }
        Self.record(payments: mapping.events, in: &state)
        return state
    }

    /// How many payments a state remembers for later refunds: a year of monthly renewals.
    public static let transactionLimit = 12

    /// Adds the payments among `events` (purchases and renewals with a transaction id) to the state's
    /// recorded ones, once each, keeping the newest `transactionLimit`.
    static func record(payments events: [EventDraft], in state: inout SubscriptionState) {
        for draft in events where [.initialPurchase, .renewal, .nonRenewingPurchase].contains(draft.type) {
            guard let id = draft.transactionId, let productId = draft.productId, state.transaction(id) == nil else { continue }
            state.transactions.append(
                SubscriptionState.Transaction(
                    id: id, productId: productId, purchasedAt: draft.purchasedAt, periodType: draft.periodType,
                    amount: draft.amount.map { "\($0.value)" }, currency: draft.amount?.currency))
        }
        if state.transactions.count > transactionLimit { state.transactions = Array(state.transactions.suffix(transactionLimit)) }
    }

    // MARK: Google Play Developer API

    private func fetchPlay(app: RelayConfiguration.App, notification: JSON) async throws(NormalizationError) -> StoreAPIData? {
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
            if GoogleMapping.isPurchase(notification), let linked = purchase.text("linkedPurchaseToken"), GoogleMapping.replacedProductId(purchase) == nil {
                data.replacedProductId = try await replacedProduct(linked, client: client, packageName: packageName, app: app)
            }
            return data
        case .product(let productId, let token):
            return StoreAPIData(
                product: try await playCall(app) { () async throws(StoreAPIError) in
                    try await client.product(packageName: packageName, productId: productId, purchaseToken: token)
                })
        }
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

    /// A Play Developer API call, its failure classified: an unknown purchase is rejected; anything else
    /// is tried again later.
    private func playCall(_ app: RelayConfiguration.App, _ body: () async throws(StoreAPIError) -> JSON) async throws(NormalizationError) -> JSON {
        do {
            return try await body()
        } catch {
            counters.playAPIErrors.increment([("kind", error.kind.rawValue)])
            switch error.kind {
            case .notFound:
                throw .rejected(Rejection(.purchaseNotFound, error.message))
            case .rejected, .configuration, .invalidResponse:
                // Our side (credentials, Play Console permissions) or a broken answer: retried, in order,
                // until fixed; rejecting would lose the purchase's place in its subscription's history.
                logger.error(
                    "the Play Developer API refused the request; retrying until it is fixed",
                    metadata: [LogKey.notificationApp: "\(app.key)", LogKey.error: "\(error)"])
                throw .unavailable(error.message)
            case .unavailable:
                throw .unavailable(error.message)
            }
        }
    }

    // MARK: Stripe API

    /// The refunded charge with its invoice; nil when Stripe does not know it (the refund then stands alone).
    private func fetchCharge(_ id: String, client: any StripeCharges, app: RelayConfiguration.App) async throws(NormalizationError) -> JSON? {
        do {
            return try await client.charge(id)
        } catch {
            counters.stripeAPIErrors.increment([("kind", error.kind.rawValue)])
            switch error.kind {
            case .notFound:
                return nil
            case .rejected, .configuration, .invalidResponse:
                logger.error(
                    "the Stripe API refused the request; retrying until it is fixed",
                    metadata: [LogKey.notificationApp: "\(app.key)", LogKey.error: "\(error)"])
                throw .unavailable(error.message)
            case .unavailable:
                throw .unavailable(error.message)
            }
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

    init(_ factory: any MetricsFactory) {
        unmapped = LabeledCounters(label: "relay_notifications_unmapped_total", factory: factory)
        writeConflicts = LabeledCounters(label: "relay_backend_write_conflicts_total", factory: factory)
        events = LabeledCounters(label: "relay_events_total", factory: factory)
        exchangeRateMissing = LabeledCounters(label: "relay_exchange_rate_missing_total", factory: factory)
        playAPIErrors = LabeledCounters(label: "relay_play_api_errors_total", factory: factory)
        stripeAPIErrors = LabeledCounters(label: "relay_stripe_api_errors_total", factory: factory)
    }
}
