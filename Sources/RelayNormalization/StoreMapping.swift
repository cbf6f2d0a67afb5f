import Foundation
import RelayBackend
import RelayConfig
import RelayCore
import RelayVerification

/// One standardized event as a store mapper describes it, before the normalizer adds ids, money
/// conversion, entitlements and statuses.
struct EventDraft {
    var type: EventType
    var periodType: SubscriptionState.PeriodType = .normal
    var productId: String?
    var newProductId: String?
    var transactionId: String?
    var purchasedAt: Int64?
    var expirationAt: Int64?
    var gracePeriodExpiresAt: Int64?
    var cancelReason: String?
    var expirationReason: String?
    var isTrialConversion = false
    var isFamilyShare = false
    var offerCode: String?
    var countryCode: String?
    /// What the customer paid, tax included; negative for refunds; nil when the store does not say.
    var amount: Amount?
    /// Tax as a fraction of the price without tax (0.19), when the store reports it.
    var taxPercentage: Decimal?
    var sdkEvents: [String] = []
    /// The stable id's base when it is not the notification id: a Paddle adjustment is approved by
    /// either `adjustment.created` or `adjustment.updated`, and must count once.
    var idBase: String?
}

/// What one verified store notification means: the subscription it concerns, its state afterwards,
/// and the events it causes.
struct StoreMapping {
    /// The subscription's key (`originalTransactionId`: Apple's, Google's purchase token, Stripe's or
    /// Paddle's subscription id, a one-time purchase's id); nil when the notification concerns none.
    var subject: String?
    /// `PRODUCTION` or `SANDBOX`.
    var environment: String
    var appUserId: String?
    var bundleId: String?
    /// The store's time for this notification (Unix ms): `sourceTimestamp` of the state it writes.
    var eventTime: Int64
    /// The subscription as of this notification (its `version` is ignored), or nil for no change.
    var state: SubscriptionState?
    var events: [EventDraft] = []
    /// False for notification types this build does not know: no events, no state change, counted.
    var recognized = true
}

/// Everything a store mapper reads.
struct MappingInput {
    var notification: VerifiedNotification
    var app: RelayConfiguration.App
    /// `relay-received-at` (Unix ms).
    var receivedAt: Int64
    /// Google: the Play Developer API's answers for this notification.
    var play: PlayData?
}

/// The Play Developer API documents fetched for one Google notification.
struct PlayData {
    /// `purchases.subscriptionsv2.get` (SubscriptionPurchaseV2).
    var subscription: JSON?
    /// `purchases.products.get` (ProductPurchase).
    var product: JSON?
}

/// SDK `SuperwallEvent` names (DESIGN section 5).
enum SDKEvent {
    static let transactionComplete = "transactionComplete"
    static let subscriptionStart = "subscriptionStart"
    static let freeTrialStart = "freeTrialStart"
    static let nonRecurringProductPurchase = "nonRecurringProductPurchase"
    static let subscriptionStatusDidChange = "subscriptionStatusDidChange"

    /// A purchase the user made in the app: a new subscription (or a free trial).
    static func purchase(_ period: SubscriptionState.PeriodType) -> [String] {
        period == .trial ? [transactionComplete, subscriptionStart, freeTrialStart] : [transactionComplete, subscriptionStart]
    }
}

/// Cancellation and expiration reasons (RevenueCat's and Superwall's values).
enum Reason {
    static let unsubscribe = "UNSUBSCRIBE"
    static let billingError = "BILLING_ERROR"
    static let developerInitiated = "DEVELOPER_INITIATED"
    static let priceIncrease = "PRICE_INCREASE"
    static let customerSupport = "CUSTOMER_SUPPORT"
    static let productUnavailable = "PRODUCT_UNAVAILABLE"
    static let unknown = "UNKNOWN"
}


extension JSON {
    /// A member that is a string or an integer, as text (ids arrive as either).
    func text(_ key: String) -> String? {
        guard let value = self[key] else { return nil }
        if let text = value.stringValue { return text.isEmpty ? nil : text }
        if let number = value.int64Value { return String(number) }
        return nil
    }

    /// A member that is an integer (or a string of one).
    func integer(_ key: String) -> Int64? {
        guard let value = self[key] else { return nil }
        return value.int64Value ?? value.stringValue.flatMap { Int64($0) }
    }

    /// A member in Unix seconds as Unix milliseconds; nil when absent, or too large to be a time (a
    /// store-supplied number must never trap the worker).
    func milliseconds(fromSeconds key: String) -> Int64? {
        guard let seconds = integer(key) else { return nil }
        let (milliseconds, overflow) = seconds.multipliedReportingOverflow(by: 1000)
        return overflow ? nil : milliseconds
    }

    /// The member, unless it is absent or null.
    func present(_ key: String) -> JSON? {
        guard let value = self[key], !value.isNull else { return nil }
        return value
    }
}
