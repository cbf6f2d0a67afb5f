/// Google's Play Developer API, as normalization reads it: a subscription's or a one-time product's
/// purchase. `RelayGooglePlay.GooglePlayClient` is the real one; tests give their own.
public protocol PlayPurchases: Sendable {
    /// `purchases.subscriptionsv2.get`: the SubscriptionPurchaseV2 of a purchase token.
    func subscription(packageName: String, purchaseToken: String) async throws(StoreAPIError) -> JSON
    /// `purchases.products.get`: the ProductPurchase of a one-time product's purchase token.
    func product(packageName: String, productId: String, purchaseToken: String) async throws(StoreAPIError) -> JSON
}

/// Stripe's API, as normalization reads it: a refunded charge with its invoice.
/// `RelayStripe.StripeClient` is the real one.
public protocol StripeCharges: Sendable {
    func charge(_ id: String) async throws(StoreAPIError) -> JSON
}

/// The store APIs of each app, by app key: what the composition root built from the configuration
/// (`playApi`, `stripe.api`) and hands to normalization, which depends on none of the clients.
public struct StoreAPIs: Sendable {
    public var play: [String: any PlayPurchases]
    public var stripe: [String: any StripeCharges]

    public init(play: [String: any PlayPurchases] = [:], stripe: [String: any StripeCharges] = [:]) {
        self.play = play
        self.stripe = stripe
    }
}
