/// The backend's value per subscription (`{store}/{originalTransactionId}`): who owns it, what it is,
/// whether it gives access, and which notification last changed it. The wire form is a JSON object
/// with these field names (the PUT body and GET response of docs/contracts.md, Backend API).
public struct SubscriptionState: Sendable, Equatable {
    public enum Status: String, Sendable, CaseIterable, Codable {
        case active = "ACTIVE"
        case inGracePeriod = "IN_GRACE_PERIOD"
        case inBillingRetry = "IN_BILLING_RETRY"
        case paused = "PAUSED"
        case expired = "EXPIRED"
        case revoked = "REVOKED"
        case refunded = "REFUNDED"
    }

    public enum PeriodType: String, Sendable, CaseIterable, Codable {
        case trial = "TRIAL"
        case intro = "INTRO"
        case normal = "NORMAL"
        case promotional = "PROMOTIONAL"
    }

    public var store: Store
    public var originalTransactionId: String
    /// The configured app's `applicationId`, so the backend knows which product mapping applies.
    public var applicationId: Int
    /// The store's app user id (Apple `appAccountToken`, ...); nil when the store gave none.
    public var originalAppUserId: String?
    /// Every app user id that owns this subscription (aliases, transfers).
    public var appUserIds: [String]
    /// The store's product id: Apple's product, Google's `productId:basePlanId` (or `productId` for
    /// one-time products), Stripe's price (`price_…`), Paddle's price (`pri_…`).
    public var productId: String
    /// The product `productId` belongs to, when the store has one: Google's subscription `productId`,
    /// Stripe's `prod_…`, Paddle's `pro_…`. A product mapping entry may name either; `productId` wins.
    public var productGroupId: String?
    public var status: Status
    public var periodType: PeriodType
    public var autoRenew: Bool
    /// Unix milliseconds.
    public var expiresAt: Int64?
    public var gracePeriodExpiresAt: Int64?
    /// `PRODUCTION` or `SANDBOX`.
    public var environment: String
    public var lastTransactionId: String?
    /// Unix milliseconds of the newest notification applied; writes never go back in this time.
    public var sourceTimestamp: Int64
    /// The backend's version; 0 for a state never written. A write names the version it read (If-Match).
    public var version: Int64
    /// The last notifications applied (newest last, bounded by the worker), so that a notification seen
    /// again changes nothing and yields the same events. `context` is the worker's own record of what it
    /// saw when it applied the notification; the backend stores it as given.
    public var recentNotifications: [RecentNotification]
    /// The last payments this subscription received (newest last, bounded by the worker): what a later
    /// refund names (an Apple transaction, a Google order, a Stripe invoice, a Paddle transaction) is
    /// looked up here for its product, purchase time and amount.
    public var transactions: [Transaction]
    /// An `expiration` was sent for the current lapse: access ended and has not come back since. The
    /// store's own later expiration of the same lapse then sends no second one.
    public var expirationSent: Bool

    /// One payment: its store id, what it bought, when, and what it cost in the purchased currency.
    public struct Transaction: Sendable, Equatable {
        public var id: String
        public var productId: String
        /// Unix milliseconds.
        public var purchasedAt: Int64?
        public var periodType: PeriodType
        /// What the customer paid, tax included, as decimal text in `currency` ("9.99"); nil when unknown.
        public var amount: String?
        public var currency: String?

        public init(id: String, productId: String, purchasedAt: Int64?, periodType: PeriodType, amount: String? = nil, currency: String? = nil) {
            self.id = id
            self.productId = productId
            self.purchasedAt = purchasedAt
            self.periodType = periodType
            self.amount = amount
            self.currency = currency
        }
    }

    /// The recorded payment with this store id.
    public func transaction(_ id: String?) -> Transaction? {
        guard let id else { return nil }
        return transactions.last { $0.id == id }
    }

    public struct RecentNotification: Sendable, Equatable {
        public var id: String
        public var context: JSON

        public init(id: String, context: JSON) {
            self.id = id
            self.context = context
        }
    }

