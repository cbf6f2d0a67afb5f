public import RelayCore

/// A subscription state of the test app (application 7, Apple sandbox) with what a test varies.
public func testSubscriptionState(_ id: String = "1000", user: String? = "user-1", product: String = "com.example.pro.monthly", status: SubscriptionState.Status = .active,
           expiresAt: Int64? = 4_000_000_000_000, at time: Int64 = 1_000) -> SubscriptionState {
    SubscriptionState(
        store: .apple, originalTransactionId: id, applicationId: 7, originalAppUserId: user, appUserIds: user.map { [$0] } ?? [],
        productId: product, status: status, expiresAt: expiresAt, environment: "SANDBOX", lastTransactionId: "t-\(time)", sourceTimestamp: time)
}
