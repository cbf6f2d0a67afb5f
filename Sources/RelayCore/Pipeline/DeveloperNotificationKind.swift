// Google Play's vocabulary, shared by verification (the notification's type) and normalization
// (its mapping), so neither depends on the other.

/// What a DeveloperNotification is about, with Google's names for the notification types. Codes that
/// are not known yet keep their number (`SUBSCRIPTION_NOTIFICATION_TYPE_23`) and the payload stays raw.
public enum DeveloperNotificationKind: Sendable, Equatable {
    case subscription(code: Int64)
    case oneTimeProduct(code: Int64)
    case voidedPurchase
    case test
    case unknown

    public init(_ notification: JSON) {
        if let code = notification["subscriptionNotification"]?["notificationType"]?.int64Value {
            self = .subscription(code: code)
        } else if let code = notification["oneTimeProductNotification"]?["notificationType"]?.int64Value {
            self = .oneTimeProduct(code: code)
        } else if notification["voidedPurchaseNotification"] != nil {
            self = .voidedPurchase
        } else if notification["testNotification"] != nil {
            self = .test
        } else {
            self = .unknown
        }
    }

    public static let subscriptionTypes: [Int64: String] = [
        1: "SUBSCRIPTION_RECOVERED", 2: "SUBSCRIPTION_RENEWED", 3: "SUBSCRIPTION_CANCELED", 4: "SUBSCRIPTION_PURCHASED",
        5: "SUBSCRIPTION_ON_HOLD", 6: "SUBSCRIPTION_IN_GRACE_PERIOD", 7: "SUBSCRIPTION_RESTARTED",
        8: "SUBSCRIPTION_PRICE_CHANGE_CONFIRMED", 9: "SUBSCRIPTION_DEFERRED", 10: "SUBSCRIPTION_PAUSED",
        11: "SUBSCRIPTION_PAUSE_SCHEDULE_CHANGED", 12: "SUBSCRIPTION_REVOKED", 13: "SUBSCRIPTION_EXPIRED",
        17: "SUBSCRIPTION_ITEMS_CHANGED", 18: "SUBSCRIPTION_CANCELLATION_SCHEDULED", 19: "SUBSCRIPTION_PRICE_CHANGE_UPDATED",
        20: "SUBSCRIPTION_PENDING_PURCHASE_CANCELED", 22: "SUBSCRIPTION_PRICE_STEP_UP_CONSENT_UPDATED",
    ]

    public static let oneTimeProductTypes: [Int64: String] = [1: "ONE_TIME_PRODUCT_PURCHASED", 2: "ONE_TIME_PRODUCT_CANCELED"]

    public var name: String {
        switch self {
        case .subscription(let code): Self.subscriptionTypes[code] ?? "SUBSCRIPTION_NOTIFICATION_TYPE_\(code)"
        case .oneTimeProduct(let code): Self.oneTimeProductTypes[code] ?? "ONE_TIME_PRODUCT_NOTIFICATION_TYPE_\(code)"
        case .voidedPurchase: "VOIDED_PURCHASE"
        case .test: "TEST"
        case .unknown: "UNKNOWN"
        }
    }
}