    public init(
        store: Store, originalTransactionId: String, applicationId: Int, originalAppUserId: String? = nil, appUserIds: [String] = [],
        productId: String, productGroupId: String? = nil, status: Status, periodType: PeriodType = .normal, autoRenew: Bool = true, expiresAt: Int64? = nil,
        gracePeriodExpiresAt: Int64? = nil, environment: String = "PRODUCTION", lastTransactionId: String? = nil, sourceTimestamp: Int64,
        version: Int64 = 0, recentNotifications: [RecentNotification] = [], transactions: [Transaction] = [], expirationSent: Bool = false
    ) {
        self.store = store
        self.originalTransactionId = originalTransactionId
        self.applicationId = applicationId
        self.originalAppUserId = originalAppUserId
        self.appUserIds = appUserIds
        self.productId = productId
        self.productGroupId = productGroupId
        self.status = status
        self.periodType = periodType
        self.autoRenew = autoRenew
        self.expiresAt = expiresAt
        self.gracePeriodExpiresAt = gracePeriodExpiresAt
        self.environment = environment
        self.lastTransactionId = lastTransactionId
        self.sourceTimestamp = sourceTimestamp
        self.version = version
        self.recentNotifications = recentNotifications
        self.transactions = transactions
        self.expirationSent = expirationSent
    }

    /// Whether the subscription gives access at `now` (Unix milliseconds): active or in its grace
    /// period, and not past its expiry (or grace expiry).
    public func isActive(at now: Int64) -> Bool {
        switch status {
        case .active:
            return expiresAt.map { $0 > now } ?? true
        case .inGracePeriod:
            if let grace = gracePeriodExpiresAt { return grace > now }
            return expiresAt.map { $0 > now } ?? true
        case .inBillingRetry, .paused, .expired, .revoked, .refunded:
            return false
        }
    }

    /// The users whose entitlements this subscription feeds: its app user ids, or
    /// `$RelayAnonymous:<store>:<originalTransactionId>` when the store named none (the README's Verification section).
    public var entitlementUserIds: [String] {
        var ids = appUserIds
        if let originalAppUserId, !ids.contains(originalAppUserId) { ids.insert(originalAppUserId, at: 0) }
        return ids.isEmpty ? ["$RelayAnonymous:\(store.rawValue):\(originalTransactionId)"] : ids
    }

    /// What decoding would refuse in this state, or nil. A typed state can break only these (empty
    /// required text, an entry without its id), so checking them here spares an encode-decode round
    /// trip on every write (the in-process backend; the HTTP route decodes anyway).
    public var storageProblem: WireDecodingError? {
        if originalTransactionId.isEmpty { return WireDecodingError(field: "originalTransactionId", message: "expected a non-empty string") }
        if productId.isEmpty { return WireDecodingError(field: "productId", message: "expected a non-empty string") }
        if recentNotifications.contains(where: { $0.id.isEmpty }) {
            return WireDecodingError(field: "recentNotifications", message: Self.recentEntryRule)
        }
        if transactions.contains(where: { $0.id.isEmpty }) {
            return WireDecodingError(field: "transactions", message: Self.transactionEntryRule)
        }
        return nil
    }

    static let recentEntryRule = "every entry needs a non-empty \"id\""
    static let transactionEntryRule = "every entry needs a non-empty \"id\" and a \"productId\""
}

// MARK: - Wire form

