import RelayCore
import RelayTestSupport
import Testing

@Suite struct StorageProblemTests {
    @Test func aStateHasAStorageProblemExactlyWhenItsJSONWouldNotDecode() {
        var broken: [SubscriptionState] = []
        var emptyId = testSubscriptionState()
        emptyId.originalTransactionId = ""
        broken.append(emptyId)
        var emptyProduct = testSubscriptionState()
        emptyProduct.productId = ""
        broken.append(emptyProduct)
        var emptyNotification = testSubscriptionState()
        emptyNotification.recentNotifications = [.init(id: "", context: .null)]
        broken.append(emptyNotification)
        var emptyTransaction = testSubscriptionState()
        emptyTransaction.transactions = [.init(id: "", productId: "p", purchasedAt: nil, periodType: .normal)]
        broken.append(emptyTransaction)
        for candidate in broken {
            #expect(candidate.storageProblem != nil)
            #expect((try? WireCoding.decode(SubscriptionState.self, from: WireCoding.encode(candidate))) == nil)
        }
        var fine = testSubscriptionState()
        fine.recentNotifications = [.init(id: "n-1", context: .null)]
        fine.transactions = [.init(id: "t-1", productId: "", purchasedAt: nil, periodType: .normal)]
        #expect(fine.storageProblem == nil)
        #expect((try? WireCoding.decode(SubscriptionState.self, from: WireCoding.encode(fine))) != nil)
    }
}
