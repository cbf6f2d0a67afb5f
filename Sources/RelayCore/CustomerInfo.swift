// The shapes of Superwall's SDK `CustomerInfo` (SuperwallKit `Models/Customer Info/*.swift` and
// `Entitlement.swift`; Superwall-Android `models/customer/*.kt`, `models/entitlements/Entitlement.kt`): the
// members the SDKs decode from `GET /subscriptions-api/public/v1/users/{id}/entitlements`, with their JSON
// keys. Dates are Unix milliseconds, as the SDKs' subscriptions-API decoders read them. Every member is
// written, `null` where a value is absent (both SDKs read `null` as absent).
//
// The local backend adds members of its own beside the SDK's (the SDKs ignore unknown members): each
// entry's stored subscription state (`SubscriptionState.json` but `recentNotifications`; its `store` is
// the SDK's `APP_STORE`, not the state's `apple`), `isActive` on one-time purchases, and the entitlements
// each entry's product unlocks.

/// The entitlements route's answer: the active entitlements (`{"identifier", "type"}`, as before customer
/// info existed) and the customer info.
public struct UserEntitlements: Sendable, Equatable, Codable {
    /// The active entitlements, sorted by identifier.
    public var entitlements: [EntitlementIdentifier]
    public var customerInfo: CustomerInfo

    public init(entitlements: [EntitlementIdentifier], customerInfo: CustomerInfo) {
        self.entitlements = entitlements
        self.customerInfo = customerInfo
    }

    /// Written by hand: a worker beside a remote backend reads this for every notification with a user,
    /// and `JSONEncoder` costs about four times `JSON.serialized()` (`revenue-relay-bench codec`).
    /// `CustomerInfoTests` checks that it matches the `Codable` form byte for byte.
    public var json: JSON {
        ["entitlements": .array(entitlements.map(\.json)), "customerInfo": customerInfo.json]
    }
}

/// `{"identifier": "pro", "type": "SERVICE_LEVEL"}` (the backend API's and the SDK's; events say `id`).
public struct EntitlementIdentifier: Sendable, Equatable, Codable {
    public var identifier: String
    public var type = "SERVICE_LEVEL"

    public init(_ identifier: String) { self.identifier = identifier }

    public var json: JSON { ["identifier": .string(identifier), "type": .string(type)] }
}

/// The SDK's `CustomerInfo`: `{"subscriptions", "nonSubscriptions", "entitlements"}`.
public struct CustomerInfo: Sendable, Equatable, Codable {
    /// Auto-renewing subscriptions, by purchase date, oldest first.
    public var subscriptions: [SubscriptionTransaction]
    /// One-time purchases, by purchase date, oldest first.
    public var nonSubscriptions: [NonSubscriptionTransaction]
    /// Every entitlement a subscription or purchase of the user unlocks, active or not, sorted by identifier.
    public var entitlements: [CustomerEntitlement]

    public init(subscriptions: [SubscriptionTransaction] = [], nonSubscriptions: [NonSubscriptionTransaction] = [], entitlements: [CustomerEntitlement] = []) {
        self.subscriptions = subscriptions
        self.nonSubscriptions = nonSubscriptions
        self.entitlements = entitlements
    }

    public var json: JSON {
        [
            "subscriptions": .array(subscriptions.map(\.json)), "nonSubscriptions": .array(nonSubscriptions.map(\.json)),
            "entitlements": .array(entitlements.map(\.json)),
        ]
    }
}

/// The SDK's `ProductStore` (`EntitlementStore`): `APP_STORE`, `PLAY_STORE`, `STRIPE`, `PADDLE`, ...
public enum ProductStore: String, Sendable, CaseIterable {
    case appStore = "APP_STORE"
    case playStore = "PLAY_STORE"
    case stripe = "STRIPE"
    case paddle = "PADDLE"
    case superwall = "SUPERWALL"
    case custom = "CUSTOM"
    case other = "OTHER"

    public init(_ store: Store) {
        self =
            switch store {
            case .apple: .appStore
            case .google: .playStore
            case .stripe: .stripe
            case .paddle: .paddle
            }
    }

    /// The relay's store, for the four it handles.
    public var store: Store? {
        switch self {
        case .appStore: .apple
        case .playStore: .google
        case .stripe: .stripe
        case .paddle: .paddle
        case .superwall, .custom, .other: nil
        }
    }

    /// The SDK's name, or the relay's (`apple`), as the store it names; any other text is `OTHER` (as SuperwallKit reads it).
    public init(name: String) {
        self = ProductStore(rawValue: name) ?? Store(rawValue: name).map(ProductStore.init) ?? .other
    }
}

extension ProductStore: Codable {
    public init(from decoder: any Decoder) throws {
        self.init(name: try decoder.singleValueContainer().decode(String.self))
    }

    public func encode(to encoder: any Encoder) throws {
        var single = encoder.singleValueContainer()
        try single.encode(rawValue)
    }
}

/// SuperwallKit's `LatestSubscription.State`: where the latest subscription period stands.
public enum LatestSubscriptionState: String, Sendable, CaseIterable, Codable {
    case subscribed
    case inGracePeriod
    case inBillingRetryPeriod
    case expired
    case revoked
}