/// The backend API's JSON object (docs/contracts.md, Backend API): every member present, `null` where
/// a value is absent. Decoding names the offending member in a `WireDecodingError`; members a
/// writer may leave out take their defaults (`periodType` NORMAL, `autoRenew` true, `version` 0).
extension SubscriptionState: Codable {
    enum CodingKeys: String, CodingKey {
        case store, originalTransactionId, applicationId, originalAppUserId, appUserIds, productId, productGroupId, status, periodType
        case autoRenew, expiresAt, gracePeriodExpiresAt, environment, lastTransactionId, sourceTimestamp, version, recentNotifications
        case transactions, expirationSent
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(store.rawValue, forKey: .store)
        try container.encode(originalTransactionId, forKey: .originalTransactionId)
        try container.encode(applicationId, forKey: .applicationId)
        try container.encode(originalAppUserId, forKey: .originalAppUserId)
        try container.encode(appUserIds, forKey: .appUserIds)
        try container.encode(productId, forKey: .productId)
        try container.encode(productGroupId, forKey: .productGroupId)
        try container.encode(status.rawValue, forKey: .status)
        try container.encode(periodType.rawValue, forKey: .periodType)
        try container.encode(autoRenew, forKey: .autoRenew)
        try container.encode(expiresAt, forKey: .expiresAt)
        try container.encode(gracePeriodExpiresAt, forKey: .gracePeriodExpiresAt)
        try container.encode(environment, forKey: .environment)
        try container.encode(lastTransactionId, forKey: .lastTransactionId)
        try container.encode(sourceTimestamp, forKey: .sourceTimestamp)
        try container.encode(version, forKey: .version)
        try container.encode(recentNotifications, forKey: .recentNotifications)
        try container.encode(transactions, forKey: .transactions)
        try container.encode(expirationSent, forKey: .expirationSent)
    }

    public init(from decoder: any Decoder) throws {
        let members = try WireMembers(decoder, keyedBy: CodingKeys.self)
        guard let store = Store(rawValue: try members.requiredText(.store)) else {
            throw WireDecodingError(field: "store", message: "expected apple, google, stripe or paddle")
        }
        guard let status = Status(rawValue: try members.requiredText(.status)) else {
            throw WireDecodingError(field: "status", message: "expected one of \(Status.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        guard let periodType = PeriodType(rawValue: try members.optional(String.self, .periodType, "a string or null") ?? PeriodType.normal.rawValue) else {
            throw WireDecodingError(field: "periodType", message: "expected one of \(PeriodType.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        guard let applicationId = try members.optional(Int.self, .applicationId, "an integer") else {
            throw WireDecodingError(field: "applicationId", message: "expected an integer")
        }
        guard let sourceTimestamp = try members.optional(Int64.self, .sourceTimestamp, "Unix milliseconds") else {
            throw WireDecodingError(field: "sourceTimestamp", message: "expected Unix milliseconds")
        }
        self.init(
            store: store, originalTransactionId: try members.requiredText(.originalTransactionId), applicationId: applicationId,
            originalAppUserId: try members.optional(String.self, .originalAppUserId, "a string or null"),
            appUserIds: try members.optional([String].self, .appUserIds, "an array of strings") ?? [],
            productId: try members.requiredText(.productId), productGroupId: try members.optional(String.self, .productGroupId, "a string or null"),
            status: status, periodType: periodType, autoRenew: try members.optional(Bool.self, .autoRenew, "a boolean") ?? true,
            expiresAt: try members.optional(Int64.self, .expiresAt, "an integer or null"),
            gracePeriodExpiresAt: try members.optional(Int64.self, .gracePeriodExpiresAt, "an integer or null"),
            environment: try members.optional(String.self, .environment, "a string or null") ?? "PRODUCTION",
            lastTransactionId: try members.optional(String.self, .lastTransactionId, "a string or null"), sourceTimestamp: sourceTimestamp,
            version: try members.optional(Int64.self, .version, "an integer or null") ?? 0,
            recentNotifications: try members.optional([RecentNotification].self, .recentNotifications, Self.recentEntryRule) ?? [],
            transactions: try members.optional([Transaction].self, .transactions, Self.transactionEntryRule) ?? [],
            expirationSent: try members.optional(Bool.self, .expirationSent, "a boolean") ?? false)
    }
}

extension SubscriptionState.Transaction: Codable {
    enum CodingKeys: String, CodingKey { case id, productId, purchasedAt, periodType, amount, currency }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(id, forKey: .id)
        try container.encode(productId, forKey: .productId)
        try container.encode(purchasedAt, forKey: .purchasedAt)
        try container.encode(periodType.rawValue, forKey: .periodType)
        try container.encode(amount, forKey: .amount)
        try container.encode(currency, forKey: .currency)
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let id = try container.decodeIfPresent(String.self, forKey: .id) ?? ""
        guard !id.isEmpty, let productId = try container.decodeIfPresent(String.self, forKey: .productId) else {
            throw WireDecodingError(field: "transactions", message: SubscriptionState.transactionEntryRule)
        }
        self.init(
            id: id, productId: productId, purchasedAt: try container.decodeIfPresent(Int64.self, forKey: .purchasedAt),
            periodType: try container.decodeIfPresent(String.self, forKey: .periodType).flatMap(SubscriptionState.PeriodType.init(rawValue:)) ?? .normal,
            amount: try container.decodeIfPresent(String.self, forKey: .amount), currency: try container.decodeIfPresent(String.self, forKey: .currency))
    }
}

extension SubscriptionState.RecentNotification: Codable {
    enum CodingKeys: String, CodingKey { case id, context }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(id, forKey: .id)
        try container.encode(context, forKey: .context)
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        guard let id = try container.decodeIfPresent(String.self, forKey: .id), !id.isEmpty else {
            throw WireDecodingError(field: "recentNotifications", message: SubscriptionState.recentEntryRule)
        }
        self.init(id: id, context: try container.decodeIfPresent(JSON.self, forKey: .context) ?? .null)
    }
}

