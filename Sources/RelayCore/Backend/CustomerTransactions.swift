// The transactions and entitlements of customer info (`CustomerInfo.swift` holds the shapes' origin):
// what each subscription, one-time purchase and entitlement carries, as the SDKs decode it.

/// The SDK's `SubscriptionTransaction`, with the relay's members beside it.
public struct SubscriptionTransaction: Sendable, Equatable {
    public var transactionId: String
    public var productId: String
    /// Unix milliseconds.
    public var purchaseDate: Int64
    public var willRenew: Bool
    public var isRevoked: Bool
    public var isInGracePeriod: Bool
    public var isInBillingRetryPeriod: Bool
    public var isActive: Bool
    /// Unix milliseconds.
    public var expirationDate: Int64?
    public var offerType: SubscriptionOfferType?
    public var subscriptionGroupId: String?
    public var store: ProductStore
    /// The relay's: what the product unlocks.
    public var entitlements: [String]
    /// The relay's: the stored state, its members written beside the SDK's (`store` is the SDK's).
    public var state: SubscriptionState?

    public init(
        transactionId: String, productId: String, purchaseDate: Int64, willRenew: Bool, isRevoked: Bool, isInGracePeriod: Bool,
        isInBillingRetryPeriod: Bool, isActive: Bool, expirationDate: Int64?, offerType: SubscriptionOfferType?, subscriptionGroupId: String?,
        store: ProductStore, entitlements: [String] = [], state: SubscriptionState? = nil
    ) {
        self.transactionId = transactionId
        self.productId = productId
        self.purchaseDate = purchaseDate
        self.willRenew = willRenew
        self.isRevoked = isRevoked
        self.isInGracePeriod = isInGracePeriod
        self.isInBillingRetryPeriod = isInBillingRetryPeriod
        self.isActive = isActive
        self.expirationDate = expirationDate
        self.offerType = offerType
        self.subscriptionGroupId = subscriptionGroupId
        self.store = store
        self.entitlements = entitlements
        self.state = state
    }

    public var json: JSON {
        var object = SubscriptionState.customerInfoMembers(
            state, transactionId: transactionId, productId: productId, purchaseDate: purchaseDate, isRevoked: isRevoked, store: store,
            isActive: isActive, entitlements: entitlements)
        object["willRenew"] = .bool(willRenew)
        object["isInGracePeriod"] = .bool(isInGracePeriod)
        object["isInBillingRetryPeriod"] = .bool(isInBillingRetryPeriod)
        object["expirationDate"] = expirationDate.map(JSON.integer) ?? .null
        object["offerType"] = offerType.map { .string($0.rawValue) } ?? .null
        object["subscriptionGroupId"] = subscriptionGroupId.map(JSON.string) ?? .null
        return .object(object)
    }

    public init(json: JSON) throws(WireDecodingError) {
        let entry = try CustomerInfoMembers(json)
        self.init(
            transactionId: try entry.text("transactionId"), productId: try entry.text("productId"), purchaseDate: try entry.integer("purchaseDate"),
            willRenew: try entry.bool("willRenew"), isRevoked: try entry.bool("isRevoked"), isInGracePeriod: try entry.bool("isInGracePeriod"),
            isInBillingRetryPeriod: try entry.bool("isInBillingRetryPeriod"), isActive: try entry.bool("isActive"),
            expirationDate: try entry.optionalInteger("expirationDate"), offerType: entry.optionalText("offerType").flatMap(SubscriptionOfferType.init(rawValue:)),
            subscriptionGroupId: entry.optionalText("subscriptionGroupId"), store: ProductStore(name: try entry.text("store")),
            entitlements: entry.texts("entitlements"), state: try? SubscriptionState(customerInfoEntry: json))
    }
}

