import RelayConfig
import RelayCore
import RelayWorker
import Testing

@Suite struct DeliveryFanOutTests {
    static func configuration() throws -> RelayConfiguration {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
        return try RelayConfiguration.parse(
            yaml: """
                apps:
                  - { key: demo, projectId: 1, applicationId: 1, stripe: { signingSecrets: ["whsec_s"] } }
                  - { key: other, projectId: 1, applicationId: 2, stripe: { signingSecrets: ["whsec_s"] } }
                endpoints:
                  - { id: all, app: demo, url: "https://a.example/hook", secrets: ["\(secret)"], events: ["*"] }
                  - { id: renewals-prod, app: demo, url: "https://b.example/hook", secrets: ["\(secret)"], events: [renewal], environments: [PRODUCTION] }
                  - { id: other-app, app: other, url: "https://c.example/hook", secrets: ["\(secret)"], events: ["*"] }
                """, baseDirectory: "/", environment: [:])
    }

    func event(_ type: EventType, environment: String) -> StandardEvent {
        StandardEvent(
            type: type, id: "apple:n1:\(type.rawValue)", subject: "2000000100000001", environment: environment,
            payload: EventPayload(
                type: type, projectId: 1, applicationId: 1, timestamp: 1_700_000_000_000,
                data: .statusChange(
                    StatusChangeData(
                        id: "apple:n1:\(type.rawValue)", appUserId: "user-1", originalAppUserId: "user-1", from: SubscriptionStatus(entitlements: []),
                        to: SubscriptionStatus(entitlements: ["pro"]), store: "APP_STORE", environment: environment,
                        originalTransactionId: "2000000100000001", productId: "pro.monthly", ts: 1_700_000_000_000, sdkEvents: [],
                        source: EventSource(store: .apple, notificationId: "n1", type: "DID_RENEW", subtype: nil)))))
    }

    @Test func oneRecordPerMatchingEndpointKeyedByEndpointAndSubject() throws {
        let fanOut = DeliveryFanOut(configuration: try Self.configuration())
        let production = fanOut.records(for: event(.renewal, environment: "PRODUCTION"), app: "demo", body: [1, 2, 3])
        #expect(production.map { String(decoding: $0.key ?? [], as: UTF8.self) } == ["all:2000000100000001", "renewals-prod:2000000100000001"])
        #expect(production.allSatisfy { $0.topic == "relay.deliveries" })
        #expect(production.first?.headers.first(named: "relay-endpoint")?.stringValue == "all")
        #expect(production.first?.headers.first(named: "relay-event-id")?.stringValue == "apple:n1:renewal")
        #expect(production.first?.value == [1, 2, 3])
        // The environment and the event type filter: a sandbox renewal, and a production cancellation.
        #expect(fanOut.records(for: event(.renewal, environment: "SANDBOX"), app: "demo", body: [1, 2, 3]).count == 1)
        #expect(fanOut.records(for: event(.cancellation, environment: "PRODUCTION"), app: "demo", body: [1, 2, 3]).count == 1)
        #expect(fanOut.records(for: event(.renewal, environment: "PRODUCTION"), app: "nobody", body: [1, 2, 3]).isEmpty)
    }
}
