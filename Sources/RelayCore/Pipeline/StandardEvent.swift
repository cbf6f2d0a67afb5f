/// The standardized event types (docs/contracts.md, the standardized event).
public enum EventType: String, Sendable, CaseIterable, Codable {
    case initialPurchase = "initial_purchase"
    case renewal
    case cancellation
    case uncancellation
    case expiration
    case billingIssue = "billing_issue"
    case productChange = "product_change"
    case subscriptionPaused = "subscription_paused"
    case nonRenewingPurchase = "non_renewing_purchase"
    case subscriptionExtended = "subscription_extended"
    case refundReversed = "refund_reversed"
    case subscriptionStatusDidChange = "subscription_status_did_change"
}

/// Cancellation and expiration reasons: Superwall's documented values (RevenueCat's less its Play-only
/// `SUBSCRIPTION_PAUSED`, so receivers that decode Superwall's set strictly keep working).
public enum Reason: String, Sendable, CaseIterable, Codable {
    case unsubscribe = "UNSUBSCRIBE"
    case billingError = "BILLING_ERROR"
    case developerInitiated = "DEVELOPER_INITIATED"
    case priceIncrease = "PRICE_INCREASE"
    case customerSupport = "CUSTOMER_SUPPORT"
    case productUnavailable = "PRODUCT_UNAVAILABLE"
    case unknown = "UNKNOWN"
}

/// One standardized event: the webhook payload of docs/contracts.md, the standardized event, and the value of a `relay.events`
/// record.
public struct StandardEvent: Sendable, Equatable {
    public var type: EventType
    /// `data.id`: the same store notification always yields the same id (`<store>:<notification id>:<type>`).
    public var id: String
    /// The Kafka key on `relay.events`: the subscription's subject (its `originalTransactionId`).
    public var subject: String
    /// `PRODUCTION` or `SANDBOX` (endpoints filter on it).
    public var environment: String
    public var payload: EventPayload

    public init(type: EventType, id: String, subject: String, environment: String, payload: EventPayload) {
        self.type = type
        self.id = id
        self.subject = subject
        self.environment = environment
        self.payload = payload
    }

    /// The payload's bytes, as records and webhooks carry them (members sorted, so equal events are equal
    /// bytes). Written directly (`EventPayload.serialized()`), not through JSONEncoder or a `JSON` tree: every
    /// event is encoded once on the worker's hot path: 4.2 µs per event, against 10 µs to build the tree and
    /// write it and 45 µs for JSONEncoder (`revenue-relay-bench codec`).
    public var body: [UInt8] { payload.serialized() }
}

/// `{"object": "event", "type", "projectId", "applicationId", "timestamp", "data"}`.
public struct EventPayload: Sendable, Equatable, Codable {
    public var object = "event"
    public var type: EventType
    public var projectId: Int
    public var applicationId: Int
    /// When the relay received the notification (Unix ms).
    public var timestamp: Int64
    public var data: EventData

    public init(type: EventType, projectId: Int, applicationId: Int, timestamp: Int64, data: EventData) {
        self.type = type
        self.projectId = projectId
        self.applicationId = applicationId
        self.timestamp = timestamp
        self.data = data
    }

    /// The wire form; `encode(to:)` writes the same.
    public var json: JSON {
        [
            "object": .string(object), "type": .string(type.rawValue), "projectId": .integer(Int64(projectId)),
            "applicationId": .integer(Int64(applicationId)), "timestamp": .integer(timestamp), "data": data.json,
        ]
    }

    public func encode(to encoder: any Encoder) throws { try json.encode(to: encoder) }
}

/// An event's `data`: a store event's, or a `subscription_status_did_change`'s. Decoding tells them
/// apart by `name`.
public enum EventData: Sendable, Equatable, Codable {
    case store(StoreEventData)
    case statusChange(StatusChangeData)

    public var id: String {
        switch self {
        case .store(let data): data.id
        case .statusChange(let data): data.id
        }
    }

    public var storeEvent: StoreEventData? {
        if case .store(let data) = self { return data }
        return nil
    }

    public var statusChange: StatusChangeData? {
        if case .statusChange(let data) = self { return data }
        return nil
    }

    private enum NameKey: String, CodingKey { case name }

    public init(from decoder: any Decoder) throws {
        let name = try decoder.container(keyedBy: NameKey.self).decode(EventType.self, forKey: .name)
        self = name == .subscriptionStatusDidChange ? .statusChange(try StatusChangeData(from: decoder)) : .store(try StoreEventData(from: decoder))
    }

