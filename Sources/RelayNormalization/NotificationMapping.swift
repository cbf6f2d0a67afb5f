import Foundation
import RelayConfig
import RelayCore

/// Normalization itself, with nothing read or written: one verified notification, its subscription's
/// prior state, the store's facts (`MappingInput.api`) and the entitlements of the user's other active
/// subscriptions in; the state to store and the standardized events out. The store tables
/// (`AppleMapping`, `GoogleMapping`, `StripeMapping`, `PaddleMapping`) say what a notification means;
/// this applies their answer to the stored state:
///
/// - a notification older than the stored state is mapped on its own and leaves the state as it is
///   (`sourceTimestamp` never goes back), but still yields its events;
/// - one expiration per lapse (`expirationSent`), and a replaced subscription's own cancellation or
///   expiration is no news (`dropReplacedNews`);
/// - the payments a state remembers, for later refunds;
/// - each applied notification id with what it was applied against (`AppliedContext`), so a repeat
///   yields exactly the events of the first time.
///
/// `SubscriptionUpdater` does the reading, the store API calls and the writes around it.
public struct NotificationMapping: Sendable {
    /// How many applied notification ids a state remembers.
    public static let recentNotificationLimit = 16
    /// How many payments a state remembers for later refunds: a year of monthly renewals.
    public static let transactionLimit = 12

    let events: EventBuilder

    /// The first half of applying a notification: what the store table makes of it against `prior`, and
    /// the state that leads to (nil: unchanged).
    struct Step {
        var result: StoreMapping
        var next: SubscriptionState?
        var prior: SubscriptionState?
        /// A purchase an app handed over: what it did to who has the subscription (`bind`).
        var binding: PurchaseBinding?
        /// The app user whose other subscriptions the events need: the new state's, else the stored one's
        /// (a refund changes no state but still says the user's status); nil when none, or anonymous.
        var user: String? {
            (next ?? prior)?.entitledUser
        }
    }

    /// What applying a notification yields: the state to write (nil: nothing), and its events, built
    /// (and counted in the metrics) only when asked: once the write succeeded, or when there is nothing
    /// to write, so a conflict or a failed write that is tried again counts nothing twice.
    struct Applied {
        var write: SubscriptionState?
        /// A plan change whose replaced subscription must be marked, once this state is stored.
        var replaces: (token: String, productId: String?, at: Int64, by: SubscriptionState)?
        private let build: () -> [StandardEvent]

        init(write: SubscriptionState?, build: @escaping () -> [StandardEvent]) {
            self.write = write
            self.build = build
        }

        func events() -> [StandardEvent] { build() }
    }

    func map(_ input: MappingInput, prior: SubscriptionState?) -> StoreMapping {
        var mapping = mapStore(input, prior: prior)
        // A payment the subscription has already recorded, named again by another notification (the
        // store's own after an app handed the purchase over, or the reverse; an import of what the live
        // pipeline saw), is not revenue twice: its state still applies, its money event does not. Looked
        // up through `recorded`, so that a repeat mapped against the state it saw drops it too.
        let payments: Set<EventType> = [.initialPurchase, .renewal, .nonRenewingPurchase]
        var repaid: Set<String> = []
        for draft in mapping.events where payments.contains(draft.type) {
            // The same payment: its id, and the same kind of event (else the same time). Play answers a late
            // purchase with the subscription's latest order, a renewal's, which is not the purchase's payment.
            guard let id = draft.transactionId, let paid = mapping.recorded(id, in: input.history) else { continue }
            let sameTime = draft.purchasedAt != nil && draft.purchasedAt == paid.purchasedAt
            guard paid.kind == draft.type.rawValue || sameTime else { continue }
            repaid.insert(id)
        }
        if !repaid.isEmpty { mapping.events.removeAll { payments.contains($0.type) && $0.transactionId.map(repaid.contains) == true } }
        return mapping
    }

