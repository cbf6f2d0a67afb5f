import Foundation
import RelayConfig
import RelayCore
import RelayTestSupport
import RelayVerification
import Testing

/// Records synthesized from the App Store Server API (`relay-source: apple-api`): the signed transaction
/// and renewal info verified exactly as a notification's nested JWSs, decoded into a notification's shape.
@Suite struct AppleAPIRecordTests {
    let signer = AppleSigner()

    func body(
        type: String = "DID_RENEW", subtype: String? = nil, uuid: String = "import:2000000999999999", transaction: String? = nil,
        renewal: String?? = .none
    ) -> [UInt8] {
        var object: [String: JSON] = [
            "notificationType": .string(type), "notificationUUID": .string(uuid),
            "signedTransactionInfo": .string(transaction ?? signer.sign(AppleSigner.transaction())),
        ]
        if let subtype { object["subtype"] = .string(subtype) }
        switch renewal {
        case .none: object["signedRenewalInfo"] = .string(signer.sign(AppleSigner.renewalInfo()))
        case .some(.none): break
        case .some(.some(let text)): object["signedRenewalInfo"] = .string(text)
        }
        return JSON.object(object).serialized()
    }

    func verdict(_ body: [UInt8], source: String? = RawNotification.appleAPISource, store: Store = .apple) async throws -> Verdict {
        let verifier = try NotificationVerifier(configuration: Fixtures.configuration(), logger: testLogger())
        return try await verifier.verify(
            RawNotification(
                store: store, app: "demo", receivedAtMilliseconds: Fixtures.signedDate, body: body, requestHeaders: [:], source: source,
                historical: true, deliver: false))
    }

    @Test func anAPIRecordIsDecodedIntoTheShapeOfANotification() async throws {
        let result = try await verdict(body(type: "SUBSCRIBED", subtype: "INITIAL_BUY"))
        let notification = try #require(result.notification, "\(result)")
        #expect(notification.type == "SUBSCRIBED")
        #expect(notification.subtype == "INITIAL_BUY")
        #expect(notification.notificationId == "import:2000000999999999")
        #expect(notification.environment == "Sandbox")
        #expect(notification.payload["signedDate"] == .integer(Fixtures.signedDate))
        #expect(notification.payload["data"]?["environment"] == "Sandbox")
        #expect(notification.payload["data"]?["bundleId"] == "com.example.app")
        #expect(notification.payload["data"]?["signedTransactionInfo"]?["originalTransactionId"] == "2000000123456789")
        #expect(notification.payload["data"]?["signedRenewalInfo"]?["autoRenewStatus"] == 1)

        // The same decoded data as the notification carrying the same JWSs.
        let real = try #require(try await verdict(signer.body(signer.notificationPayload()), source: nil).notification)
        #expect(real.payload["data"]?["signedTransactionInfo"] == notification.payload["data"]?["signedTransactionInfo"])
        #expect(real.payload["data"]?["signedRenewalInfo"] == notification.payload["data"]?["signedRenewalInfo"])

        let withoutRenewal = try await verdict(body(renewal: .some(nil)))
        #expect(withoutRenewal.notification?.payload["data"]?["signedRenewalInfo"] == nil)
    }

    @Test func theChainBundleAndEnvironmentRulesAreANotificationsNestedOnes() async throws {
        let rogue = AppleSigner(key: "apple/rogue-leaf.key", chain: ["apple/rogue-leaf.pem", "apple/rogue-intermediate.pem", "apple/rogue-root.pem"])
        #expect(try await reason(verdict(body(transaction: rogue.sign(AppleSigner.transaction())))) == .untrustedChain)
        #expect(try await reason(verdict(body(renewal: .some(rogue.sign(AppleSigner.renewalInfo()))))) == .untrustedChain)
        let forged = signer.sign(AppleSigner.transaction()).dropLast(4) + "AAAA"
        #expect(try await reason(verdict(body(transaction: String(forged)))) == .badSignature)
        #expect(try await reason(verdict(body(transaction: signer.sign(AppleSigner.transaction(bundleId: "com.other.app"))))) == .wrongBundleId)
        #expect(try await reason(verdict(body(transaction: signer.sign(AppleSigner.transaction(environment: "Xcode"))))) == .wrongEnvironment)
        #expect(
            try await reason(
                verdict(body(renewal: .some(signer.sign(AppleSigner.renewalInfo(environment: "Production")))))) == .wrongEnvironment)
        let expired = AppleSigner(chain: ["apple/leaf.pem", "apple/intermediate.pem", "apple/root.pem"])
        #expect(try await reason(verdict(body(transaction: expired.sign(AppleSigner.transaction(signedDate: 1_000_000_000_000))))) == .certificateExpired)
    }

    @Test func malformedRecordsAndUnknownSourcesAreRejected() async throws {
        #expect(try await reason(verdict(Array(#"{"notificationType": "DID_RENEW"}"#.utf8))) == .malformed)
        #expect(try await reason(verdict(Array(#"{"signedPayload": "x"}"#.utf8))) == .malformed)
        #expect(try await reason(verdict(body(), source: "somewhere-else")) == .malformed)
        #expect(try await reason(verdict(body(), source: RawNotification.appleAPISource, store: .stripe)) == .malformed)
        // Without relay-source the same body is a notification, and not one.
        #expect(try await reason(verdict(body(), source: nil)) == .malformed)
    }

    @Test func theRelayHeadersRoundTripThroughARecord() throws {
        let notification = RawNotification(
            store: .apple, app: "demo", receivedAtMilliseconds: 1, body: body(), requestHeaders: [:], source: RawNotification.appleAPISource,
            historical: true, deliver: false)
        let outgoing = notification.record(topic: "relay.notifications", subject: "2000000123456789")
        #expect(outgoing.key == Array("apple:2000000123456789".utf8))
        #expect(outgoing.headers.first(named: RelayHeaderName.source)?.stringValue == "apple-api")
        #expect(outgoing.headers.first(named: RelayHeaderName.historical)?.stringValue == "true")
        #expect(outgoing.headers.first(named: RelayHeaderName.deliver)?.stringValue == "false")
        let plain = RawNotification(store: .apple, app: "demo", receivedAtMilliseconds: 1, body: body(), requestHeaders: [:])
            .record(topic: "relay.notifications")
        #expect(plain.headers.map(\.name) == [RelayHeaderName.store, RelayHeaderName.app, RelayHeaderName.receivedAt])
    }
}