    public var json: JSON {
        switch self {
        case .store(let data): data.json
        case .statusChange(let data): data.json
        }
    }

    public func encode(to encoder: any Encoder) throws { try json.encode(to: encoder) }
}

/// `data` of every event but `subscription_status_did_change`. Every member is always present, `null`
/// when the store does not say (receivers written for Superwall's format expect the keys).
public struct StoreEventData: Sendable, Equatable, Codable {
    public var id: String
    public var name: EventType
    public var cancelReason: Reason?
    public var expirationReason: Reason?
    /// Units of the purchased currency per USD; null when the event moves no money or no rate is known.
    public var exchangeRate: Double?
    public var isSmallBusiness: Bool
    public var periodType: SubscriptionState.PeriodType
    public var countryCode: String?
    /// USD, tax included; negative for refunds.
    public var price: Double?
    public var proceeds: Double?
    public var priceInPurchasedCurrency: Double?
    public var currencyCode: String?
    public var taxPercentage: Double?
    public var commissionPercentage: Double
    public var takehomePercentage: Double
    public var offerCode: String?
    public var isFamilyShare: Bool
    public var expirationAt: Int64?
    public var transactionId: String?
    public var originalTransactionId: String
    public var originalAppUserId: String?
    /// `APP_STORE`, `PLAY_STORE`, `STRIPE` or `PADDLE`.
    public var store: String
    public var purchasedAt: Int64?
    public var productId: String?
    public var environment: String
    public var isTrialConversion: Bool
    public var newProductId: String?
    public var bundleId: String?
    /// The store's time of the notification (Unix ms).
    public var ts: Int64
    public var sdkEvents: [String]
    /// The entitlements of the event's product.
    public var entitlements: [EntitlementReference]
    /// The user's status after the event.
    public var subscriptionStatus: SubscriptionStatus
    public var gracePeriodExpiresAt: Int64?
    public var source: EventSource
    /// The subscription's sequence number: grows with each notification the relay applies to the
    /// subscription (the version of its state that notification wrote), the same for every event of one
    /// notification and on every redelivery. A receiver that gets events of one subscription out of order
    /// keeps the status of the highest. Null for an event that names no subscription the relay holds.
    /// An addition to Superwall's format.
    public var sequence: Int64?
    /// The user's attributes (`PUT .../users/{id}/attributes`), when the user has any: Superwall's Webhooks V2 field.
    public var userAttributes: [String: JSON]?
    /// The user's other ids (linked with `aliases`), when it has any.
    public var aliases: [String]?
    /// The app user who had the subscription before a purchase handed over by this event's user moved it
    /// (`apps[].transferPolicy: transfer`); only on a transfer's events. An addition to Superwall's format.
    public var transferredFrom: String?

    public init(
        id: String, name: EventType, cancelReason: Reason?, expirationReason: Reason?, exchangeRate: Double?,
        isSmallBusiness: Bool, periodType: SubscriptionState.PeriodType, countryCode: String?, price: Double?,
        proceeds: Double?, priceInPurchasedCurrency: Double?, currencyCode: String?, taxPercentage: Double?,
        commissionPercentage: Double, takehomePercentage: Double, offerCode: String?, isFamilyShare: Bool,
        expirationAt: Int64?, transactionId: String?, originalTransactionId: String, originalAppUserId: String?, store: String,
        purchasedAt: Int64?, productId: String?, environment: String, isTrialConversion: Bool, newProductId: String?,
        bundleId: String?, ts: Int64, sdkEvents: [String], entitlements: [EntitlementReference],
        subscriptionStatus: SubscriptionStatus, gracePeriodExpiresAt: Int64?, source: EventSource
    ) {
        self.id = id
        self.name = name
        self.cancelReason = cancelReason
        self.expirationReason = expirationReason
        self.exchangeRate = exchangeRate
        self.isSmallBusiness = isSmallBusiness
        self.periodType = periodType
        self.countryCode = countryCode
        self.price = price
        self.proceeds = proceeds
        self.priceInPurchasedCurrency = priceInPurchasedCurrency
        self.currencyCode = currencyCode
        self.taxPercentage = taxPercentage
        self.commissionPercentage = commissionPercentage
        self.takehomePercentage = takehomePercentage
        self.offerCode = offerCode
        self.isFamilyShare = isFamilyShare
        self.expirationAt = expirationAt
        self.transactionId = transactionId
        self.originalTransactionId = originalTransactionId
        self.originalAppUserId = originalAppUserId
        self.store = store
        self.purchasedAt = purchasedAt
        self.productId = productId
        self.environment = environment
        self.isTrialConversion = isTrialConversion
        self.newProductId = newProductId
        self.bundleId = bundleId
        self.ts = ts
        self.sdkEvents = sdkEvents
        self.entitlements = entitlements
        self.subscriptionStatus = subscriptionStatus
        self.gracePeriodExpiresAt = gracePeriodExpiresAt
        self.source = source
    }

