public import RelayCore

extension RelayConfiguration {
    public struct App: Sendable {
        public var key: String
        public var projectId: Int
        public var applicationId: Int
        public var apple: Apple?
        public var google: Google?
        public var stripe: Stripe?
        public var paddle: Paddle?
        public var products: [Product]
        /// The keys the app embeds (public: anyone who unpacks the app has them): the public routes, for
        /// this app's users and products only.
        public var publicApiKeys: [String] = []
        /// What happens when a user links an id another user already has (`transferPolicy`). Default: transfer.
        public var transferPolicy: TransferPolicy = .transfer
        /// Web checkout and redemption codes (`web`); nil: the checkout routes answer 404 for this app.
        public var web: Web?

        /// Whether this app receives notifications from `store`.
        public func accepts(_ store: Store) -> Bool {
            switch store {
            case .apple: apple != nil
            case .google: google != nil
            case .stripe: stripe != nil
            case .paddle: paddle != nil
            case .promotional: false
            }
        }
    }

    /// `apps[].transferPolicy`: what happens when a second user presents an id (or, later, a purchase)
    /// another user of the app owns: a restore on a shared device, a new account.
    public enum TransferPolicy: String, Sendable, CaseIterable {
        /// It moves to the second user (RevenueCat's default "transfer to new App User ID").
        case transfer
        /// The first user keeps it; the second is refused with 409 `owned_by_another_user`.
        case keep
    }

    public struct Apple: Sendable {
        public var bundleId: String
        public var appAppleId: Int64?
        /// Among `Sandbox`, `Production`, `Xcode`, `LocalTesting`.
        public var environments: [String]
        /// Absolute paths of DER or PEM root certificates.
        public var rootCertificates: [String]
        /// The App Store Server API (`import apple`, `recover apple`, `reconcile apple`, consumption answers).
        public var serverApi: AppStoreServerAPI?
        /// How to answer CONSUMPTION_REQUEST notifications; nil: they are not answered.
        public var consumption: ConsumptionAnswer?
        /// Paid-app customers who keep access (`POST .../users/{id}/app-transaction`).
        public var grandfathering: [GrandfatheringRule]
        /// Whether a notification's nested `signedTransactionInfo` and `signedRenewalInfo` have their own chain and
        /// signature verified too, as the design requires (the default). Off, the notification's signature,
        /// verified first and covering their bytes, vouches for them: two ES256 verifications fewer
        /// (docs/verification.md).
        public var verifyNestedSignatures: Bool

        public init(
            bundleId: String, appAppleId: Int64?, environments: [String], rootCertificates: [String], serverApi: AppStoreServerAPI? = nil,
            consumption: ConsumptionAnswer? = nil, grandfathering: [GrandfatheringRule] = [], verifyNestedSignatures: Bool = true
        ) {
            self.bundleId = bundleId
            self.appAppleId = appAppleId
            self.environments = environments
            self.rootCertificates = rootCertificates
            self.serverApi = serverApi
            self.consumption = consumption
            self.grandfathering = grandfathering
            self.verifyNestedSignatures = verifyNestedSignatures
        }
    }

    /// An App Store Connect API key for the App Store Server API (`apps[].apple.serverApi`).
    public struct AppStoreServerAPI: Sendable {
        /// The key's id (10 characters, from App Store Connect → Users and Access → Integrations).
        public var keyId: String
        /// The issuer id (a UUID) shown above the keys.
        public var issuerId: String
        /// The absolute path of the downloaded `SubscriptionKey_<keyId>.p8`.
        public var privateKey: String
        /// `Production` or `Sandbox`: which App Store the API calls reach.
        public var environment: String
        /// Overrides Apple's URL for the environment (a proxy; tests).
        public var baseUrl: String?

        public init(keyId: String, issuerId: String, privateKey: String, environment: String = "Production", baseUrl: String? = nil) {
            self.keyId = keyId
            self.issuerId = issuerId
            self.privateKey = privateKey
            self.environment = environment
            self.baseUrl = baseUrl
        }
    }

    /// What the relay tells Apple when a customer asks for a refund (`apps[].apple.consumption`), sent
    /// with Send Consumption Information for each CONSUMPTION_REQUEST. Off unless configured.
    public struct ConsumptionAnswer: Sendable {
        /// The customer agreed to share consumption data (your terms must say so): Apple refuses the answer otherwise.
        public var customerConsented: Bool
        /// Whether the app offers a free trial or sample of what was bought.
        public var sampleContentProvided: Bool
        /// `DECLINE`, `GRANT_FULL`, `GRANT_PRORATED`, or nil to state no preference.
        public var refundPreference: String?

        public init(customerConsented: Bool, sampleContentProvided: Bool = false, refundPreference: String? = nil) {
            self.customerConsented = customerConsented
            self.sampleContentProvided = sampleContentProvided
            self.refundPreference = refundPreference
        }
    }

    /// Entitlements granted without a subscription to a customer whose signed AppTransaction meets the
    /// rule: who bought the app before it became free with subscriptions (`apps[].apple.grandfathering`).
    /// Each condition given must hold.
    public struct GrandfatheringRule: Sendable {
        public var entitlements: [String]
        /// The app version (`CFBundleVersion` on iOS) first downloaded was below this one, compared as
        /// dot-separated numbers (`2.0` > `1.9.3`).
        public var originalAppVersionBelow: String?
        /// The app was first downloaded before this time (Unix milliseconds).
        public var purchasedBefore: Int64?