    private func mapStore(_ input: MappingInput, prior: SubscriptionState?) -> StoreMapping {
        var input = input
        if HandedOverPurchase.readsStoreAPI(input.notification) {
            input.notification.payload = HandedOverPurchase.event(
                store: input.notification.store, purchase: input.api?.purchase, notificationId: input.notification.notificationId)
        }
        // A moment of a RevenueCat export's transaction (`import revenuecat`), in any store.
        if input.notification.type?.hasPrefix(RevenueCatRecord.typePrefix) == true { return RevenueCatMapping.map(input, prior: prior) }
        return switch input.notification.store {
        case .apple:
            // A grandfathering grant from the local backend, else an App Store notification.
            input.notification.type == AppTransactionGrant.notificationType
                ? AppTransactionMapping.map(input, prior: prior) : AppleMapping.map(input, prior: prior)
        case .google: GoogleMapping.map(input, prior: prior)
        case .stripe: StripeMapping.map(input, prior: prior)
        case .paddle: PaddleMapping.map(input, prior: prior, environment: input.app.paddle?.environment ?? "PRODUCTION")
        case .promotional: PromotionalMapping.map(input, prior: prior)
        }
    }

    /// A notification applied before (its id is in the state's `recentNotifications`): the same events,
    /// built from what was recorded when it was applied.
    func replay(_ input: MappingInput, recorded context: AppliedContext, subject: String, mapping: ProductMapping) -> Applied {
        var replay = input
        replay.receivedAt = context.receivedAt
        replay.api = context.api
        let again = mapAgainst(replay, prior: context.prior)
        var after = merge(context.prior, again) ?? context.prior
        if let purchaser = input.notification.purchaser, var state = after {
            // The binding as it was decided: a transfer recorded one, anything else the same user.
            _ = PurchaseBinding.decide(
                purchaser: purchaser, prior: context.prior, next: &state, now: context.receivedAt, sameUser: context.binding?.transferredFrom == nil)
            after = state
        }
        let events = self.events
        var applied = Applied(write: nil) {
            events.build(
                again, input: replay, subject: subject, prior: context.prior, after: after, others: context.others,
                othersAfter: context.othersAfter, sequence: context.sequence, appUser: context.appUser, binding: context.binding, mapping: mapping)
        }
        // A crash may have come between this state's write and the replaced one's: done again, once.
        if let replaced = again.replaces, let after, Self.beginsAccess(prior: context.prior, after: after) {
            applied.replaces = (replaced, again.replacedProductId, again.eventTime, after)
        }
        return applied
    }

    func step(_ input: MappingInput, prior: SubscriptionState?) -> Step {
        let result = mapAgainst(input, prior: prior)
        return Step(result: result, next: merge(prior, result), prior: prior)
    }

