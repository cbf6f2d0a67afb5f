import Foundation
import RelayConfig
import RelayCore

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
    var cancelReason: Reason?
    var expirationReason: Reason?
    var isTrialConversion = false
    var isFamilyShare = false
    var offerCode: String?
    var countryCode: String?
    /// What the customer paid, tax included; negative for refunds; nil when the store does not say.
    var amount: Amount?
    /// Tax as a fraction of the price without tax (0.19), when the store reports it.
    var taxPercentage: Decimal?
    /// What the seller keeps, in the amount's currency, when the store reports it (Paddle's `earnings`);
    /// negative for refunds. Else proceeds come from the configured commission.
    var earnings: Amount?
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
    /// Why an authentic notification cannot be applied (it names a transaction without the fields every
    /// transaction has): it is rejected as `malformed` with this detail, never dropped in silence.
    var malformed: String?
    /// The recorded payments (`SubscriptionState.transactions`) the mapping looked up, kept with the
    /// notification so that a repeat maps the same.
    var transactionsRead: [String] = []
    /// The subscription (same store) this one replaces: Google's `linkedPurchaseToken` after a plan
    /// change. The normalizer marks it replaced, so it gives no access from now on.
    var replaces: String?
    /// The product of the subscription `replaces` names, when the store says (a placeholder's product).
    var replacedProductId: String?

    /// The recorded payment with this store id (`MappingInput.history`), remembered as read.
    mutating func recorded(_ id: String?, in history: [SubscriptionState.Transaction]) -> SubscriptionState.Transaction? {
        guard let id, let found = history.last(where: { $0.id == id }) else { return nil }
        if !transactionsRead.contains(found.id) { transactionsRead.append(found.id) }
        return found
    }
}

/// Everything a store mapper reads.
struct MappingInput {
    var notification: VerifiedNotification
    var app: RelayConfiguration.App
    /// `relay-received-at` (Unix ms).
    var receivedAt: Int64
    /// The notification is older than the stored state, so it is mapped without it (`prior` is nil even
    /// though the subscription is known).
    var late = false
    /// The subscription's recorded payments (also for a late notification), for a refund to look up.
    var history: [SubscriptionState.Transaction] = []
    /// What a store's API said about this notification (Google's Play Developer API, Stripe's API).
    var api: StoreAPIData?
}

/// Store API answers fetched for one notification, recorded with it so that a repeat maps the same.
struct StoreAPIData {
    /// Google `purchases.subscriptionsv2.get` (SubscriptionPurchaseV2).
    var subscription: JSON?
    /// Google `purchases.products.get` (ProductPurchase).
    var product: JSON?
    /// Google: the `productId:basePlanId` of the purchase that a plan change replaced (`linkedPurchaseToken`),
    /// from its stored state or the Play Developer API.
    var replacedProductId: String?
    /// Google: the app user an app bound the replaced purchase to (`ownerAppUserId`): the plan change's
    /// purchase is that user's too.
    var replacedOwner: String?
    /// Google: the stored subscription a new purchase token continues, `import revenuecat`'s, keyed by its
    /// first order id (`GoogleMapping.firstOrderId`): its state as stored.
    var imported: JSON?
    /// Stripe: the refunded charge, its `invoice` expanded.
    var charge: JSON?
    /// A Stripe or Paddle purchase an app handed over, as the store's API answered
    /// (`HandedOverPurchase`): `subscription`, `checkoutSession`, `transaction`.
    var purchase: JSON?

    init(subscription: JSON? = nil, product: JSON? = nil, replacedProductId: String? = nil, charge: JSON? = nil, purchase: JSON? = nil) {
        self.purchase = purchase
        self.subscription = subscription
        self.product = product
        self.replacedProductId = replacedProductId
        self.charge = charge
    }
}

extension StoreAPIData {
    init(_ json: JSON) {
        self.init(
            subscription: json.present("subscription"), product: json.present("product"), replacedProductId: json.text("replacedProductId"),
            charge: json.present("charge"))
        purchase = json.present("purchase")
        replacedOwner = json.text("replacedOwner")
        imported = json.present("imported")
    }

    var json: JSON {
        [
            "subscription": subscription ?? .null, "product": product ?? .null, "replacedProductId": replacedProductId.map(JSON.string) ?? .null,
            "charge": charge ?? .null, "purchase": purchase ?? .null, "replacedOwner": replacedOwner.map(JSON.string) ?? .null,
            "imported": imported ?? .null,
        ]
    }
}

/// SDK `SuperwallEvent` names (docs/contracts.md, the standardized event).
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

extension Amount {
    /// A recorded payment's amount, when it was known.
    init?(_ transaction: SubscriptionState.Transaction?) {
        guard let text = transaction?.amount, let currency = transaction?.currency, let value = Decimal(string: text) else { return nil }
        self.init(value, currency)
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

extension EventDraft {
    /// Whether money moves with this event: a purchase, a renewal, a refund or its reversal. Other events
    /// (a product_change too, as Superwall documents: the purchase or renewal beside it carries the money)
    /// carry a price of 0; a money event whose amount the store does not report carries null.
    var movesMoney: Bool {
        switch type {
        case .initialPurchase, .renewal, .nonRenewingPurchase, .refundReversed: true
        case .cancellation: cancelReason == Reason.customerSupport
        default: false
        }
    }
}
