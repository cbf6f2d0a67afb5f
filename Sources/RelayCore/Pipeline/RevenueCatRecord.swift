/// One moment of a transaction from RevenueCat's Scheduled Data Export (the Transactions feed), as
/// `import revenuecat` appends it: a raw notification record of the transaction's store with
/// `relay-source: revenuecat`, keyed by the subscription, whose body is this record's `json`. The worker
/// applies it through `RevenueCatMapping`: state, and the event of that moment.
///
/// A transaction row becomes up to four records, each at its own time: its payment (`purchase`, at
/// `start_time`), a billing issue (`billing_issues_detected_at`), the cancellation of renewal
/// (`unsubscribe_detected_at`) and its refund (`refunded_at`); the last transaction of a subscription that
/// has ended adds its `expiration` (at `end_time`).
public struct RevenueCatRecord: Sendable, Equatable {
    public static let source = "revenuecat"
    /// The notification type of these records (`revenuecat.purchase`, ...).
    public static let typePrefix = "revenuecat."

    public enum Kind: String, Sendable, CaseIterable {
        case purchase
        case billingIssue = "billing_issue"
        case unsubscribe
        case refund
        case expiration
    }

    public var kind: Kind
    /// `store_transaction_id` and `original_store_transaction_id`: the payment, and the subscription's key.
    public var transactionId: String
    public var originalTransactionId: String
    /// `product_identifier`.
    public var productId: String
    /// `rc_last_seen_app_user_id_alias`, else `rc_original_app_user_id`: the user the purchase belongs to.
    public var appUserId: String?
    /// When this moment happened (Unix ms): the event's time.
    public var at: Int64
    /// `start_time` and `end_time` (else `effective_end_time`) of the transaction.
    public var purchasedAt: Int64
    public var expiresAt: Int64?
    public var renewalNumber: Int64?
    public var autoRenewable: Bool
    public var trial: Bool
    public var intro: Bool
    public var trialConversion: Bool
    public var sandbox: Bool
    /// `price_in_purchased_currency` (a decimal string) and `purchased_currency`.
    public var price: String?
    public var currency: String?
    public var taxPercentage: String?
    public var country: String?
    /// `grace_period_end_time`, for a billing issue.
    public var gracePeriodEndsAt: Int64?
    /// `expiration_reason` (RevenueCat's words: UNSUBSCRIBE, BILLING_ERROR, ...).
    public var expirationReason: String?
    /// `offer` (an offer code or promotional offer id), when RevenueCat names it.
    public var offer: String?

    public init(
        kind: Kind, transactionId: String, originalTransactionId: String, productId: String, appUserId: String?, at: Int64, purchasedAt: Int64,
        expiresAt: Int64?, renewalNumber: Int64?, autoRenewable: Bool, trial: Bool, intro: Bool, trialConversion: Bool, sandbox: Bool,
        price: String?, currency: String?, taxPercentage: String?, country: String?, gracePeriodEndsAt: Int64?, expirationReason: String?,
        offer: String?
    ) {
        self.kind = kind
        self.transactionId = transactionId
        self.originalTransactionId = originalTransactionId
        self.productId = productId
        self.appUserId = appUserId
        self.at = at
        self.purchasedAt = purchasedAt
        self.expiresAt = expiresAt
        self.renewalNumber = renewalNumber
        self.autoRenewable = autoRenewable
        self.trial = trial
        self.intro = intro
        self.trialConversion = trialConversion
        self.sandbox = sandbox
        self.price = price
        self.currency = currency
        self.taxPercentage = taxPercentage
        self.country = country
        self.gracePeriodEndsAt = gracePeriodEndsAt
        self.expirationReason = expirationReason
        self.offer = offer
    }

    /// The notification id: one per transaction and moment, so a repeat is recognized.
    public var notificationId: String { "revenuecat:\(transactionId):\(kind.rawValue)" }

    public var json: JSON {
        func optional(_ value: String?) -> JSON { value.map(JSON.string) ?? .null }
        func optional(_ value: Int64?) -> JSON { value.map(JSON.integer) ?? .null }
        return [
            "kind": .string(kind.rawValue), "transactionId": .string(transactionId), "originalTransactionId": .string(originalTransactionId),
            "productId": .string(productId), "appUserId": optional(appUserId), "at": .integer(at), "purchasedAt": .integer(purchasedAt),
            "expiresAt": optional(expiresAt), "renewalNumber": optional(renewalNumber), "autoRenewable": .bool(autoRenewable), "trial": .bool(trial),
            "intro": .bool(intro), "trialConversion": .bool(trialConversion), "sandbox": .bool(sandbox), "price": optional(price),
            "currency": optional(currency), "taxPercentage": optional(taxPercentage), "country": optional(country),
            "gracePeriodEndsAt": optional(gracePeriodEndsAt), "expirationReason": optional(expirationReason), "offer": optional(offer),
        ]
    }

    public init?(json: JSON) {
        guard let kind = json["kind"]?.stringValue.flatMap(Kind.init(rawValue:)),
            let transactionId = json["transactionId"]?.stringValue, !transactionId.isEmpty,
            let original = json["originalTransactionId"]?.stringValue, !original.isEmpty,
            let productId = json["productId"]?.stringValue, !productId.isEmpty,
            let at = json["at"]?.int64Value, let purchasedAt = json["purchasedAt"]?.int64Value
        else { return nil }
        self.init(
            kind: kind, transactionId: transactionId, originalTransactionId: original, productId: productId, appUserId: json["appUserId"]?.stringValue,
            at: at, purchasedAt: purchasedAt, expiresAt: json["expiresAt"]?.int64Value, renewalNumber: json["renewalNumber"]?.int64Value,
            autoRenewable: json["autoRenewable"]?.boolValue ?? true, trial: json["trial"]?.boolValue ?? false, intro: json["intro"]?.boolValue ?? false,
            trialConversion: json["trialConversion"]?.boolValue ?? false, sandbox: json["sandbox"]?.boolValue ?? false, price: json["price"]?.stringValue,
            currency: json["currency"]?.stringValue, taxPercentage: json["taxPercentage"]?.stringValue, country: json["country"]?.stringValue,
            gracePeriodEndsAt: json["gracePeriodEndsAt"]?.int64Value, expirationReason: json["expirationReason"]?.stringValue,
            offer: json["offer"]?.stringValue)
    }
}
