import RelayConfig
import RelayCore

/// A grandfathered customer's verified AppTransaction (`relay-source: app-transaction`, type
/// `APP_TRANSACTION`) → a lifetime grant: state only, no store event of its own. The normalizer's
/// status machinery then sends `subscription_status_did_change` when the user gains access, and customer
/// info lists the grant under `nonSubscriptions` (no expiry, no renewal) with its entitlements as lifetime.
enum AppTransactionMapping {
    static func map(_ input: MappingInput, prior: SubscriptionState?) -> StoreMapping {
        let payload = input.notification.payload
        let data = payload["data"]
        let appTransaction = data?["appTransaction"] ?? .null
        let environment = input.notification.environment == "Production" ? "PRODUCTION" : "SANDBOX"
        let user = data?["appUserId"]?.stringValue
        var mapping = StoreMapping(
            subject: AppTransactionGrant.subject(of: appTransaction), environment: environment, appUserId: user,
            bundleId: appTransaction["bundleId"]?.stringValue, eventTime: payload["signedDate"]?.int64Value ?? input.receivedAt)
        // The rule index is not signed: it must name a configured rule the AppTransaction meets.
        let rules = input.app.apple?.grandfathering ?? []
        guard let subject = mapping.subject, let user, !user.isEmpty else {
            mapping.malformed = "the app-transaction record names no user or its AppTransaction has no id"
            return mapping
        }
        guard let index = data?["rule"]?.int64Value.flatMap({ Int(exactly: $0) }), rules.indices.contains(index), rules[index].matches(appTransaction)
        else {
            mapping.malformed = "the app-transaction record's rule is not a configured grandfathering rule this AppTransaction meets"
            return mapping
        }
        mapping.state = SubscriptionState(
            store: .apple, originalTransactionId: subject, applicationId: input.app.applicationId, originalAppUserId: prior?.originalAppUserId ?? user,
            appUserIds: [user], productId: AppTransactionGrant.productId(rule: index), status: .active, periodType: .normal, autoRenew: false,
            expiresAt: nil, environment: environment, lastTransactionId: nil, sourceTimestamp: mapping.eventTime)
        return mapping
    }
}
