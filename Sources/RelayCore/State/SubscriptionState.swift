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
    /// Further app users this subscription feeds (a grandfathering grant's user).
    public var appUserIds: [String]
    /// The app user who has this subscription now, when an app decided it rather than the store: set when
    /// an app handed the purchase over (`POST .../users/{id}/purchases`) and the store named another user
    /// or a transfer moved it (`apps[].transferPolicy: transfer`). When set, the subscription feeds this user
    /// alone; `originalAppUserId` stays what the store carried.
    public var ownerAppUserId: String?
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
    /// The subscription that replaced this one (Google: the purchase token whose `linkedPurchaseToken`
    /// names this one, after a plan change). A replaced subscription gives no access from the moment it
    /// is replaced, whatever the store still says of it: the replacing one carries the access.
    public var replacedBy: String?

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
        /// The event that recorded it (`initial_purchase`, `renewal`, `non_renewing_purchase`); nil in states
        /// written before it was kept.
        public var kind: String?

        public init(
            id: String, productId: String, purchasedAt: Int64?, periodType: PeriodType, amount: String? = nil, currency: String? = nil, kind: String? = nil
        ) {
            self.id = id
            self.productId = productId
            self.purchasedAt = purchasedAt
            self.periodType = periodType
            self.amount = amount
            self.currency = currency
            self.kind = kind
        }

        var json: JSON {
            var members: [String: JSON] = [
                "id": .string(id), "productId": .string(productId), "purchasedAt": purchasedAt.map(JSON.integer) ?? .null,
                "periodType": .string(periodType.rawValue), "amount": amount.map(JSON.string) ?? .null, "currency": currency.map(JSON.string) ?? .null,
            ]
            if let kind { members["kind"] = .string(kind) }
            return .object(members)
        }

        init?(json: JSON) {
            guard let id = json["id"]?.stringValue, !id.isEmpty, let productId = json["productId"]?.stringValue else { return nil }
            self.init(
                id: id, productId: productId, purchasedAt: json["purchasedAt"]?.int64Value,
                periodType: json["periodType"]?.stringValue.flatMap(PeriodType.init(rawValue:)) ?? .normal,
                amount: json["amount"]?.stringValue, currency: json["currency"]?.stringValue, kind: json["kind"]?.stringValue)
        }
    }

    /// The recorded payment with this store id.
    public func transaction(_ id: String?) -> Transaction? {
        guard let id else { return nil }
        return transactions.last { $0.id == id }
    }

    public struct RecentNotification: Sendable, Equatable {
        public var id: String
        /// The worker's record of what it saw. A state read from its serialized form keeps each context as
        /// its bytes until it is read (once a notification comes again), and writes them back as they were.
        public var context: JSON {
            get {
                switch storage {
                case .value(let value): value
                // Bytes checked as JSON when the state was read.
                case .serialized(let bytes): (try? JSON.parse(bytes)) ?? .null
                }
            }
            set { storage = .value(newValue) }
        }
        private var storage: Storage

        private enum Storage: Sendable {
            case value(JSON)
            case serialized([UInt8])
        }

        public init(id: String, context: JSON) {
            self.id = id
            self.storage = .value(context)
        }

        init(id: String, serializedContext: [UInt8]) {
            self.id = id
            self.storage = .serialized(serializedContext)
        }

        /// Appends the context's JSON: its bytes as read, or its value serialized.
        func writeContext(to output: inout [UInt8]) {
            switch storage {
            case .value(let value): value.write(to: &output)
            case .serialized(let bytes): output.append(contentsOf: bytes)
            }
        }

        public static func == (lhs: RecentNotification, rhs: RecentNotification) -> Bool {
            guard lhs.id == rhs.id else { return false }
            if case .serialized(let left) = lhs.storage, case .serialized(let right) = rhs.storage, left == right { return true }
            return lhs.context == rhs.context
        }
    }

    public init(
        store: Store, originalTransactionId: String, applicationId: Int, originalAppUserId: String? = nil, appUserIds: [String] = [],
        productId: String, productGroupId: String? = nil, status: Status, periodType: PeriodType = .normal, autoRenew: Bool = true, expiresAt: Int64? = nil,
        gracePeriodExpiresAt: Int64? = nil, environment: String = "PRODUCTION", lastTransactionId: String? = nil, sourceTimestamp: Int64,
        version: Int64 = 0, recentNotifications: [RecentNotification] = [], transactions: [Transaction] = [], expirationSent: Bool = false,
        replacedBy: String? = nil, ownerAppUserId: String? = nil
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
        self.replacedBy = replacedBy
        self.ownerAppUserId = ownerAppUserId
    }

    /// Whether the subscription gives access at `now` (Unix milliseconds): active or in its grace
    /// period, and not past its expiry (or grace expiry).
    public func isActive(at now: Int64) -> Bool {
        guard replacedBy == nil else { return false }
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

    /// The users whose entitlements this subscription feeds: its owner when an app set one, else its app user ids, or
    /// `$RelayAnonymous:<store>:<originalTransactionId>` when the store named none (docs/normalization.md).
    public var entitlementUserIds: [String] {
        if let ownerAppUserId { return [ownerAppUserId] }
        var ids = appUserIds
        if let originalAppUserId, !ids.contains(originalAppUserId) { ids.insert(originalAppUserId, at: 0) }
        return ids.isEmpty ? ["\(Self.anonymousUserPrefix)\(store.rawValue):\(originalTransactionId)"] : ids
    }

    /// How the id of a subscription's anonymous user starts (`entitlementUserIds`).
    public static let anonymousUserPrefix = "$RelayAnonymous:"

    /// Whether `id` is the id `entitlementUserIds` gives a subscription whose store named no user.
    public static func isAnonymous(_ id: String) -> Bool { id.hasPrefix(anonymousUserPrefix) }

    /// The first user it entitles, unless that is its anonymous id: the user its events are about.
    public var entitledUser: String? { entitlementUserIds.first.flatMap { Self.isAnonymous($0) ? nil : $0 } }

    // MARK: Wire form

    // The state's wire form is written by hand over `JSON`, not by Foundation's coders: a subscription
    // that has renewed a while holds 16 remembered notifications, each with its context (a JSON value),
    // and it is read and written once per notification. Measured (`revenue-relay-bench codec`, release,
    // a 10.5 KB state): by hand 125 µs to decode and 97 µs to encode; JSONDecoder 1,226–1,615 µs, because
    // Codable decodes an untyped value by trying each type in turn; with the contexts typed as well
    // (commit 400c7f2), still 210 µs to decode and 250 µs to encode: 12% more of the 1.7 ms of CPU a
    // notification costs end to end. `Codable` below goes through this same code: one member list.

    /// The backend API's JSON object (docs/contracts.md, Backend API): every member present, `null`
    /// where a value is absent.
    public var json: JSON {
        var object = membersExceptRecentNotifications
        object["recentNotifications"] = .array(recentNotifications.map { ["id": .string($0.id), "context": $0.context] })
        return .object(object)
    }

    /// `json`'s bytes, written without parsing the contexts kept as bytes: the form the local backend stores.
    /// A context read by `init(serialized:)` goes out as it came in, so this equals `json.serialized()` for
    /// bytes the relay wrote (its own form reads back and writes again unchanged).
    public func serialized() -> [UInt8] {
        JSON.serializedObject(membersExceptRecentNotifications, splicing: "recentNotifications") { output in
            JSON.writeArray(recentNotifications, to: &output) { recent, output in
                // The members in `serialized()`'s order: "context" before "id".
                output.append(contentsOf: #"{"context":"#.utf8)
                recent.writeContext(to: &output)
                output.append(contentsOf: #","id":"#.utf8)
                JSON.writeString(recent.id, to: &output)
                output.append(UInt8(ascii: "}"))
            }
        }
    }

    /// Parses a state's serialized form (`serialized()`, `json`'s bytes), keeping each remembered context
    /// as its bytes until it is read.
    public init(serialized bytes: [UInt8]) throws {
        let (value, contexts) = try JSON.parse(bytes, deferring: "context", under: "recentNotifications")
        try self.init(json: value, deferredContexts: contexts)
    }

    /// `json`'s members but `recentNotifications` (the worker's bookkeeping).
    var membersExceptRecentNotifications: [String: JSON] {
        var object: [String: JSON] = [
            "store": .string(store.rawValue), "originalTransactionId": .string(originalTransactionId),
            "applicationId": .integer(Int64(applicationId)), "appUserIds": .array(appUserIds.map(JSON.string)),
            "productId": .string(productId), "status": .string(status.rawValue), "periodType": .string(periodType.rawValue),
            "autoRenew": .bool(autoRenew), "environment": .string(environment), "sourceTimestamp": .integer(sourceTimestamp),
            "version": .integer(version),
        ]
        object["originalAppUserId"] = originalAppUserId.map(JSON.string) ?? .null
        object["expiresAt"] = expiresAt.map(JSON.integer) ?? .null
        object["gracePeriodExpiresAt"] = gracePeriodExpiresAt.map(JSON.integer) ?? .null
        object["lastTransactionId"] = lastTransactionId.map(JSON.string) ?? .null
        object["productGroupId"] = productGroupId.map(JSON.string) ?? .null
        object["transactions"] = .array(transactions.map(\.json))
        object["expirationSent"] = .bool(expirationSent)
        object["replacedBy"] = replacedBy.map(JSON.string) ?? .null
        object["ownerAppUserId"] = ownerAppUserId.map(JSON.string) ?? .null
        return object
    }

    /// What `init(json:)` would refuse in this state's own JSON, or nil. A typed state can break only
    /// these (empty required text, an entry without its id), so checking them here spares a JSON round
    /// trip on every write (the in-process backend; the HTTP route decodes anyway).
    public var storageProblem: WireDecodingError? {
        if originalTransactionId.isEmpty { return WireDecodingError(field: "originalTransactionId", message: "expected a non-empty string") }
        if productId.isEmpty { return WireDecodingError(field: "productId", message: "expected a non-empty string") }
        if recentNotifications.contains(where: { $0.id.isEmpty }) {
            return WireDecodingError(field: "recentNotifications", message: "every entry needs a non-empty \"id\"")
        }
        if transactions.contains(where: { $0.id.isEmpty }) {
            return WireDecodingError(field: "transactions", message: "every entry needs a non-empty \"id\" and a \"productId\"")
        }
        return nil
    }

    public init(json: JSON) throws(WireDecodingError) {
        try self.init(json: json, deferredContexts: [:])
    }

    /// - Parameter deferredContexts: the bytes of contexts `JSON.parse(_:deferring:under:)` kept, by entry.
    private init(json: JSON, deferredContexts: [Int: [UInt8]]) throws(WireDecodingError) {
        guard case .object(let object) = json else { throw WireDecodingError(field: "$", message: "expected a JSON object") }
        func string(_ key: String) throws(WireDecodingError) -> String {
            guard let value = object[key]?.stringValue, !value.isEmpty else { throw WireDecodingError(field: key, message: "expected a non-empty string") }
            return value
        }
        func optionalString(_ key: String) throws(WireDecodingError) -> String? {
            guard let value = object[key], !value.isNull else { return nil }
            guard let text = value.stringValue else { throw WireDecodingError(field: key, message: "expected a string or null") }
            return text
        }
        func optionalInteger(_ key: String) throws(WireDecodingError) -> Int64? {
            guard let value = object[key], !value.isNull else { return nil }
            guard let number = value.int64Value else { throw WireDecodingError(field: key, message: "expected an integer or null") }
            return number
        }
        guard let store = Store(rawValue: try string("store")) else {
            throw WireDecodingError(field: "store", message: "expected apple, google, stripe or paddle")
        }
        guard let status = Status(rawValue: try string("status")) else {
            throw WireDecodingError(field: "status", message: "expected one of \(Status.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        let periodText = try optionalString("periodType") ?? PeriodType.normal.rawValue
        guard let periodType = PeriodType(rawValue: periodText) else {
            throw WireDecodingError(field: "periodType", message: "expected one of \(PeriodType.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        guard let applicationId = object["applicationId"]?.int64Value, let application = Int(exactly: applicationId) else {
            throw WireDecodingError(field: "applicationId", message: "expected an integer")
        }
        guard let sourceTimestamp = object["sourceTimestamp"]?.int64Value else {
            throw WireDecodingError(field: "sourceTimestamp", message: "expected Unix milliseconds")
        }
        var appUserIds: [String] = []
        if let value = object["appUserIds"], !value.isNull {
            guard let list = value.arrayValue, list.allSatisfy({ $0.stringValue != nil }) else {
                throw WireDecodingError(field: "appUserIds", message: "expected an array of strings")
            }
            appUserIds = list.compactMap(\.stringValue)
        }
        var recent: [RecentNotification] = []
        if let value = object["recentNotifications"], !value.isNull {
            guard let list = value.arrayValue else { throw WireDecodingError(field: "recentNotifications", message: "expected an array") }
            for (position, entry) in list.enumerated() {
                guard let id = entry["id"]?.stringValue, !id.isEmpty else {
                    throw WireDecodingError(field: "recentNotifications", message: "every entry needs a non-empty \"id\"")
                }
                if let bytes = deferredContexts[position] {
                    recent.append(RecentNotification(id: id, serializedContext: bytes))
                } else {
                    recent.append(RecentNotification(id: id, context: entry["context"] ?? .null))
                }
            }
        }
        var transactions: [Transaction] = []
        if let value = object["transactions"], !value.isNull {
            guard let list = value.arrayValue else { throw WireDecodingError(field: "transactions", message: "expected an array") }
            for entry in list {
                guard let transaction = Transaction(json: entry) else {
                    throw WireDecodingError(field: "transactions", message: "every entry needs a non-empty \"id\" and a \"productId\"")
                }
                transactions.append(transaction)
            }
        }
        var expirationSent = false
        if let value = object["expirationSent"], !value.isNull {
            guard let flag = value.boolValue else { throw WireDecodingError(field: "expirationSent", message: "expected a boolean") }
            expirationSent = flag
        }
        var autoRenew = true
        if let value = object["autoRenew"], !value.isNull {
            guard let flag = value.boolValue else { throw WireDecodingError(field: "autoRenew", message: "expected a boolean") }
            autoRenew = flag
        }
        self.init(
            store: store, originalTransactionId: try string("originalTransactionId"), applicationId: application,
            originalAppUserId: try optionalString("originalAppUserId"), appUserIds: appUserIds, productId: try string("productId"),
            productGroupId: try optionalString("productGroupId"), status: status, periodType: periodType, autoRenew: autoRenew, expiresAt: try optionalInteger("expiresAt"),
            gracePeriodExpiresAt: try optionalInteger("gracePeriodExpiresAt"), environment: try optionalString("environment") ?? "PRODUCTION",
            lastTransactionId: try optionalString("lastTransactionId"), sourceTimestamp: sourceTimestamp,
            version: try optionalInteger("version") ?? 0, recentNotifications: recent, transactions: transactions,
            expirationSent: expirationSent, replacedBy: try optionalString("replacedBy"), ownerAppUserId: try optionalString("ownerAppUserId"))
    }
}

/// For a state inside a typed model (the 409 body, a notification's applied context): through
/// `json` and `init(json:)`, the one member list.
extension SubscriptionState: Codable {
    public init(from decoder: any Decoder) throws {
        try self.init(json: try JSON(from: decoder))
    }

    public func encode(to encoder: any Encoder) throws {
        try json.encode(to: encoder)
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
        case .promotional: "PROMOTIONAL"
        }
    }

    /// The entitlements a product unlocks. Google products may be mapped as `productId:basePlanId`,
    /// which wins over the plain `productId` (docs/normalization.md).
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
        // A promotional grant is of its entitlement alone, configured as a product or not.
        if state.store == .promotional { return PromotionalGrant.entitlement(ofProductId: state.productId).map { [$0] } ?? [] }
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
