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
            // An application without products: nothing unlocks anything (docs/configuration.md says how to map them).
            return ProductMapping(products: [])
        }
    }

    public func subscription(store: Store, originalTransactionId: String) async throws(BackendError) -> SubscriptionState? {
        try await client.subscription(store: store, originalTransactionId: originalTransactionId)
    }

    public func write(_ state: SubscriptionState, ifMatch: Int64) async throws(BackendError) -> StateWriteResult {
        try await client.write(state, ifMatch: ifMatch)
    }

    /// A backend that serves only the routes of the entitlements contract has no users route (404): every
    /// id is then its own user, as before linking existed, and the worker goes on.
    /// An id with a control character is never sent: the route refuses it (`AppUser.hasControlCharacters`).
    public func appUser(_ id: String, applicationId: Int) async throws(BackendError) -> AppUser {
        guard !AppUser.hasControlCharacters(id) else { return AppUser(appUserId: id) }
        do {
            return try await client.appUser(id, applicationId: applicationId)
        } catch where error.kind == .notFound {
            return AppUser(appUserId: id)
        }
    }

    /// The user (`GET .../users/{id}`) and its other active subscriptions (the entitlements route, which
    /// resolves the id itself): two requests, sent together.
    public func appUserAndOtherActiveSubscriptions(_ id: String, applicationId: Int, excluding store: Store, originalTransactionId: String)
        async throws(BackendError) -> (user: AppUser, active: [SubscriptionState])
    {
        async let user = appUser(id, applicationId: applicationId)
        async let active = otherActiveSubscriptions(appUserId: id, excluding: store, originalTransactionId: originalTransactionId)
        do {
            return (try await user, try await active)
        } catch let error as BackendError {
            throw error
        } catch {
            // Only cancellation reaches here: the worker is stopping.
            throw BackendError(kind: .unavailable, message: "reading user \(id) was cancelled")
        }
    }

    /// From the entitlements route's customer info: each `subscriptions` and `nonSubscriptions` entry that
    /// is active (a one-time purchase without `isActive`: not revoked), read as the subscription state the
    /// local backend writes beside the SDK's members (its `store` the SDK's `APP_STORE` or the state's
    /// `apple`), or else from the SDK's fields (`productId` or `productIdentifier`, `store`,
    /// `originalTransactionId` or `transactionId`), which is all the product mapping needs.
    public func otherActiveSubscriptions(appUserId: String, excluding store: Store, originalTransactionId: String) async throws(BackendError)
        -> [SubscriptionState]
    {
        guard !AppUser.hasControlCharacters(appUserId), let document = try await client.entitlements(appUserId: appUserId) else { return [] }
        let info = document["customerInfo"]
        let subscriptions = (info?["subscriptions"]?.arrayValue ?? []).filter { $0["isActive"]?.boolValue == true }
        let purchases = (info?["nonSubscriptions"]?.arrayValue ?? []).filter {
            $0["isActive"]?.boolValue ?? ($0["isRevoked"]?.boolValue == false)
        }
        var result: [SubscriptionState] = []
        for entry in subscriptions + purchases {
            guard let state = (try? SubscriptionState(customerInfoEntry: entry)) ?? Self.sdkSubscription(entry) else { continue }
            if state.store == store && state.originalTransactionId == originalTransactionId { continue }
            // Replaced by a plan change: no access, whatever a platform's backend says of `isActive`.
            if state.replacedBy != nil { continue }
            result.append(state)
        }
        return result
    }

    /// An SDK-shaped customer info entry as a minimal state (its `subscriptionGroupId` as the product group,
    /// which a mapping may name); nil when it names no product or store.
    static func sdkSubscription(_ entry: JSON) -> SubscriptionState? {
        guard let productId = entry["productId"]?.stringValue ?? entry["productIdentifier"]?.stringValue, let storeText = entry["store"]?.stringValue
        else { return nil }
        guard let store = Store(rawValue: storeText) ?? ProductStore(rawValue: storeText)?.store else { return nil }
        return SubscriptionState(
            store: store, originalTransactionId: entry["originalTransactionId"]?.stringValue ?? entry["transactionId"]?.stringValue ?? "",
            applicationId: 0, productId: productId, productGroupId: entry["subscriptionGroupId"]?.stringValue, status: .active, sourceTimestamp: 0)
    }
}