    /// The wire form: every member, `null` where absent; `encode(to:)` writes the same.
    public var json: JSON {
        let members: JSON = [
            "id": .string(id),
            "name": .string(name.rawValue),
            "cancelReason": cancelReason.map { .string($0.rawValue) } ?? .null,
            "expirationReason": expirationReason.map { .string($0.rawValue) } ?? .null,
            "exchangeRate": exchangeRate.map(JSON.number) ?? .null,
            "isSmallBusiness": .bool(isSmallBusiness),
            "periodType": .string(periodType.rawValue),
            "countryCode": countryCode.map(JSON.string) ?? .null,
            "price": price.map(JSON.number) ?? .null,
            "proceeds": proceeds.map(JSON.number) ?? .null,
            "priceInPurchasedCurrency": priceInPurchasedCurrency.map(JSON.number) ?? .null,
            "currencyCode": currencyCode.map(JSON.string) ?? .null,
            "taxPercentage": taxPercentage.map(JSON.number) ?? .null,
            "commissionPercentage": .number(commissionPercentage),
            "takehomePercentage": .number(takehomePercentage),
            "offerCode": offerCode.map(JSON.string) ?? .null,
            "isFamilyShare": .bool(isFamilyShare),
            "expirationAt": expirationAt.map(JSON.integer) ?? .null,
            "transactionId": transactionId.map(JSON.string) ?? .null,
            "originalTransactionId": .string(originalTransactionId),
            "originalAppUserId": originalAppUserId.map(JSON.string) ?? .null,
            "store": .string(store),
            "purchasedAt": purchasedAt.map(JSON.integer) ?? .null,
            "productId": productId.map(JSON.string) ?? .null,
            "environment": .string(environment),
            "isTrialConversion": .bool(isTrialConversion),
            "newProductId": newProductId.map(JSON.string) ?? .null,
            "bundleId": bundleId.map(JSON.string) ?? .null,
            "ts": .integer(ts),
            "sdkEvents": .array(sdkEvents.map(JSON.string)),
            "entitlements": .array(entitlements.map(\.json)),
            "subscriptionStatus": subscriptionStatus.json,
            "gracePeriodExpiresAt": gracePeriodExpiresAt.map(JSON.integer) ?? .null,
            "source": source.json,
            "sequence": sequence.map(JSON.integer) ?? .null,
        ]
        return members.adding(userAttributes: userAttributes, aliases: aliases, transferredFrom: transferredFrom)
    }

    public func encode(to encoder: any Encoder) throws { try json.encode(to: encoder) }
}

extension JSON {
    /// The event data with the user's attributes and other ids, when it has any, and the user a transfer
    /// took the subscription from (members only then, so
    /// events of users without them keep the shape receivers know).
    func adding(userAttributes: [String: JSON]?, aliases: [String]?, transferredFrom: String?) -> JSON {
        guard case .object(var members) = self else { return self }
        if let transferredFrom { members["transferredFrom"] = .string(transferredFrom) }
        if let userAttributes, !userAttributes.isEmpty { members["userAttributes"] = .object(userAttributes) }
        if let aliases, !aliases.isEmpty { members["aliases"] = .array(aliases.map(JSON.string)) }
        return .object(members)
    }
}

/// `data` of `subscription_status_did_change`: the user's access before and after.
public struct StatusChangeData: Sendable, Equatable, Codable {
    public var id: String
    public var name: EventType
    public var appUserId: String
    public var originalAppUserId: String?
    public var from: SubscriptionStatus
    public var to: SubscriptionStatus
    public var store: String
    public var environment: String
    public var originalTransactionId: String
    public var productId: String?
    public var ts: Int64
    public var sdkEvents: [String]
    public var entitlements: [EntitlementReference]
    public var subscriptionStatus: SubscriptionStatus
    public var source: EventSource
    /// As `StoreEventData.sequence`.
    public var sequence: Int64?
    /// As `StoreEventData.userAttributes`, `aliases` and `transferredFrom`.
    public var userAttributes: [String: JSON]?
    public var aliases: [String]?
    public var transferredFrom: String?

