import RelayConfig
import RelayCore
import RelayWorker
import Testing

/// What the worker tells Apple for a CONSUMPTION_REQUEST, from the configuration and the stored state.
@Suite struct ConsumptionInformationTests {
    let configuration = RelayConfiguration.ConsumptionAnswer(customerConsented: true, sampleContentProvided: false, refundPreference: "GRANT_FULL")
    let requestedAt: Int64 = 10_000

    func state(_ status: SubscriptionState.Status, at time: Int64, autoRenew: Bool = true) -> SubscriptionState {
        SubscriptionState(store: .apple, originalTransactionId: "1000", applicationId: 1, productId: "p", status: status, autoRenew: autoRenew, sourceTimestamp: time)
    }

    func information(_ transaction: JSON, _ stored: SubscriptionState) -> ConsumptionInformation {
        ConsumptionResponder.information(configuration, transaction: transaction, stored: stored, requestedAt: requestedAt)
    }

    @Test func subscriptionsAreDeliveredWhenStoredAndNotTakenBackAndNeverSayAPercentage() {
        let subscription: JSON = ["transactionId": "1", "type": "Auto-Renewable Subscription", "expiresDate": 20_000]
        let delivered = information(subscription, state(.expired, at: 9_000))
        #expect(delivered == ConsumptionInformation(customerConsented: true, deliveryStatus: .delivered, sampleContentProvided: false, refundPreference: "GRANT_FULL"))
        #expect(information(subscription, state(.refunded, at: 9_000)).deliveryStatus == .undeliveredOther)
        // Refunded after the customer asked: it had been delivered.
        #expect(information(subscription, state(.refunded, at: 11_000)).deliveryStatus == .delivered)
        #expect(information(subscription, state(.refunded, at: 9_000)).consumptionPercentage == nil)
    }

    @Test func oneTimePurchasesSayAllOrNothingConsumed() {
        let consumable: JSON = ["transactionId": "1", "type": "Consumable"]
        #expect(information(consumable, state(.active, at: 9_000, autoRenew: false)).consumptionPercentage == 100_000)
        #expect(information(consumable, state(.refunded, at: 9_000)).consumptionPercentage == 0)
        let revoked: JSON = ["transactionId": "1", "type": "Non-Consumable", "revocationDate": 9_500]
        let answer = information(revoked, state(.active, at: 9_000, autoRenew: false))
        #expect(answer.deliveryStatus == .undeliveredOther)
        #expect(answer.consumptionPercentage == 0)
    }
}
