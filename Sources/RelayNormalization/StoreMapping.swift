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

/// RFC 3339 timestamps (`2030-01-01T00:00:00.123456Z`, `+02:00` offsets) as Unix milliseconds.
enum Timestamp {
    static func milliseconds(_ text: String?) -> Int64? {
        guard let text else { return nil }
        let bytes = Array(text.utf8)
        func number(_ range: Range<Int>) -> Int? {
            guard range.upperBound <= bytes.count else { return nil }
            var value = 0
            for index in range {
                let byte = bytes[index]
                guard byte >= 48, byte <= 57 else { return nil }
                value = value * 10 + Int(byte - 48)
            }
            return value
        }
        guard bytes.count >= 20, let year = number(0..<4), bytes[4] == 45, let month = number(5..<7), bytes[7] == 45,
            let day = number(8..<10), bytes[10] == 84 || bytes[10] == 116 || bytes[10] == 32, let hour = number(11..<13), bytes[13] == 58,
            let minute = number(14..<16), bytes[16] == 58, let second = number(17..<19), (1...12).contains(month), (1...31).contains(day),
            hour < 24, minute < 60, second < 61
        else { return nil }
        var index = 19
        var millis = 0
        if index < bytes.count, bytes[index] == 46 {
            index += 1
            var digits = 0
            while index < bytes.count, bytes[index] >= 48, bytes[index] <= 57 {
                if digits < 3 { millis = millis * 10 + Int(bytes[index] - 48) }
                digits += 1
                index += 1
            }
            guard digits > 0 else { return nil }
            for _ in digits..<max(digits, 3) { millis *= 10 }
        }
        guard index < bytes.count else { return nil }
        var offset = 0
        switch bytes[index] {
        case 90, 122: index += 1
        case 43, 45:
            guard let hours = number(index + 1..<index + 3), index + 3 < bytes.count, bytes[index + 3] == 58,
                let minutes = number(index + 4..<index + 6)
            else { return nil }
            offset = (hours * 60 + minutes) * 60 * (bytes[index] == 43 ? 1 : -1)
            index += 6
        default: return nil
        }
        guard index == bytes.count else { return nil }
        // Days from the civil date (Howard Hinnant's algorithm), no calendar or locale involved.
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        let days = era * 146_097 + dayOfEra - 719_468
        let seconds = Int64(days) * 86_400 + Int64(hour * 3600 + minute * 60 + second) - Int64(offset)
        return seconds * 1000 + Int64(millis)
    }
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