/// SuperwallKit's `LatestSubscription.OfferType`: the offer the current period was bought with.
public enum SubscriptionOfferType: String, Sendable, CaseIterable, Codable {
    case trial
    case code
    case promotional
    case winback
}

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
        var members = state?.json.objectValue ?? [:]
        members["recentNotifications"] = nil
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

// MARK: - Products

/// The products route's answer, in the shape of Superwall's `GET /subscriptions-api/public/v1/products`
/// (SuperwallKit `Network/V2ProductsResponse.swift`, Superwall-Android `SuperwallProduct.kt`): `{"data": [...]}`.
public struct ProductCatalog: Sendable, Equatable, Codable {
    public var data: [CatalogProduct]

    public init(data: [CatalogProduct]) {
        self.data = data
    }

    public var json: JSON { ["data": .array(data.map(\.json))] }
}

/// One configured product: SuperwallKit's `SuperwallProduct` members, with the relay's `store` and
/// `applicationId` beside them. The configuration holds no prices: `price` and `subscription` are null.
public struct CatalogProduct: Sendable, Equatable {
    public var identifier: String
    public var store: ProductStore
    public var applicationId: Int
    public var entitlements: [EntitlementIdentifier]
    /// SuperwallKit requires a storefront (its pricing country, "USA" in Superwall's answers); without
    /// prices it is only that constant.
    public var storefront = "USA"

    public init(identifier: String, store: ProductStore, applicationId: Int, entitlements: [EntitlementIdentifier]) {
        self.identifier = identifier
        self.store = store
        self.applicationId = applicationId
        self.entitlements = entitlements
    }

    /// SuperwallKit's `SuperwallProductPlatform` for the store: `ios`, `android`, `stripe`, `paddle`, ...
    public var platform: String {
        switch store {
        case .appStore: "ios"
        case .playStore: "android"
        case .stripe: "stripe"
        case .paddle: "paddle"
        case .superwall: "superwall"
        case .custom, .other: "custom"
        }
    }

    public var json: JSON {
        [
            "object": "product", "identifier": .string(identifier), "platform": .string(platform), "store": .string(store.rawValue),
            "applicationId": .integer(Int64(applicationId)), "price": .null, "subscription": .null,
            "entitlements": .array(entitlements.map(\.json)),
            "storefront": .string(storefront),
        ]
    }

    public init(json: JSON) throws(WireDecodingError) {
        let entry = try CustomerInfoMembers(json)
        guard let applicationId = Int(exactly: try entry.integer("applicationId")) else {
            throw WireDecodingError(field: "applicationId", message: "expected an integer")
        }
        var entitlements: [EntitlementIdentifier] = []
        for reference in json["entitlements"]?.arrayValue ?? [] {
            guard let identifier = reference["identifier"]?.stringValue else {
                throw WireDecodingError(field: "entitlements", message: "every entry needs an \"identifier\"")
            }
            var entitlement = EntitlementIdentifier(identifier)
            entitlement.type = reference["type"]?.stringValue ?? entitlement.type
            entitlements.append(entitlement)
        }
        self.init(identifier: try entry.text("identifier"), store: ProductStore(name: try entry.text("store")), applicationId: applicationId, entitlements: entitlements)
        storefront = entry.optionalText("storefront") ?? storefront
    }
}

extension CatalogProduct: Codable {
    public init(from decoder: any Decoder) throws { try self.init(json: try JSON(from: decoder)) }
    public func encode(to encoder: any Encoder) throws { try json.encode(to: encoder) }
}

/// A customer info object's members, read with the relay's decoding errors.
private struct CustomerInfoMembers {
    let object: [String: JSON]

    init(_ json: JSON) throws(WireDecodingError) {
        guard let object = json.objectValue else { throw WireDecodingError(field: "$", message: "expected a JSON object") }
        self.object = object
    }

    func text(_ key: String) throws(WireDecodingError) -> String {
        guard let text = object[key]?.stringValue else { throw WireDecodingError(field: key, message: "expected a string") }
        return text
    }

    func optionalText(_ key: String) -> String? {
        object[key]?.stringValue
    }

    func texts(_ key: String) -> [String] {
        object[key]?.arrayValue?.compactMap(\.stringValue) ?? []
    }

    func integer(_ key: String) throws(WireDecodingError) -> Int64 {
        guard let number = object[key]?.int64Value else { throw WireDecodingError(field: key, message: "expected Unix milliseconds") }
        return number
    }

    func optionalInteger(_ key: String) throws(WireDecodingError) -> Int64? {
        guard let value = object[key], !value.isNull else { return nil }
        guard let number = value.int64Value else { throw WireDecodingError(field: key, message: "expected Unix milliseconds or null") }
        return number
    }

    func bool(_ key: String) throws(WireDecodingError) -> Bool {
        guard let flag = object[key]?.boolValue else { throw WireDecodingError(field: key, message: "expected a boolean") }
        return flag
    }

    func optionalBool(_ key: String) throws(WireDecodingError) -> Bool? {
        guard let value = object[key], !value.isNull else { return nil }
        guard let flag = value.boolValue else { throw WireDecodingError(field: key, message: "expected a boolean or null") }
        return flag
    }
}
