public import RelayCore

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

    public func write(_ state: SubscriptionState, ifMatch: Int64) async throws(BackendError) -> StateWriteResult {
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

