import RelayCore
import Testing

@Suite struct EventPayloadTests {
    /// A renewal as receivers get it: members sorted, every member present, null where the store says nothing.
    static let renewal = """
        {"applicationId":1,"data":{"bundleId":"com.example.app","cancelReason":null,"commissionPercentage":0.15,"countryCode":"US","currencyCode":"USD",\
        "entitlements":[{"id":"pro","type":"SERVICE_LEVEL"}],"environment":"PRODUCTION","exchangeRate":1.0,"expirationAt":1900000000000,\
        "expirationReason":null,"gracePeriodExpiresAt":null,"id":"apple:n1:renewal","isFamilyShare":false,\
        "isSmallBusiness":false,"isTrialConversion":false,"name":"renewal","newProductId":null,"offerCode":null,"originalAppUserId":"user-1",\
        "originalTransactionId":"2000000100000001","periodType":"NORMAL","price":9.99,"priceInPurchasedCurrency":9.99,\
        "proceeds":8.49,"productId":"com.example.pro.monthly","purchasedAt":1890000000000,"sdkEvents":[],"sequence":12,\
        "source":{"notificationId":"n1","store":"apple","subtype":null,"type":"DID_RENEW"},"store":"APP_STORE",\
        "subscriptionStatus":{"entitlements":[{"id":"pro","type":"SERVICE_LEVEL"}],"status":"ACTIVE"},"takehomePercentage":0.85,\
        "taxPercentage":null,"transactionId":"2000000100000009","ts":1890000000000},"object":"event","projectId":1,"timestamp":1890000000001,\
        "type":"renewal"}
        """

    @Test func aStoreEventEncodesEveryMemberSortedWithNulls() throws {
        let payload = try WireCoding.decode(EventPayload.self, from: Array(Self.renewal.utf8))
        let data = try #require(payload.data.storeEvent)
        #expect(data.name == .renewal && data.cancelReason == nil && data.price == 9.99 && data.source.store == .apple && data.sequence == 12)
        // What records and webhooks carry (`StandardEvent.body`).
        #expect(payload.json.text == Self.renewal)
    }

    @Test func aStatusChangeDecodesAsOneByItsName() throws {
        let event = StatusChangeData(
            id: "apple:n1:subscription_status_did_change", appUserId: "user-1", originalAppUserId: nil, from: SubscriptionStatus(entitlements: []),
            to: SubscriptionStatus(entitlements: ["pro", "pro", "basic"]), store: "APP_STORE", environment: "SANDBOX",
            originalTransactionId: "1", productId: nil, ts: 5, sdkEvents: ["subscriptionStatusDidChange"],
            source: EventSource(store: .apple, notificationId: "n1", type: "SUBSCRIBED", subtype: nil))
        let payload = EventPayload(type: .subscriptionStatusDidChange, projectId: 1, applicationId: 2, timestamp: 6, data: .statusChange(event))
        let bytes = WireCoding.encode(payload)
        #expect(try WireCoding.decode(EventPayload.self, from: bytes) == payload)
        let json = try JSON.parse(bytes)
        #expect(json["data"]?["from"] == ["entitlements": [], "status": "INACTIVE"])
        #expect(json["data"]?["to"]?["entitlements"] == [["id": "basic", "type": "SERVICE_LEVEL"], ["id": "pro", "type": "SERVICE_LEVEL"]])
        #expect(json["data"]?["originalAppUserId"] == .null && json["data"]?["productId"] == .null)
    }

    @Test func anUnknownEventTypeIsRefusedNamingTheMember() {
        let text = Self.renewal.replacingOccurrences(of: "\"name\":\"renewal\"", with: "\"name\":\"refund\"")
        #expect(throws: WireDecodingError.self) { try WireCoding.decode(EventPayload.self, from: Array(text.utf8)) }
    }
}