    /// The second half, given the entitlements of the user's other active subscriptions (`others`) and
    /// of those the notification leaves (`othersAfter`: without the one it replaces), and the app user the
    /// subscription's user id stands for (`appUser`: the one an app linked it to, with its ids and attributes).
    func finish(
        _ step: Step, input: MappingInput, subject: String, prior current: SubscriptionState?, others: [String], othersAfter: [String],
        appUser: AppUser? = nil, mapping: ProductMapping
    ) -> Applied {
        let result = step.result
        var next = step.next
        // A notification with events but no state change is still remembered in a stored state,
        // so that a repeat yields these events rather than ones built from a later state; its payments
        // are recorded there (a late Paddle charge), for a later refund to find.
        if next == nil, var state = current, input.notification.notificationId != nil, !result.events.isEmpty {
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
        let events = self.events
        guard var state = next else {
            return Applied(write: nil) {
                events.build(
                    result, input: input, subject: subject, prior: current, after: current, others: others, othersAfter: othersAfter,
                    appUser: appUser, binding: step.binding, mapping: mapping)
            }
        }
        // The version the write gives the state: the subscription's sequence number.
        let sequence = (current?.version ?? 0) + 1
        if let id = input.notification.notificationId {
            var context = AppliedContext(
                receivedAt: input.receivedAt, prior: current, others: others, othersAfter: othersAfter, api: input.api,
                transactionsRead: result.transactionsRead, sequence: sequence)
            context.appUser = appUser
            context.binding = step.binding
            state.recentNotifications.append(.init(id: id, context: context.json))
            state.recentNotifications = Array(state.recentNotifications.suffix(Self.recentNotificationLimit))
        }
        let written = state
        var applied = Applied(write: state) {
            events.build(
                result, input: input, subject: subject, prior: current, after: written, others: others, othersAfter: othersAfter,
                sequence: sequence, appUser: appUser, binding: step.binding, mapping: mapping)
        }
        // A plan change replaces the old token once the new one gives access; a token taking over an imported
        // subscription replaces it whatever its state (else the import would grant on its own).
        if let replaced = result.replaces, Self.beginsAccess(prior: current, after: state) || input.api?.imported != nil {
            applied.replaces = (replaced, result.replacedProductId, result.eventTime, state)
        }
        return applied
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
    func mapAgainst(_ input: MappingInput, prior: SubscriptionState?) -> StoreMapping {
        var input = input
        // A Play token taking over an imported subscription (`StoreAPIData.imported`): its payments count as seen.
        input.history = prior?.transactions ?? input.api?.imported.flatMap { try? SubscriptionState(json: $0) }?.transactions ?? []
        var mapping = map(input, prior: prior)
        if let prior, mapping.eventTime < prior.sourceTimestamp {
            input.late = true
            mapping = map(input, prior: nil)
            if prior.grantsAccess || prior.expirationSent { mapping.events.removeAll { $0.type == .expiration } }
            Self.dropReplacedNews(prior, &mapping)
            Self.keepHandOverNews(input, prior, &mapping)
            return mapping
        }
        if prior?.expirationSent == true { mapping.events.removeAll { $0.type == .expiration } }
        Self.dropReplacedNews(prior, &mapping)
        Self.keepHandOverNews(input, prior, &mapping)
        return mapping
    }

    /// What a purchase an app hands over may report: its payment, when the relay holds nothing of the
    /// subscription yet; nothing for a subscription the relay already holds (a restore, an app handing
    /// over again), whose news are the store's to report: the store's API answers a subscription as it is
    /// now (Stripe's latest invoice, Paddle's current state, Apple's latest transaction), not what changed.
    /// Never a refund or an expiration: the store's own notification reports those once, and a revoked
    /// transaction handed over twice must not count its refund twice. The status change, which follows
    /// from the states and the binding, still goes out.
    static func keepHandOverNews(_ input: MappingInput, _ prior: SubscriptionState?, _ mapping: inout StoreMapping) {
        guard input.notification.purchaser != nil else { return }
        guard prior == nil else {
            mapping.events.removeAll()
            return
        }
        mapping.events.removeAll { ![.initialPurchase, .renewal, .nonRenewingPurchase].contains($0.type) }
    }

    /// The state to store after `mapping`, or nil when nothing changes. An older notification leaves a
    /// newer stored state as it is.
    func merge(_ current: SubscriptionState?, _ mapping: StoreMapping) -> SubscriptionState? {
        guard var state = mapping.state else { return nil }
        state.recentNotifications = current?.recentNotifications ?? []
        state.transactions = current?.transactions ?? []
        state.expirationSent = current?.expirationSent ?? false
        state.replacedBy = current?.replacedBy
        // Who an app bound it to stays until a hand-over binds it again: store notifications never name it.
        state.ownerAppUserId = current?.ownerAppUserId ?? state.ownerAppUserId
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

    /// Adds the payments among `events` (purchases and renewals with a transaction id) to the state's
    /// recorded ones, once each, keeping the newest `transactionLimit`.
    static func record(payments events: [EventDraft], in state: inout SubscriptionState) {
        for draft in events where [.initialPurchase, .renewal, .nonRenewingPurchase].contains(draft.type) {
            guard let id = draft.transactionId, let productId = draft.productId, state.transaction(id) == nil else { continue }
            state.transactions.append(
                SubscriptionState.Transaction(
                    id: id, productId: productId, purchasedAt: draft.purchasedAt, periodType: draft.periodType,
                    amount: draft.amount.map { "\($0.value)" }, currency: draft.amount?.currency, kind: draft.type.rawValue))
        }
        if state.transactions.count > transactionLimit { state.transactions = Array(state.transactions.suffix(transactionLimit)) }
    }
}