/// Product → entitlements of one application (the config API's `products`).
public struct ProductMapping: Sendable, Equatable {
    public struct Product: Sendable, Equatable {
        public var productId: String
        /// `APP_STORE`, `PLAY_STORE`, `STRIPE` or `PADDLE`.
        public var store: String
        public var entitlements: [String]

        public init(productId: String, store: String, entitlements: [String]) {
            self.productId = productId
            self.store = store
            self.entitlements = entitlements
        }
    }

    public var products: [Product]

    public init(products: [Product]) {
        self.products = products
    }

    /// The mapping's store name for a relay store.
    public static func storeName(_ store: Store) -> String {
        switch store {
        case .apple: "APP_STORE"
        case .google: "PLAY_STORE"
        case .stripe: "STRIPE"
        case .paddle: "PADDLE"
        }
    }

    /// The entitlements a product unlocks. Google products may be mapped as `productId:basePlanId`,
    /// which wins over the plain `productId` (the README's Verification section).
    public func entitlements(store: Store, productId: String, basePlanId: String? = nil) -> [String] {
        let name = Self.storeName(store)
        if let basePlanId, let specific = products.first(where: { $0.store == name && $0.productId == "\(productId):\(basePlanId)" }) {
            return specific.entitlements
        }
        return products.first { $0.store == name && $0.productId == productId }?.entitlements ?? []
    }

    /// The entitlements a subscription's product unlocks: an entry for its `productId` (Google's
    /// `productId:basePlanId`, a Stripe or Paddle price) wins over one for its `productGroupId`.
    public func entitlements(of state: SubscriptionState) -> [String] {
        let name = Self.storeName(state.store)
        if let exact = products.first(where: { $0.store == name && $0.productId == state.productId }) { return exact.entitlements }
        if let group = state.productGroupId, let general = products.first(where: { $0.store == name && $0.productId == group }) {
            return general.entitlements
        }
        return []
    }

    public var json: JSON {
        .object([
            "products": .array(products.map { product in
                [
                    "productId": .string(product.productId), "store": .string(product.store),
                    "entitlements": .array(product.entitlements.map { ["identifier": .string($0), "type": "SERVICE_LEVEL"] }),
                ]
            })
        ])
    }

    public init?(json: JSON) {
        guard let list = json["products"]?.arrayValue else { return nil }
        var products: [Product] = []
        for item in list {
            guard let productId = item["productId"]?.stringValue, let store = item["store"]?.stringValue,
                let entitlements = item["entitlements"]?.arrayValue
            else { return nil }
            products.append(Product(productId: productId, store: store, entitlements: entitlements.compactMap { $0["identifier"]?.stringValue }))
        }
        self.products = products
    }
}
