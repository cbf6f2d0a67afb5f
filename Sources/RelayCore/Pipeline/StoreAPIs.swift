/// Google's Play Developer API, as normalization reads it: a subscription's or a one-time product's
/// purchase. `RelayGooglePlay.GooglePlayClient` is the real one; tests give their own.
public protocol PlayPurchases: Sendable {
    /// `purchases.subscriptionsv2.get`: the SubscriptionPurchaseV2 of a purchase token.
    func subscription(packageName: String, purchaseToken: String) async throws(StoreAPIError) -> JSON
    /// `purchases.products.get`: the ProductPurchase of a one-time product's purchase token.
    func product(packageName: String, productId: String, purchaseToken: String) async throws(StoreAPIError) -> JSON
    /// `purchases.voidedpurchases.list` from `startTime` to `endTime` (Unix ms; `type=1`: subscriptions too),
    /// one page: `{"voidedPurchases": [...], "tokenPagination": {"nextPageToken"}}`.
    func voidedPurchases(packageName: String, startTime: Int64, endTime: Int64, pageToken: String?) async throws(StoreAPIError) -> JSON
    /// `purchases.subscriptions.acknowledge` (`subscription`, `productId` the subscription's product id) or
    /// `purchases.products.acknowledge`.
    func acknowledge(packageName: String, productId: String, purchaseToken: String, subscription: Bool) async throws(StoreAPIError)
}

/// Stripe's API, as the relay reads it: a refunded charge with its invoice (normalization), a subscription
/// and a Checkout Session (purchases apps hand over). `RelayStripe.StripeClient` is the real one.
public protocol StripeCharges: Sendable {
    func charge(_ id: String) async throws(StoreAPIError) -> JSON
    /// `GET /v1/subscriptions/{id}`.
    func subscription(_ id: String) async throws(StoreAPIError) -> JSON
    /// `GET /v1/checkout/sessions/{id}`.
    func checkoutSession(_ id: String) async throws(StoreAPIError) -> JSON
    /// `GET /v1/prices/{id}`.
    func price(_ id: String) async throws(StoreAPIError) -> JSON
    /// `GET /v1/invoices/{id}`.
    func invoice(_ id: String) async throws(StoreAPIError) -> JSON
    /// `GET /v1/subscriptions?status=all&limit=100[&created[gte]=][&starting_after=]`: one page of the account's
    /// subscriptions, newest first, `{"data": [...], "has_more"}`.
    func subscriptions(createdFrom: Int64?, startingAfter: String?) async throws(StoreAPIError) -> JSON
    /// `GET /v1/invoices?subscription=&status=paid&limit=100[&starting_after=]`: one page of a subscription's
    /// paid invoices, newest first.
    func invoices(subscription: String, startingAfter: String?) async throws(StoreAPIError) -> JSON
    /// `GET /v1/charges?customer=&limit=100[&starting_after=]`: one page of a customer's charges, newest first.
    func charges(customer: String, startingAfter: String?) async throws(StoreAPIError) -> JSON
    /// `GET /v1/events?created[gte]=&created[lt]=&types[]=…&limit=100[&starting_after=]`: one page of the
    /// account's events (newest first; Stripe keeps 30 days), `{"data": [...], "has_more"}`.
    func events(createdFrom: Int64, createdBefore: Int64, types: [String], startingAfter: String?) async throws(StoreAPIError) -> JSON
    /// `GET /v1/events/{id}`.
    func event(_ id: String) async throws(StoreAPIError) -> JSON
    /// `POST /v1/checkout/sessions` with `form` (Stripe's form encoding, `line_items[0][price]`), sent once
    /// per `idempotencyKey` (Stripe answers a repeat with the first session).
    func createCheckoutSession(_ form: [(String, String)], idempotencyKey: String) async throws(StoreAPIError) -> JSON
}

/// The Stripe events the relay maps (`StripeMapping`): what `recover stripe` asks Stripe for.
public enum StripeEventTypes {
    public static let mapped = [
        "customer.subscription.created", "customer.subscription.updated", "customer.subscription.deleted", "customer.subscription.paused",
        "customer.subscription.resumed", "customer.subscription.trial_will_end", "customer.subscription.pending_update_applied",
        "customer.subscription.pending_update_expired", "invoice.paid", "invoice.payment_succeeded", "invoice.payment_failed", "charge.refunded",
        "checkout.session.completed", "checkout.session.async_payment_succeeded",
    ]
}

