import Foundation
import RelayCore
import Testing

@Suite struct WireCodingTests {
    static func state() -> SubscriptionState {
        SubscriptionState(
            store: .apple, originalTransactionId: "2000000100000001", applicationId: 7, originalAppUserId: nil, appUserIds: [],
            productId: "com.example.pro.monthly", status: .inGracePeriod, periodType: .trial, autoRenew: false,
            expiresAt: 9_007_199_254_740_993, sourceTimestamp: 1_000, version: 3,
            recentNotifications: [.init(id: "n1", context: ["receivedAt": 9_007_199_254_740_993, "nested": ["a": [1, 2.5, "x", nil, true]]])],
            transactions: [.init(id: "t1", productId: "com.example.pro.monthly", purchasedAt: 5, periodType: .intro, amount: "9.99", currency: "EUR")])
    }

    @Test func aStateRoundTripsWithExactIntegersSortedMembersAndExplicitNulls() throws {
        let state = Self.state()
        let bytes = WireCoding.encode(state)
        #expect(try WireCoding.decode(SubscriptionState.self, from: bytes) == state)
        let text = String(decoding: bytes, as: UTF8.self)
        // Beyond a double's 53 bits: an integer that went through Double would end in ...992.
        #expect(text.contains("\"expiresAt\":9007199254740993"))
        #expect(text.contains("\"receivedAt\":9007199254740993"))
        // Absent values are null members, not missing ones (the backend contract lists every member).
        #expect(text.contains("\"originalAppUserId\":null"))
        #expect(text.contains("\"gracePeriodExpiresAt\":null"))
        let members = try #require(try JSON.parse(bytes).objectValue)
        #expect(members.count == 21)
        #expect(text.contains("\"ownerAppUserId\":null"))
        // Sorted members: equal states are equal bytes.
        #expect(text.hasPrefix("{\"appUserIds\":[],\"applicationId\":7,\"autoRenew\":false,"))
    }

    @Test func slashesAreNotEscaped() {
        var state = Self.state()
        state.productId = "a/b"
        #expect(String(decoding: WireCoding.encode(state), as: UTF8.self).contains("\"productId\":\"a/b\""))
    }

    @Test(arguments: [
        (#"[1]"#, "$", "expected a JSON object"),
        (#"{"store":"apple""#, "$", "not valid JSON"),
        (#"{"store":"amazon","originalTransactionId":"1","applicationId":1,"productId":"p","status":"ACTIVE","sourceTimestamp":1}"#, "store", "expected apple, google, stripe or paddle"),
        (#"{"store":"apple","originalTransactionId":"","applicationId":1,"productId":"p","status":"ACTIVE","sourceTimestamp":1}"#, "originalTransactionId", "expected a non-empty string"),
        (#"{"store":"apple","originalTransactionId":"1","applicationId":1,"productId":5,"status":"ACTIVE","sourceTimestamp":1}"#, "productId", "expected a non-empty string"),
        (#"{"store":"apple","originalTransactionId":"1","applicationId":"1","productId":"p","status":"ACTIVE","sourceTimestamp":1}"#, "applicationId", "expected an integer"),
        (#"{"store":"apple","originalTransactionId":"1","applicationId":1,"productId":"p","status":"LIVE","sourceTimestamp":1}"#, "status", "expected one of ACTIVE, IN_GRACE_PERIOD, IN_BILLING_RETRY, PAUSED, EXPIRED, REVOKED, REFUNDED"),
        (#"{"store":"apple","originalTransactionId":"1","applicationId":1,"productId":"p","status":"ACTIVE"}"#, "sourceTimestamp", "expected Unix milliseconds"),
        (#"{"store":"apple","originalTransactionId":"1","applicationId":1,"productId":"p","status":"ACTIVE","sourceTimestamp":1,"expiresAt":1.5}"#, "expiresAt", "expected an integer or null"),
        (#"{"store":"apple","originalTransactionId":"1","applicationId":1,"productId":"p","status":"ACTIVE","sourceTimestamp":1,"recentNotifications":[{"context":1}]}"#, "recentNotifications", #"every entry needs a non-empty "id""#),
        (#"{"store":"apple","originalTransactionId":"1","applicationId":1,"productId":"p","status":"ACTIVE","sourceTimestamp":1,"transactions":[{"id":"t"}]}"#, "transactions", #"every entry needs a non-empty "id" and a "productId""#),
    ])
    func aBadStateNamesTheMember(text: String, field: String, message: String) {
        #expect(throws: WireDecodingError(field: field, message: message)) { try WireCoding.decode(SubscriptionState.self, from: Array(text.utf8)) }
    }

    @Test func leftOutMembersTakeTheirDefaults() throws {
        let text = #"{"store":"google","originalTransactionId":"tok","applicationId":1,"productId":"p:monthly","status":"PAUSED","sourceTimestamp":1}"#
        let state = try WireCoding.decode(SubscriptionState.self, from: Array(text.utf8))
        #expect(state.periodType == .normal && state.autoRenew && state.version == 0 && state.environment == "PRODUCTION")
        #expect(state.recentNotifications.isEmpty && state.transactions.isEmpty && !state.expirationSent)
    }

    @Test func jsonPassesThroughACodableModelUnchanged() throws {
        let value: JSON = ["big": 9_007_199_254_740_993, "negative": -3, "fraction": 0.1, "text": "é/\"", "list": [nil, false, ["k": "v"]]]
        #expect(try JSON.parse(WireCoding.encode(value)) == value)
    }
}