/// The SDK's `NonSubscriptionTransaction` (a one-time purchase), with the relay's members beside it.
public struct NonSubscriptionTransaction: Sendable, Equatable {
    public var transactionId: String
    public var productId: String
    /// Unix milliseconds.
    public var purchaseDate: Int64
    /// Always false from the local backend: the state does not record whether a product is consumable.
    public var isConsumable: Bool
    public var isRevoked: Bool
    public var store: ProductStore
    /// The relay's: whether the purchase gives access now (not refunded nor revoked).
    public var isActive: Bool
    /// The relay's: what the product unlocks.
    public var entitlements: [String]
    /// The relay's: the stored state, its members written beside the SDK's (`store` is the SDK's).
    public var state: SubscriptionState?

    public init(
        transactionId: String, productId: String, purchaseDate: Int64, isConsumable: Bool = false, isRevoked: Bool, store: ProductStore,
        isActive: Bool, entitlements: [String] = [], state: SubscriptionState? = nil
    ) {
        self.transactionId = transactionId
        self.productId = productId
        self.purchaseDate = purchaseDate
        self.isConsumable = isConsumable
        self.isRevoked = isRevoked
        self.store = store
        self.isActive = isActive
        self.entitlements = entitlements
        self.state = state
    }

    public var json: JSON {
        var object = SubscriptionState.customerInfoMembers(
            state, transactionId: transactionId, productId: productId, purchaseDate: purchaseDate, isRevoked: isRevoked, store: store,
            isActive: isActive, entitlements: entitlements)
        object["isConsumable"] = .bool(isConsumable)
        return .object(object)
    }

    /// An SDK-only entry (no `isActive`) is active unless revoked.
    public init(json: JSON) throws(WireDecodingError) {
        let entry = try CustomerInfoMembers(json)
        let isRevoked = try entry.bool("isRevoked")
        self.init(
            transactionId: try entry.text("transactionId"), productId: try entry.text("productId"), purchaseDate: try entry.integer("purchaseDate"),
            isConsumable: try entry.bool("isConsumable"), isRevoked: isRevoked, store: ProductStore(name: try entry.text("store")),
            isActive: try entry.optionalBool("isActive") ?? !isRevoked, entitlements: entry.texts("entitlements"),
            state: try? SubscriptionState(customerInfoEntry: json))
    }
}

/// The SDK's `Entitlement` as customer info carries it: what unlocks it and how it stands.
public struct CustomerEntitlement: Sendable, Equatable {
    public var identifier: String
    public var type = "SERVICE_LEVEL"
    public var isActive: Bool
    /// Every product that unlocks it, sorted.
    public var productIds: [String]
    /// The product of the latest subscription that unlocks it, or of the lifetime purchase that does.
    public var latestProductId: String?
    public var store: ProductStore?
    /// Unix milliseconds: the first purchase that unlocked it.
    public var startsAt: Int64?
    /// Unix milliseconds: the latest renewal.
    public var renewedAt: Int64?
    /// Unix milliseconds: when access ends; nil for a lifetime purchase.
    public var expiresAt: Int64?
    public var isLifetime: Bool?
    public var willRenew: Bool?
    public var state: LatestSubscriptionState?
    public var offerType: SubscriptionOfferType?

    public init(
        identifier: String, isActive: Bool, productIds: [String], latestProductId: String? = nil, store: ProductStore? = nil, startsAt: Int64? = nil,
        renewedAt: Int64? = nil, expiresAt: Int64? = nil, isLifetime: Bool? = nil, willRenew: Bool? = nil, state: LatestSubscriptionState? = nil,
        offerType: SubscriptionOfferType? = nil
    ) {
        self.identifier = identifier
        self.isActive = isActive
        self.productIds = productIds
        self.latestProductId = latestProductId
        self.store = store
        self.startsAt = startsAt
        self.renewedAt = renewedAt
        self.expiresAt = expiresAt
        self.isLifetime = isLifetime
        self.willRenew = willRenew
        self.state = state
        self.offerType = offerType
    }