/// Paddle's API, as the relay reads it: a transaction and a subscription (purchases apps hand over).
/// `RelayPaddle.PaddleClient` is the real one.
public protocol PaddleReads: Sendable {
    /// `GET /transactions/{id}`: the Transaction (`data`).
    func transaction(_ id: String) async throws(StoreAPIError) -> JSON
    /// `GET /subscriptions/{id}`: the Subscription (`data`).
    func subscription(_ id: String) async throws(StoreAPIError) -> JSON
    /// `GET /notifications?notification_setting_id=&from=&to=&per_page=200[&after=]`: one page of the
    /// notifications Paddle sent to one destination (the whole answer: `data` and `meta.pagination`).
    func notifications(settingId: String, from: String, to: String, after: String?) async throws(StoreAPIError) -> JSON
    /// `POST /notifications/{id}/replay`: Paddle sends the notification again, signed, to its destination.
    func replayNotification(_ id: String) async throws(StoreAPIError) -> JSON
    /// `GET /transactions?subscription_id=&status=completed&order_by=billed_at[DESC|ASC]&per_page=&after=`: one page
    /// of a subscription's completed transactions (the whole answer: `data` and `meta.pagination`).
    func transactions(subscriptionId: String, newestFirst: Bool, perPage: Int, after: String?) async throws(StoreAPIError) -> JSON
    /// `GET /subscriptions?per_page=200[&after=]`: one page of the account's subscriptions (the whole answer).
    func subscriptions(after: String?) async throws(StoreAPIError) -> JSON
    /// `GET /adjustments?subscription_id=&per_page=50[&after=]`: one page of a subscription's adjustments (the whole answer).
    func adjustments(subscriptionId: String, after: String?) async throws(StoreAPIError) -> JSON
    /// `GET /adjustments?id=`: one adjustment (`data`), which Paddle reads only through its list.
    func adjustment(_ id: String) async throws(StoreAPIError) -> JSON
}

/// The Paddle events the relay maps (`PaddleMapping`): what `recover paddle` replays.
public enum PaddleEventTypes {
    public static let mapped: Set<String> = [
        "subscription.created", "subscription.updated", "subscription.canceled", "subscription.paused", "subscription.resumed",
        "subscription.past_due", "subscription.activated", "subscription.trialing", "subscription.imported", "transaction.completed",
        "adjustment.created", "adjustment.updated",
    ]
}

/// The store APIs of each app, by app key: what the composition root built from the configuration
/// (`playApi`, `stripe.api`, `paddle.api`) and hands to normalization, which depends on none of the clients.
public struct StoreAPIs: Sendable {
    public var play: [String: any PlayPurchases]
    public var stripe: [String: any StripeCharges]
    public var paddle: [String: any PaddleReads]

    public init(play: [String: any PlayPurchases] = [:], stripe: [String: any StripeCharges] = [:], paddle: [String: any PaddleReads] = [:]) {
        self.play = play
        self.stripe = stripe
        self.paddle = paddle
    }
}

/// What the relay tells Apple about a purchase the customer asked to have refunded: the body of Send
/// Consumption Information (v2), in the relay's own words so that the worker needs no App Store client.
public struct ConsumptionInformation: Sendable, Equatable {
    public enum DeliveryStatus: String, Sendable {
        /// The stored purchase exists and gave access (not revoked or refunded before the request).
        case delivered = "DELIVERED"
        /// Anything else: the relay cannot say the content reached the customer.
        case undeliveredOther = "UNDELIVERED_OTHER"
    }

    public var customerConsented: Bool
    public var deliveryStatus: DeliveryStatus
    public var sampleContentProvided: Bool
    /// Milliunits (100000 = 100 %); nil for auto-renewable subscriptions, for which Apple refuses it.
    public var consumptionPercentage: Int?
    /// `DECLINE`, `GRANT_FULL`, `GRANT_PRORATED`, or nil for no preference.
    public var refundPreference: String?

    public init(
        customerConsented: Bool, deliveryStatus: DeliveryStatus, sampleContentProvided: Bool, consumptionPercentage: Int? = nil,
        refundPreference: String? = nil
    ) {
        self.customerConsented = customerConsented
        self.deliveryStatus = deliveryStatus
        self.sampleContentProvided = sampleContentProvided
        self.consumptionPercentage = consumptionPercentage
        self.refundPreference = refundPreference
    }
}

/// The App Store Server API's Send Consumption Information, as the worker uses it to answer a
/// `CONSUMPTION_REQUEST`. RelayApp implements it over `RelayAppStoreAPI`; tests give their own.
public protocol ConsumptionAnswers: Sendable {
    /// `PUT /inApps/v2/transactions/consumption/{transactionId}`. A refused key is `.rejected` with `status` 401.
    func sendConsumptionInformation(transactionId: String, _ information: ConsumptionInformation) async throws(StoreAPIError)
}