        public init(entitlements: [String], originalAppVersionBelow: String? = nil, purchasedBefore: Int64? = nil) {
            self.entitlements = entitlements
            self.originalAppVersionBelow = originalAppVersionBelow
            self.purchasedBefore = purchasedBefore
        }
    }

    public struct Google: Sendable {
        public var packageName: String
        public var pushAudience: String
        public var pushServiceAccount: String
        /// An absolute file path or an `https://` URL.
        public var jwks: String
        public var playApi: PlayAPI?
    }

    public struct PlayAPI: Sendable {
        public var baseUrl: String = "https://androidpublisher.googleapis.com"
        public var tokenUrl: String = "https://oauth2.googleapis.com/token"
        public var serviceAccountKey: String?
        /// The worker acknowledges a new purchase Play still holds unacknowledged (a subscription's or a
        /// one-time product's, from Play's notification or an app's hand-over), so Play does not refund it
        /// after three days when the app died before acknowledging. Default false: the app acknowledges.
        public var acknowledgePurchases = false

        public init(baseUrl: String = "https://androidpublisher.googleapis.com", tokenUrl: String = "https://oauth2.googleapis.com/token", serviceAccountKey: String? = nil) {
            self.baseUrl = baseUrl
            self.tokenUrl = tokenUrl
            self.serviceAccountKey = serviceAccountKey
        }
    }

    /// What a valid configuration still loses, each with the key to set: logged as warnings at startup by
    /// the roles it concerns (the worker).
    public var warnings: [ConfigurationError] {
        apps.enumerated().compactMap { index, app in
            guard let stripe = app.stripe, !stripe.signingSecrets.isEmpty, stripe.api == nil else { return nil }
            return ConfigurationError(
                key: "apps[\(index)].stripe.api",
                message: "not set for app \(app.key): a Stripe refund (charge.refunded) then names no subscription, product or user, so it cannot "
                    + "revoke access and its refund event carries no app user; set api.secretKey to a restricted key that may read charges and invoices")
        }
    }

    public struct Stripe: Sendable {
        public var signingSecrets: [String]
        public var tolerance: Duration = .seconds(300)
        /// Stripe's API, read to find the subscription of a refunded charge; refunds stand alone without it.
        public var api: StripeAPI?
    }

    public struct StripeAPI: Sendable {
        public var baseUrl: String = "https://api.stripe.com"
        /// A secret or restricted key (`sk_…`, `rk_…`) that may read charges and invoices.
        public var secretKey: String

        public init(baseUrl: String = "https://api.stripe.com", secretKey: String) {
            self.baseUrl = baseUrl
            self.secretKey = secretKey
        }
    }

    public struct Paddle: Sendable {
        public var secretKeys: [String]
        public var tolerance: Duration = .seconds(300)
        /// Paddle's events do not say whether they come from its sandbox: `PRODUCTION` (default) or `SANDBOX`.
        public var environment = "PRODUCTION"
        /// Paddle's API: what the purchases route reads a transaction an app hands over from.
        public var api: PaddleAPI?
    }

    /// `apps[].web`: Stripe Checkout started by a web paywall, and the redemption codes that bring its
    /// purchases into the app (docs/web-checkout.md).
    public struct Web: Sendable {
        /// Where Stripe sends the buyer after paying; may hold Stripe's `{CHECKOUT_SESSION_ID}`.
        public var successUrl: String
        /// Where Stripe sends a buyer who goes back; none when not set (never a URL from the request).
        public var cancelUrl: String?
        /// For embedded Checkout: where Stripe returns after paying (default: `successUrl`).
        public var returnUrl: String?
        /// The link a code is redeemed with: `{code}` is replaced by it (the app's deep link).
        public var redemptionUrl: String
        /// How long a code may be redeemed, from its checkout (default 30 days).
        public var codeTTL: Duration = .seconds(30 * 86_400)
        /// The keys that seal `checkoutContextId`: the first seals, every one opens (rotation).
        public var contextKeys: [ContextKey]
        /// Stripe's publishable key (`pk_…`): with it the `embedded` directive is offered.
        public var stripePublishableKey: String?

        public struct ContextKey: Sendable {
            public var id: String
            public var key: [UInt8]

            public init(id: String, key: [UInt8]) {
                self.id = id
                self.key = key
            }
        }

        public init(successUrl: String, redemptionUrl: String, contextKeys: [ContextKey]) {
            self.successUrl = successUrl
            self.redemptionUrl = redemptionUrl
            self.contextKeys = contextKeys
        }
    }

    /// `apps[].paddle.api`: an API key that may read transactions and subscriptions.
    public struct PaddleAPI: Sendable {
        public static let productionURL = "https://api.paddle.com"
        public static let sandboxURL = "https://sandbox-api.paddle.com"
        public var apiKey: String
        /// Default: Paddle's production API, or its sandbox's with `environment: SANDBOX`.
        public var baseUrl: String
        /// The notification destination (`ntfset_…`) that sends to the relay: what `recover paddle` lists and replays.
        public var notificationSettingId: String?

        public init(apiKey: String, baseUrl: String = PaddleAPI.productionURL) {
            self.apiKey = apiKey
            self.baseUrl = baseUrl
        }
    }

    public struct Product: Sendable {
        public var productId: String
        public var store: String
        public var entitlements: [String]
    }
}
