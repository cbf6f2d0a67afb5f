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
        case .promotional, .custom, .other: "custom"
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
