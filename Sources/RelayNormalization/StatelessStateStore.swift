public import RelayConfig
public import RelayCore

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

    public func write(_ state: SubscriptionState, ifMatch: Int64) async throws(BackendError) -> StateWriteResult { .written(state) }

    public func appUserAndOtherActiveSubscriptions(_ id: String, applicationId: Int, excluding store: Store, originalTransactionId: String)
        async throws(BackendError) -> (user: AppUser, active: [SubscriptionState])
    { (AppUser(appUserId: id), []) }
}
