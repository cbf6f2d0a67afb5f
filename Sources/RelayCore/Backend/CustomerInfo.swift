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
    /// A grant made through the backend (`POST .../users/{id}/grants`), not bought in a store.
    case promotional = "PROMOTIONAL"
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
            case .promotional: .promotional
            }
    }

    /// The relay's store, for the four it handles.
    public var store: Store? {
        switch self {
        case .appStore: .apple
        case .playStore: .google
        case .stripe: .stripe
        case .paddle: .paddle
        case .promotional: .promotional
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

/// A customer info object's members, read with the relay's decoding errors.
struct CustomerInfoMembers {
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
