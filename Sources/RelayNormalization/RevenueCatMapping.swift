import Foundation
import RelayCore

/// A moment of a RevenueCat export's transaction (`RevenueCatRecord`, `import revenuecat`) → state and the
/// event of that moment, for the transaction's store (App Store, Play Store, Stripe), keyed by its
/// `original_store_transaction_id`:
///
/// - `purchase`: `initial_purchase` (renewal number 1), `renewal` (a trial's conversion flagged), or
///   `non_renewing_purchase` (not auto-renewable), with its price; the state active until its end;
/// - `billing_issue`: `billing_issue`; in grace period until its end, else in billing retry;
/// - `unsubscribe`: `cancellation` (UNSUBSCRIBE), renewal off;
/// - `refund`: `cancellation` (CUSTOMER_SUPPORT) with the price taken back; the latest payment refunded
///   ends access (status REFUNDED);
/// - `expiration`: `expiration`, for a subscription that ended, with the reason the export implies.
///
/// A payment the relay recorded already (from the store, or an earlier import) is counted once: the
/// normalizer drops a repeated payment of the same transaction and kind.
enum RevenueCatMapping {
    static func map(_ input: MappingInput, prior: SubscriptionState?) -> StoreMapping {
        guard let record = RevenueCatRecord(json: input.notification.payload) else {
            var mapping = StoreMapping(subject: nil, environment: "PRODUCTION", eventTime: input.receivedAt)
            mapping.malformed = "the RevenueCat record lacks its kind, transaction ids, product or times"
            return mapping
        }
        let environment = record.sandbox ? "SANDBOX" : "PRODUCTION"
        var mapping = StoreMapping(subject: record.originalTransactionId, environment: environment, eventTime: record.at)
        mapping.appUserId = record.appUserId ?? prior?.originalAppUserId
        let periodType: SubscriptionState.PeriodType = record.trial ? .trial : record.intro ? .intro : record.offer != nil ? .promotional : .normal
        var state = prior ?? SubscriptionState(
            store: input.notification.store, originalTransactionId: record.originalTransactionId, applicationId: input.app.applicationId,
            originalAppUserId: mapping.appUserId, productId: record.productId, status: .active, periodType: periodType, autoRenew: record.autoRenewable,
            expiresAt: record.expiresAt, environment: environment, lastTransactionId: record.transactionId, sourceTimestamp: record.at)
        state.originalAppUserId = mapping.appUserId
        state.sourceTimestamp = max(state.sourceTimestamp, record.at)
        let amount = record.price.flatMap { Decimal(string: $0) }.map { Amount($0, (record.currency ?? "USD").uppercased()) }
        var draft = EventDraft(
            type: .renewal, periodType: periodType, productId: record.productId, transactionId: record.transactionId, purchasedAt: record.purchasedAt,
            expirationAt: record.expiresAt, offerCode: record.offer, countryCode: record.country, amount: amount,
            taxPercentage: record.taxPercentage.flatMap { Decimal(string: $0) })
        switch record.kind {
        case .purchase:
            state.productId = record.productId
            state.periodType = periodType
            state.lastTransactionId = record.transactionId
            state.status = .active
            state.gracePeriodExpiresAt = nil
            state.autoRenew = record.autoRenewable
            if record.autoRenewable {
                if let end = record.expiresAt { state.expiresAt = max(end, state.expiresAt ?? end) }
                if record.renewalNumber ?? (prior == nil ? 1 : 2) <= 1 {
                    draft.type = .initialPurchase
                    draft.sdkEvents = SDKEvent.purchase(periodType)
                } else {
                    draft.isTrialConversion = record.trialConversion
                }
            } else {
                draft.type = .nonRenewingPurchase
                draft.expirationAt = nil
                draft.sdkEvents = [SDKEvent.transactionComplete, SDKEvent.nonRecurringProductPurchase]
                state.expiresAt = nil
            }
        case .billingIssue:
            let grace = record.gracePeriodEndsAt.flatMap { $0 > record.at ? $0 : nil }
            state.status = grace != nil ? .inGracePeriod : .inBillingRetry
            state.gracePeriodExpiresAt = grace
            draft.type = .billingIssue
            draft.gracePeriodExpiresAt = grace
            draft.amount = nil
        case .unsubscribe:
            guard state.autoRenew, record.autoRenewable else { return mapping }
            state.autoRenew = false
            draft.type = .cancellation
            draft.cancelReason = Reason.unsubscribe
            draft.amount = nil
        case .refund:
            draft.type = .cancellation
            draft.cancelReason = Reason.customerSupport
            draft.amount = amount?.negated
            // A refunded latest payment ends access, as the stores revoke it; an older one's refund does not.
            if state.lastTransactionId == record.transactionId {
                state.status = .refunded
                state.autoRenew = false
            }
        case .expiration:
            guard [.active, .inGracePeriod, .inBillingRetry, .paused].contains(state.status) else { return mapping }
            state.status = .expired
            state.autoRenew = false
            state.gracePeriodExpiresAt = nil
            draft.type = .expiration
            draft.expirationReason = record.expirationReason.flatMap(Reason.init(rawValue:)) ?? Reason.unknown
            draft.amount = nil
        }
        mapping.events = [draft]
        mapping.state = state
        return mapping
    }
}
