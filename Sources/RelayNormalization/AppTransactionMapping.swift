import RelayConfig
import RelayCore

/// A grandfathered customer's verified AppTransaction (`relay-source: app-transaction`, type
/// `APP_TRANSACTION`) → a lifetime grant: state only, no store event of its own. The normalizer's
/// status machinery then sends `subscription_status_did_change` when the user gains access, and customer
/// info lists the grant under `nonSubscriptions` (no expiry, no renewal) with its entitlements as lifetime.
///
/// - One AppTransaction grants one app user. A signed AppTransaction is a bearer artifact: the same JWS
///   replayed under other accounts must not give them access too. A record for another user than the one
///   the stored grant belongs to changes nothing: the mapping produces no state (the normalizer merges a
///   state's `appUserIds` into the stored ones, so any state would add the user), no event. It is not
///   rejected: the local backend refuses such grants with 409 and only a race of two first grants gets
///   here, which is no fault of the record.
/// - The event time is the record's receive time, not the AppTransaction's `signedDate`: StoreKit caches
///   AppTransactions, so one signed before the stored grant is still current, and mapped as a late
///   notification it would be dropped while the backend answered 202.
/// - An AppTransaction that carries a revocation (`revocationDate`/`revocationReason`: the paid-app
///   purchase was refunded) grants nothing: rejected as malformed.
enum AppTransactionMapping {
    static func map(_ input: MappingInput, prior: SubscriptionState?) -> StoreMapping {
        let payload = input.notification.payload
        let data = payload["data"]
        let appTransaction = data?["appTransaction"] ?? .null
        let environment = input.notification.environment == "Production" ? "PRODUCTION" : "SANDBOX"
        let user = data?["appUserId"]?.stringValue
        var mapping = StoreMapping(
            subject: AppTransactionGrant.subject(of: appTransaction), environment: environment, appUserId: user,
            bundleId: appTransaction["bundleId"]?.stringValue, eventTime: input.receivedAt)
        // The rule index is not signed: it must name a configured rule the AppTransaction meets.
        let rules = input.app.apple?.grandfathering ?? []
        guard let subject = mapping.subject, let user, !user.isEmpty else {
            mapping.malformed = "the app-transaction record names no user or its AppTransaction has no id"
            return mapping
        }
        if AppTransactionGrant.revocation(of: appTransaction) != nil {
            mapping.malformed = "the app-transaction record's AppTransaction is revoked (the app purchase was refunded); it grants nothing"
            return mapping
        }
        guard let index = data?["rule"]?.int64Value.flatMap({ Int(exactly: $0) }), rules.indices.contains(index), rules[index].matches(appTransaction)
        else {
            mapping.malformed = "the app-transaction record's rule is not a configured grandfathering rule this AppTransaction meets"
            return mapping
        }
        // Granted to another user already: no state, so the normalizer adds nobody and sends nothing.
        if let prior, !AppTransactionGrant.belongs(prior, to: user) { return mapping }
        mapping.state = SubscriptionState(
            store: .apple, originalTransactionId: subject, applicationId: input.app.applicationId, originalAppUserId: prior?.originalAppUserId ?? user,
            appUserIds: [user], productId: AppTransactionGrant.productId(rule: index), status: .active, periodType: .normal, autoRenew: false,
            expiresAt: nil, environment: environment, lastTransactionId: nil, sourceTimestamp: mapping.eventTime)
        return mapping
    }
}
