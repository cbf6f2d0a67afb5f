/// The vocabulary of grandfathered access (`apps[].apple.grandfathering`), shared by the local backend
/// that accepts a signed AppTransaction, the verifier and the mapping that turn it into state.
///
/// The backend appends a raw notification record with `relay-source: app-transaction` whose body is
/// `{"signedAppTransaction": JWS, "appUserId": id, "rule": index}`; the worker verifies the JWS again
/// and writes a lifetime "purchase" of product `$grandfathered:<rule>`, so the status-change machinery
/// and customer info treat it like any one-time purchase.
public enum AppTransactionGrant {
    /// `relay-source` of the records the local backend appends.
    public static let source = "app-transaction"
    /// The verified notification's `notificationType` (never one of Apple's).
    public static let notificationType = "APP_TRANSACTION"

    /// The product a rule grants: the local backend maps it to the rule's entitlements.
    public static func productId(rule: Int) -> String { "\(productPrefix)\(rule)" }
    public static let productPrefix = "$grandfathered:"

    /// The grant's `originalTransactionId`: `app-transaction:<appTransactionId>`, or the
    /// `originalPurchaseDate` for AppTransactions from before Apple added the id. Nil when it has neither.
    public static func subject(of appTransaction: JSON) -> String? {
        if let id = appTransaction["appTransactionId"]?.stringValue, !id.isEmpty { return "app-transaction:\(id)" }
        if let id = appTransaction["appTransactionId"]?.int64Value { return "app-transaction:\(id)" }
        if let date = appTransaction["originalPurchaseDate"]?.int64Value { return "app-transaction:\(date)" }
        return nil
    }

    /// Apple's `revocationDate` and `revocationReason` of a refunded or revoked app purchase, described;
    /// nil when it has neither. Such an AppTransaction grants nothing (the backend answers 403, the
    /// worker refuses its record).
    public static func revocation(of appTransaction: JSON) -> String? {
        let named = ["revocationDate", "revocationReason"].compactMap { key -> String? in
            guard let value = appTransaction[key], !value.isNull else { return nil }
            return "\(key) \(String(decoding: value.serialized(), as: UTF8.self))"
        }
        return named.isEmpty ? nil : named.joined(separator: ", ")
    }

    /// Whether a stored grant is `user`'s: it names the user (as its first user or among its users), or
    /// names nobody. One AppTransaction grants one user: the backend answers 409 and the worker writes
    /// nothing for anyone else.
    public static func belongs(_ grant: SubscriptionState, to user: String) -> Bool {
        let owners = grant.appUserIds + (grant.originalAppUserId.map { [$0] } ?? [])
        return owners.isEmpty || owners.contains(user)
    }

    /// The body of the record the backend appends.
    public static func body(signedAppTransaction: String, appUserId: String, rule: Int) -> [UInt8] {
        JSON.object(["signedAppTransaction": .string(signedAppTransaction), "appUserId": .string(appUserId), "rule": .integer(Int64(rule))])
            .serialized()
    }
}
