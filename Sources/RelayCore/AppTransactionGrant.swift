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

    /// The body of the record the backend appends.
    public static func body(signedAppTransaction: String, appUserId: String, rule: Int) -> [UInt8] {
        JSON.object(["signedAppTransaction": .string(signedAppTransaction), "appUserId": .string(appUserId), "rule": .integer(Int64(rule))])
            .serialized()
    }
}