    public var json: JSON {
        [
            "identifier": .string(identifier), "type": .string(type), "isActive": .bool(isActive), "productIds": .array(productIds.map(JSON.string)),
            "latestProductId": latestProductId.map(JSON.string) ?? .null, "store": store.map { .string($0.rawValue) } ?? .null,
            "startsAt": startsAt.map(JSON.integer) ?? .null, "renewedAt": renewedAt.map(JSON.integer) ?? .null,
            "expiresAt": expiresAt.map(JSON.integer) ?? .null, "isLifetime": isLifetime.map(JSON.bool) ?? .null,
            "willRenew": willRenew.map(JSON.bool) ?? .null, "state": state.map { .string($0.rawValue) } ?? .null,
            "offerType": offerType.map { .string($0.rawValue) } ?? .null,
        ]
    }

    /// As the SDKs read it: a missing `isActive` is false; an unknown `state` or `offerType` is absent.
    public init(json: JSON) throws(WireDecodingError) {
        let entry = try CustomerInfoMembers(json)
        self.init(
            identifier: try entry.text("identifier"), isActive: try entry.optionalBool("isActive") ?? false, productIds: entry.texts("productIds"),
            latestProductId: entry.optionalText("latestProductId"), store: entry.optionalText("store").map(ProductStore.init(name:)),
            startsAt: try entry.optionalInteger("startsAt"), renewedAt: try entry.optionalInteger("renewedAt"),
            expiresAt: try entry.optionalInteger("expiresAt"), isLifetime: try entry.optionalBool("isLifetime"),
            willRenew: try entry.optionalBool("willRenew"), state: entry.optionalText("state").flatMap(LatestSubscriptionState.init(rawValue:)),
            offerType: entry.optionalText("offerType").flatMap(SubscriptionOfferType.init(rawValue:)))
        type = try entry.text("type")
    }
}

// Through `json` and `init(json:)`: one member list, with `null` members written.
extension SubscriptionTransaction: Codable {
    public init(from decoder: any Decoder) throws { try self.init(json: try JSON(from: decoder)) }
    public func encode(to encoder: any Encoder) throws { try json.encode(to: encoder) }
}

extension NonSubscriptionTransaction: Codable {
    public init(from decoder: any Decoder) throws { try self.init(json: try JSON(from: decoder)) }
    public func encode(to encoder: any Encoder) throws { try json.encode(to: encoder) }
}

extension CustomerEntitlement: Codable {
    public init(from decoder: any Decoder) throws { try self.init(json: try JSON(from: decoder)) }
    public func encode(to encoder: any Encoder) throws { try json.encode(to: encoder) }
}

extension SubscriptionState {
    /// The relay's state in a `customerInfo` entry (the local backend writes the stored state's members
    /// beside the SDK's). Its `store` may be the SDK's name (`APP_STORE`) or the relay's (`apple`).
    public init(customerInfoEntry entry: JSON) throws(WireDecodingError) {
        guard var object = entry.objectValue else { throw WireDecodingError(field: "$", message: "expected a JSON object") }
        if let name = object["store"]?.stringValue, let store = ProductStore(rawValue: name)?.store {
            object["store"] = .string(store.rawValue)
        }
        try self.init(json: .object(object))
    }

    /// The members both kinds of customer info entry have: the state's (all but the worker's
    /// bookkeeping of recent notifications; none without a state), then the SDK's shared ones and the
    /// relay's `isActive` and `entitlements` over them.
    static func customerInfoMembers(
        _ state: SubscriptionState?, transactionId: String, productId: String, purchaseDate: Int64, isRevoked: Bool, store: ProductStore,
        isActive: Bool, entitlements: [String]
    ) -> [String: JSON] {
        var members = state?.membersExceptRecentNotifications ?? [:]
        members["transactionId"] = .string(transactionId)
        members["productId"] = .string(productId)
        members["purchaseDate"] = .integer(purchaseDate)
        members["isRevoked"] = .bool(isRevoked)
        members["store"] = .string(store.rawValue)
        members["isActive"] = .bool(isActive)
        members["entitlements"] = .array(entitlements.map(JSON.string))
        return members
    }
}
