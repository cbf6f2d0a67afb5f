import RelayCore

/// Promotional grants (`PromotionalGrant`) → state and events. A grant is a subscription of store
/// `promotional` keyed by its grant id, product `$promotional:<entitlement>`, that does not renew: it
/// expires at its end (a lifetime grant has none), or when revoked.
///
/// - `grant`: `non_renewing_purchase` at price 0 with period type PROMOTIONAL;
/// - `revoke`: `expiration` with reason DEVELOPER_INITIATED, while it still gives access;
/// - `expire`: `expiration` with reason UNKNOWN (its time ran out, nobody ended it), while it still gives access.
///
/// The status change follows from the state, as for purchases.
enum PromotionalMapping {
    static func map(_ input: MappingInput, prior: SubscriptionState?) -> StoreMapping {
        guard let record = PromotionalGrant.Record(json: input.notification.payload) else {
            var mapping = StoreMapping(subject: nil, environment: "PRODUCTION", eventTime: input.receivedAt)
            mapping.malformed = "the grant record lacks its action, grant id, user, entitlement or time"
            return mapping
        }
        var mapping = StoreMapping(subject: record.grantId, environment: "PRODUCTION", eventTime: record.at)
        mapping.appUserId = record.appUserId
        let productId = PromotionalGrant.productId(entitlement: record.entitlement)
        var draft = EventDraft(
            type: .nonRenewingPurchase, periodType: .promotional, productId: productId, transactionId: record.grantId, purchasedAt: record.at,
            expirationAt: record.expiresAt)
        switch record.action {
        case .grant:
            mapping.state = SubscriptionState(
                store: .promotional, originalTransactionId: record.grantId, applicationId: input.app.applicationId,
                originalAppUserId: record.appUserId, productId: productId, status: .active, periodType: .promotional, autoRenew: false,
                expiresAt: record.expiresAt, environment: "PRODUCTION", lastTransactionId: record.grantId, sourceTimestamp: record.at)
            draft.amount = Amount(0, "USD")
            mapping.events = [draft]
        case .revoke, .expire:
            // Nothing to end: a grant never applied, or one that ended already.
            guard var state = prior, state.status == .active else { return mapping }
            state.status = record.action == .revoke ? .revoked : .expired
            state.sourceTimestamp = max(state.sourceTimestamp, record.at)
            if record.action == .revoke { state.expiresAt = min(state.expiresAt ?? record.at, record.at) }
            mapping.state = state
            draft.type = .expiration
            // When it was granted, as recorded (through `recorded`, so that a repeat finds it in what it saw).
            draft.purchasedAt = mapping.recorded(record.grantId, in: input.history)?.purchasedAt ?? draft.purchasedAt
            draft.expirationAt = state.expiresAt
            draft.expirationReason = record.action == .revoke ? Reason.developerInitiated : Reason.unknown
            mapping.events = [draft]
        }
        return mapping
    }
}
