@testable import RelayBackend
import RelayCore
import Testing

/// The worker's state store over the backend client.
@Suite struct BackendStateStoreTests {
    @Test func otherSubscriptionsAreReadFromSDKShapedCustomerInfoToo() {
        let entry: JSON = ["productIdentifier": "price_pro_monthly", "store": "STRIPE", "isActive": true, "originalTransactionId": "sub_x"]
        let state = BackendStateStore.sdkSubscription(entry)
        #expect(state?.store == .stripe)
        #expect(state?.productId == "price_pro_monthly")
        #expect(state?.originalTransactionId == "sub_x")
        #expect(BackendStateStore.sdkSubscription(["productId": "p", "store": "AMAZON"]) == nil)
        #expect(BackendStateStore.sdkSubscription(["store": "APP_STORE"]) == nil)
    }
}
