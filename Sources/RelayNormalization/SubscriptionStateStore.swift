public import RelayBackend
public import RelayConfig
public import RelayCore

/// Where the normalizer reads and writes subscription state: the backend (the worker), or nothing at
/// all (`inspect`: no prior state, products from the configuration).
public protocol SubscriptionStateStore: Sendable {
    func productMapping(applicationId: Int) async throws(BackendError) -> ProductMapping
    func subscription(store: Store, originalTransactionId: String) async throws(BackendError) -> SubscriptionState?
    func write(_ state: SubscriptionState, ifMatch: Int64) async throws(BackendError) -> BackendClient.WriteResult
    /// The user's other subscriptions that give access now (their entitlements add to the user's status).
    func otherActiveSubscriptions(appUserId: String, excluding store: Store, originalTransactionId: String) async throws(BackendError)
        -> [SubscriptionState]
}

/// The worker's state store: the backend client (docs/contracts.md, Backend API).
public struct BackendStateStore: SubscriptionStateStore {
    private let client: BackendClient

    public init(client: BackendClient) {
        self.client = client
    }

    public func productMapping(applicationId: Int) async throws(BackendError) -> ProductMapping {
        do {
            return try await client.productMapping(applicationId: applicationId)
        } catch where error.kind == .notFound {
            // An application without products: nothing unlocks anything (the README says how to map them).
            return ProductMapping(products: [])
        }
    }

    public func subscription(store: Store, originalTransactionId: String) async throws(BackendError) -> SubscriptionState? {
        try await client.subscription(store: store, originalTransactionId: originalTransactionId)
    }

    public func write(_ state: SubscriptionState, ifMatch: Int64) async throws(BackendError) -> BackendClient.WriteResult {
        try await client.write(state, ifMatch: ifMatch)
    }

    /// From the entitlements route's `customerInfo.subscriptions`: each entry that `isActive`, read as a
    /// subscription state (the local backend serves whole states), or else from the SDK's fields
    /// (`productId` or `productIdentifier`, `store`, `originalTransactionId` or `transactionId`), which is
    /// all the product mapping needs.
    public func otherActiveSubscriptions(appUserId: String, excluding store: Store, originalTransactionId: String) async throws(BackendError)
        -> [SubscriptionState]
    {
        guard let document = try await client.entitlements(appUserId: appUserId) else { return [] }
        var result: [SubscriptionState] = []
        for entry in document["customerInfo"]?["subscriptions"]?.arrayValue ?? [] {
            guard entry["isActive"]?.boolValue == true, let state = (try? SubscriptionState(json: entry)) ?? Self.sdkSubscription(entry) else {
                continue
            }
            if state.store == store && state.originalTransactionId == originalTransactionId { continue }
            result.append(state)
        }
        return result
    }

    /// An SDK-shaped `customerInfo.subscriptions` entry as a minimal state; nil when it names no product or store.
    static func sdkSubscription(_ entry: JSON) -> SubscriptionState? {
        guard let productId = entry["productId"]?.stringValue ?? entry["productIdentifier"]?.stringValue, let storeText = entry["store"]?.stringValue
        else { return nil }
        let store = Store(rawValue: storeText) ?? Store.allCases.first { ProductMapping.storeName($0) == storeText }
        guard let store else { return nil }
        return SubscriptionState(
            store: store, originalTransactionId: entry["originalTransactionId"]?.stringValue ?? entry["transactionId"]?.stringValue ?? "",
            applicationId: 0, productId: productId, status: .active, sourceTimestamp: 0)
    }
}

/// `inspect`'s state store: no prior state, nothing written, products from the configuration.
public struct StatelessStateStore: SubscriptionStateStore {
    private let configuration: RelayConfiguration

    public init(configuration: RelayConfiguration) {
        self.configuration = configuration
    }

    public func productMapping(applicationId: Int) async throws(BackendError) -> ProductMapping {
        let products = configuration.apps.first { $0.applicationId == applicationId }?.products ?? []
        return ProductMapping(products: products.map { ProductMapping.Product(productId: $0.productId, store: $0.store, entitlements: $0.entitlements) })
    }

    public func subscription(store: Store, originalTransactionId: String) async throws(BackendError) -> SubscriptionState? { nil }

    public func write(_ state: SubscriptionState, ifMatch: Int64) async throws(BackendError) -> BackendClient.WriteResult { .written(state) }

    public func otherActiveSubscriptions(appUserId: String, excluding store: Store, originalTransactionId: String) async throws(BackendError)
        -> [SubscriptionState]
    { [] }
}