    public init(
        id: String, appUserId: String, originalAppUserId: String?, from: SubscriptionStatus, to: SubscriptionStatus, store: String,
        environment: String, originalTransactionId: String, productId: String?, ts: Int64, sdkEvents: [String], source: EventSource
    ) {
        self.id = id
        self.name = .subscriptionStatusDidChange
        self.appUserId = appUserId
        self.originalAppUserId = originalAppUserId
        self.from = from
        self.to = to
        self.store = store
        self.environment = environment
        self.originalTransactionId = originalTransactionId
        self.productId = productId
        self.ts = ts
        self.sdkEvents = sdkEvents
        self.entitlements = to.entitlements
        self.subscriptionStatus = to
        self.source = source
    }

    /// The wire form: every member, `null` where absent; `encode(to:)` writes the same.
    public var json: JSON {
        let members: JSON = [
            "id": .string(id),
            "name": .string(name.rawValue),
            "appUserId": .string(appUserId),
            "originalAppUserId": originalAppUserId.map(JSON.string) ?? .null,
            "from": from.json,
            "to": to.json,
            "store": .string(store),
            "environment": .string(environment),
            "originalTransactionId": .string(originalTransactionId),
            "productId": productId.map(JSON.string) ?? .null,
            "ts": .integer(ts),
            "sdkEvents": .array(sdkEvents.map(JSON.string)),
            "entitlements": .array(entitlements.map(\.json)),
            "subscriptionStatus": subscriptionStatus.json,
            "source": source.json,
            "sequence": sequence.map(JSON.integer) ?? .null,
        ]
        return members.adding(userAttributes: userAttributes, aliases: aliases, transferredFrom: transferredFrom)
    }

    public func encode(to encoder: any Encoder) throws { try json.encode(to: encoder) }
}

/// The store notification an event came from.
public struct EventSource: Sendable, Equatable, Codable {
    public var store: Store
    public var notificationId: String?
    public var type: String?
    public var subtype: String?

    public init(store: Store, notificationId: String?, type: String?, subtype: String?) {
        self.store = store
        self.notificationId = notificationId
        self.type = type
        self.subtype = subtype
    }

    /// The wire form: every member, `null` where absent; `encode(to:)` writes the same.
    public var json: JSON {
        [
            "store": .string(store.rawValue),
            "notificationId": notificationId.map(JSON.string) ?? .null,
            "type": type.map(JSON.string) ?? .null,
            "subtype": subtype.map(JSON.string) ?? .null,
        ]
    }

    public func encode(to encoder: any Encoder) throws { try json.encode(to: encoder) }
}

/// `{"id": "pro", "type": "SERVICE_LEVEL"}`.
public struct EntitlementReference: Sendable, Equatable, Codable {
    public var id: String
    public var type = "SERVICE_LEVEL"

    public init(id: String) { self.id = id }

    public var json: JSON { ["id": .string(id), "type": .string(type)] }
}

/// The SDK's `subscriptionStatus` shape: `{"status": "UNKNOWN"|"INACTIVE"|"ACTIVE", "entitlements": [...]}`.
public struct SubscriptionStatus: Sendable, Equatable, Codable {
    public enum Status: String, Sendable, Codable {
        case unknown = "UNKNOWN"
        case inactive = "INACTIVE"
        case active = "ACTIVE"
    }

    public var status: Status
    /// Sorted by id.
    public var entitlements: [EntitlementReference]

    public init(entitlements identifiers: some Sequence<String>) {
        entitlements = Set(identifiers).sorted().map(EntitlementReference.init(id:))
        status = entitlements.isEmpty ? .inactive : .active
    }

    public var json: JSON { ["status": .string(status.rawValue), "entitlements": .array(entitlements.map(\.json))] }

    /// A notification that names neither a known subscription nor a user cannot say the user's status.
    public static let unknown = SubscriptionStatus(status: .unknown, entitlements: [])

    private init(status: Status, entitlements: [EntitlementReference]) {
        self.status = status
        self.entitlements = entitlements
    }
}
