import Foundation
import RelayCore

/// Google plan changes: a purchase whose `linkedPurchaseToken` names another ends that one's access
/// (Android Developers, "Implementing linkedPurchaseToken correctly to prevent duplicate subscriptions").
extension NotificationMapping {
    /// Whether this write is the moment the replacing subscription starts giving access (its first state,
    /// or its first with access, as a pending purchase becomes paid): only then is the one it replaces
    /// marked, so a renewal of the new token costs no extra read of the old one.
    static func beginsAccess(prior: SubscriptionState?, after: SubscriptionState) -> Bool {
        after.grantsAccess && !(prior?.grantsAccess ?? false)
    }

    /// A replaced subscription's access already moved to the one that replaced it: its own later
    /// cancellation or expiration (Play's replacement cancellation, a hold, a revocation) is no news to
    /// customers, and an expiration would make receivers revoke the access the replacement carries. A
    /// refund of its payments still counts (a cancellation for CUSTOMER_SUPPORT, money back).
    static func dropReplacedNews(_ prior: SubscriptionState?, _ mapping: inout StoreMapping) {
        guard prior?.replacedBy != nil else { return }
        mapping.events.removeAll { event in
            event.type == .expiration || event.type == .billingIssue || (event.type == .cancellation && event.cancelReason != Reason.customerSupport)
        }
    }
}

extension SubscriptionUpdater {
    /// Marks the subscription an applied plan change replaced, if it names one.
    func markReplaced(_ store: Store, _ applied: NotificationMapping.Applied) async throws(NormalizationError) {
        guard let replaces = applied.replaces else { return }
        try await markReplaced(store: store, replaces.token, by: replaces.by, productId: replaces.productId, at: replaces.at)
    }

    /// Marks `token` replaced by `replacing` (idempotent): from now on it gives no access, and its own
    /// later cancellation or expiration sends nothing. A replaced subscription the relay never saw (it
    /// was bought before the relay ran, or its notifications come later) is recorded as an expired
    /// placeholder at source time 0, so its real notifications still apply and keep the mark.
    func markReplaced(store: Store, _ token: String, by replacing: SubscriptionState, productId: String?, at eventTime: Int64)
        async throws(NormalizationError)
    {
        for _ in 0..<10 {
            let current = try await backend { () async throws(BackendError) in try await stateStore.subscription(store: store, originalTransactionId: token) }
            if current?.replacedBy != nil { return }
            let marked: SubscriptionState
            if let current, Set(current.entitlementUserIds).isDisjoint(with: replacing.entitlementUserIds),
                current.originalAppUserId != nil || !current.appUserIds.isEmpty
            {
                // Another app user's purchase: taking its access away without a word to that user would be
                // worse than two subscriptions granting for a while. Logged; the store ends it later.
                logger.warning(
                    "a purchase links a subscription of another app user; the linked one is not marked replaced",
                    metadata: [LogKey.notificationStore: "\(store.rawValue)", "subscription": "\(token)"])
                return
            }
            if var current {
                current.replacedBy = replacing.originalTransactionId
                marked = current
            } else {
                marked = SubscriptionState(
                    store: store, originalTransactionId: token, applicationId: replacing.applicationId, originalAppUserId: replacing.originalAppUserId,
                    appUserIds: replacing.appUserIds, productId: productId ?? replacing.productId, status: .expired, autoRenew: false,
                    expiresAt: eventTime, environment: replacing.environment, sourceTimestamp: 0, replacedBy: replacing.originalTransactionId)
            }
            switch try await backend({ () async throws(BackendError) in try await stateStore.write(marked, ifMatch: current?.version ?? 0) }) {
            case .written: return
            case .versionMismatch, .stale: counters.writeConflicts.increment()
            }
        }
        throw .unavailable("subscription \(store.rawValue)/\(token), replaced, kept changing under 10 attempts")
    }
}
