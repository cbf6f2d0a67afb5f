import Foundation
import RelayCore
import Testing

func base64URL(_ text: String) -> String {
    Data(text.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        .replacingOccurrences(of: "=", with: "")
}

func jws(_ payload: String) -> String { "\(base64URL(#"{"alg":"ES256"}"#)).\(base64URL(payload)).c2ln" }

/// The Kafka key subject of docs/contracts.md (the raw record) and docs/verification.md, as a table: store, body, expected subject.
@Suite struct NotificationSubjectTests {
    struct Row: Sendable, CustomStringConvertible {
        var name: String
        var store: Store
        var body: String
        var subject: String
        var description: String { name }
    }

    static let rows: [Row] = [
        Row(name: "apple nested transaction", store: .apple,
            body: #"{"signedPayload":"\#(jws(#"{"notificationUUID":"u1","data":{"signedTransactionInfo":"\#(jws(#"{"originalTransactionId":"1000"}"#))"}}"#))"}"#, subject: "1000"),
        Row(name: "apple renewal info only", store: .apple,
            body: #"{"signedPayload":"\#(jws(#"{"notificationUUID":"u2","data":{"signedRenewalInfo":"\#(jws(#"{"originalTransactionId":"2000"}"#))"}}"#))"}"#, subject: "2000"),
        Row(name: "apple payload field", store: .apple,
            body: #"{"signedPayload":"\#(jws(#"{"notificationUUID":"u3","data":{"originalTransactionId":"3000"}}"#))"}"#, subject: "3000"),
        Row(name: "apple summary falls back to the notification id", store: .apple,
            body: #"{"signedPayload":"\#(jws(#"{"notificationUUID":"u4","summary":{"requestIdentifier":"r"}}"#))"}"#, subject: "u4"),
        Row(name: "apple not a JWS", store: .apple, body: #"{"signedPayload":"nope"}"#, subject: NotificationSubject.unknown),
        Row(name: "apple JWS with two parts", store: .apple,
            body: #"{"signedPayload":"\#(base64URL("{}")).\#(base64URL(#"{"notificationUUID":"u5"}"#))"}"#, subject: NotificationSubject.unknown),
        Row(name: "apple JWS with four parts", store: .apple,
            body: #"{"signedPayload":"\#(jws(#"{"notificationUUID":"u6"}"#)).c2ln"}"#, subject: NotificationSubject.unknown),
        Row(name: "apple nested JWS with four parts falls back to the notification id", store: .apple,
            body: #"{"signedPayload":"\#(jws(#"{"notificationUUID":"u7","data":{"signedTransactionInfo":"\#(jws(#"{"originalTransactionId":"7000"}"#)).x"}}"#))"}"#, subject: "u7"),
        Row(name: "apple payload not JSON in a member the subject skips", store: .apple,
            body: #"{"signedPayload":"\#(jws(#"{"notificationUUID":"u8","summary":{"a":tru},"data":{"originalTransactionId":"8000"}}"#))"}"#,
            subject: NotificationSubject.unknown),
        Row(name: "apple nested payload not JSON in a member the subject skips", store: .apple,
            body: #"{"signedPayload":"\#(jws(#"{"notificationUUID":"u9","data":{"signedTransactionInfo":"\#(jws(#"{"originalTransactionId":"9000","price":1e}"#))"}}"#))"}"#,
            subject: "u9"),
        Row(name: "google subscription", store: .google,
            body: #"{"message":{"data":"\#(Data(#"{"subscriptionNotification":{"purchaseToken":"tok-1"}}"#.utf8).base64EncodedString())","messageId":"m1"}}"#, subject: "tok-1"),
        Row(name: "google voided purchase", store: .google,
            body: #"{"message":{"data":"\#(Data(#"{"voidedPurchaseNotification":{"purchaseToken":"tok-2"}}"#.utf8).base64EncodedString())","messageId":"m2"}}"#, subject: "tok-2"),
        Row(name: "google test notification", store: .google,
            body: #"{"message":{"data":"\#(Data(#"{"testNotification":{"version":"1.0"}}"#.utf8).base64EncodedString())","message_id":"m3"}}"#, subject: "m3"),
        Row(name: "stripe subscription object", store: .stripe,
            body: #"{"id":"evt_1","data":{"object":{"object":"subscription","id":"sub_1","customer":"cus_1"}}}"#, subject: "sub_1"),
        Row(name: "stripe invoice with subscription", store: .stripe,
            body: #"{"id":"evt_2","data":{"object":{"object":"invoice","subscription":"sub_2","customer":"cus_2"}}}"#, subject: "sub_2"),
        Row(name: "stripe newer invoice parent", store: .stripe,
            body: #"{"id":"evt_3","data":{"object":{"object":"invoice","customer":"cus_3","parent":{"subscription_details":{"subscription":"sub_3"}}}}}"#, subject: "sub_3"),
        Row(name: "stripe expanded customer", store: .stripe,
            body: #"{"id":"evt_4","data":{"object":{"object":"charge","customer":{"id":"cus_4"}}}}"#, subject: "cus_4"),
        Row(name: "stripe event id", store: .stripe, body: #"{"id":"evt_5","data":{"object":{"object":"payout"}}}"#, subject: "evt_5"),
        Row(name: "paddle subscription", store: .paddle,
            body: #"{"event_id":"evt_p1","event_type":"subscription.updated","data":{"id":"sub_p1","customer_id":"ctm_1"}}"#, subject: "sub_p1"),
        Row(name: "paddle transaction", store: .paddle,
            body: #"{"event_id":"evt_p2","event_type":"transaction.completed","data":{"id":"txn_1","subscription_id":"sub_p2","customer_id":"ctm_2"}}"#, subject: "sub_p2"),
        Row(name: "paddle customer", store: .paddle,
            body: #"{"event_id":"evt_p3","event_type":"customer.updated","data":{"id":"ctm_3"}}"#, subject: "ctm_3"),
        Row(name: "paddle event id", store: .paddle, body: #"{"event_id":"evt_p4","event_type":"report.created","data":{"id":"rep_1"}}"#, subject: "evt_p4"),
        Row(name: "not JSON", store: .stripe, body: "garbage", subject: NotificationSubject.unknown),
    ]

    @Test(arguments: rows)
    func subject(_ row: Row) {
        #expect(NotificationSubject.extract(store: row.store, body: Array(row.body.utf8)) == row.subject)
    }

    /// The ingest builds only the members the subject reads; the subject is the one a whole parse of the
    /// payloads gives, for Apple's real notification and the rows above.
    @Test func appleSubjectIsTheOneAWholeParseGives() throws {
        let real = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .appendingPathComponent("../Fixtures/vectors/apple-real/consumption_request_production.jws").standardizedFileURL
        let realJWS = try String(contentsOf: real, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let bodies = [#"{"signedPayload":"\#(realJWS)"}"#] + Self.rows.filter { $0.store == .apple }.map(\.body)
        for body in bodies {
            let document = try JSON.parse(body)
            #expect(NotificationSubject.extract(store: .apple, document: document) == (Self.wholeParseSubject(document) ?? NotificationSubject.unknown))
        }
        let realSubject = NotificationSubject.extract(store: .apple, body: Array(#"{"signedPayload":"\#(realJWS)"}"#.utf8))
        #expect(realSubject != NotificationSubject.unknown && realSubject.allSatisfy(\.isNumber), "the real notification's original transaction id")
    }

    /// `NotificationSubject.apple` as it was, building every member.
    static func wholeParseSubject(_ body: JSON) -> String? {
        guard let jws = body["signedPayload"]?.stringValue, let payload = JWSPayload.decode(jws) else { return nil }
        if let id = payload["data"]?["originalTransactionId"]?.stringValue { return id }
        for key in ["signedTransactionInfo", "signedRenewalInfo"] {
            if let nested = payload["data"]?[key]?.stringValue, let id = JWSPayload.decode(nested)?["originalTransactionId"]?.stringValue { return id }
        }
        return payload["notificationUUID"]?.stringValue
    }

    @Test func recordRoundTripsThroughTheRelayHeaders() throws {
        let body = Array(#"{"id":"evt_1"}"#.utf8)
        let notification = RawNotification(store: .stripe, app: "demo", receivedAtMilliseconds: 1_754_067_715_103, body: body,
                                           requestHeaders: ["stripe-signature": "t=1,v1=x"])
        let record = notification.record(topic: "relay.notifications")
        #expect(record.key == Array("stripe:evt_1".utf8))
        let consumed = ConsumedRecord(topic: record.topic, partition: 0, offset: 0, key: record.key, value: record.value, headers: record.headers,
                                      timestampMilliseconds: nil, assignmentGeneration: 1)
        let decoded = try RawNotification(record: consumed)
        #expect(decoded.store == .stripe && decoded.app == "demo" && decoded.receivedAtMilliseconds == 1_754_067_715_103)
        #expect(decoded.body == body)
        #expect(decoded.requestHeaders == ["stripe-signature": "t=1,v1=x"])
    }

    @Test func recordWithoutRelayHeadersIsNotANotification() {
        let consumed = ConsumedRecord(topic: "t", partition: 0, offset: 0, key: nil, value: [], headers: [RecordHeader(name: "relay-store", value: "amazon")],
                                      timestampMilliseconds: nil, assignmentGeneration: 1)
        #expect(throws: RawNotification.DecodingError.invalidHeader("relay-store")) { try RawNotification(record: consumed) }
        let missing = ConsumedRecord(topic: "t", partition: 0, offset: 0, key: nil, value: [], headers: [], timestampMilliseconds: nil, assignmentGeneration: 1)
        #expect(throws: RawNotification.DecodingError.missingHeader("relay-store")) { try RawNotification(record: missing) }
    }
}
