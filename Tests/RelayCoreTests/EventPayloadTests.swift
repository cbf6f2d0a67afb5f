import RelayCore
import RelayTestSupport
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

    /// The bytes records and webhooks carry (`StandardEvent.body`, written directly) are the `JSON` tree's
    /// serialization, for every member present or absent, extra members, and text that needs escaping.
    @Test func theDirectWriterWritesTheTreesBytes() throws {
        let renewal = try WireCoding.decode(EventPayload.self, from: Array(Self.renewal.utf8))
        #expect(String(decoding: renewal.serialized(), as: UTF8.self) == Self.renewal)

        var random = SeededGenerator(seed: 34)
        func maybe<T>(_ value: T) -> T? { Bool.random(using: &random) ? value : nil }
        func text() -> String { ["a", "é", "\"q\"", "line\nbreak", "tab\t", "\u{01}", "😀", "com.example.pro.monthly", ""].randomElement(using: &random)! }
        func number() -> Double { [0, 1, -9.99, 0.1, 1e21, 123_456.789, 5e-324].randomElement(using: &random)! }
        func status() -> SubscriptionStatus { SubscriptionStatus(entitlements: [[], ["pro"], ["pro", "basic", "é"]].randomElement(using: &random)!) }
        func source() -> EventSource {
            EventSource(store: Store.allCases.randomElement(using: &random)!, notificationId: maybe(text()), type: maybe(text()), subtype: maybe(text()))
        }
        func extras<D>(_ data: inout D, _ attributes: WritableKeyPath<D, [String: JSON]?>, _ aliases: WritableKeyPath<D, [String]?>,
                       _ transferred: WritableKeyPath<D, String?>) {
            data[keyPath: attributes] = maybe([[:], ["$email": "a@example.com", "plan": ["tier": 2, "é": nil]]].randomElement(using: &random)!)
            data[keyPath: aliases] = maybe([[], ["$RelayAlias:1", text()]].randomElement(using: &random)!)
            data[keyPath: transferred] = maybe(text())
        }
        // How often each way the extra members can be (absent, empty, present) came up: all must.
        var extrasSeen = Set<String>()
        for index in 0..<400 {
            let data: EventData
            if index % 3 == 0 {
                var change = StatusChangeData(
                    id: text(), appUserId: text(), originalAppUserId: maybe(text()), from: status(), to: status(), store: text(),
                    environment: text(), originalTransactionId: text(), productId: maybe(text()), ts: Int64(index) * 1_000_003,
                    sdkEvents: maybe([text(), text()]) ?? [], source: source())
                change.sequence = maybe(Int64(index))
                extras(&change, \.userAttributes, \.aliases, \.transferredFrom)
                data = .statusChange(change)
            } else {
                var event = StoreEventData(
                    id: text(), name: EventType.allCases.randomElement(using: &random)!, cancelReason: maybe(Reason.allCases.randomElement(using: &random)!),
                    expirationReason: maybe(.billingError), exchangeRate: maybe(number()), isSmallBusiness: Bool.random(using: &random),
                    periodType: SubscriptionState.PeriodType.allCases.randomElement(using: &random)!, countryCode: maybe(text()),
                    price: maybe(number()), proceeds: maybe(number()), priceInPurchasedCurrency: maybe(number()), currencyCode: maybe(text()),
                    taxPercentage: maybe(number()), commissionPercentage: number(), takehomePercentage: number(), offerCode: maybe(text()),
                    isFamilyShare: Bool.random(using: &random), expirationAt: maybe(-5), transactionId: maybe(text()),
                    originalTransactionId: text(), originalAppUserId: maybe(text()), store: text(), purchasedAt: maybe(Int64.max),
                    productId: maybe(text()), environment: text(), isTrialConversion: Bool.random(using: &random), newProductId: maybe(text()),
                    bundleId: maybe(text()), ts: Int64(index), sdkEvents: maybe([text()]) ?? [], entitlements: status().entitlements,
                    subscriptionStatus: status(), gracePeriodExpiresAt: maybe(Int64.min), source: source())
                event.sequence = maybe(Int64(index))
                extras(&event, \.userAttributes, \.aliases, \.transferredFrom)
                data = .store(event)
            }
            let payload = EventPayload(
                type: EventType.allCases.randomElement(using: &random)!, projectId: index, applicationId: -index, timestamp: Int64(index) << 20,
                data: data)
            let direct = payload.serialized(), tree = payload.json.serialized()
            if direct != tree {
                Issue.record("direct: \(String(decoding: direct, as: UTF8.self))\ntree:   \(String(decoding: tree, as: UTF8.self))")
            }
            let (attributes, aliases, transferred): ([String: JSON]?, [String]?, String?) =
                switch data {
                case .store(let event): (event.userAttributes, event.aliases, event.transferredFrom)
                case .statusChange(let change): (change.userAttributes, change.aliases, change.transferredFrom)
                }
            extrasSeen.insert("attributes \(attributes.map { $0.isEmpty ? "empty" : "some" } ?? "nil")")
            extrasSeen.insert("aliases \(aliases.map { $0.isEmpty ? "empty" : "some" } ?? "nil")")
            extrasSeen.insert("transferred \(transferred.map { $0.isEmpty ? "empty" : "some" } ?? "nil")")
        }
        #expect(extrasSeen.count == 9, "\(extrasSeen.sorted())")
    }

    /// A delivery attempt's record bytes (written directly) are its `JSON` tree's serialization, for every
    /// member present or absent and text that needs escaping; they read back as the same attempt.
    @Test func anAttemptsRecordIsItsTreesBytes() throws {
        var random = SeededGenerator(seed: 35)
        func maybe<T>(_ value: T) -> T? { Bool.random(using: &random) ? value : nil }
        func text() -> String { ["a", "é", "\"q\"", "line\nbreak", "\u{01}", "😀", "https://example.com/hook", ""].randomElement(using: &random)! }
        var absent = Set<String>(), present = Set<String>()
        for index in 0..<300 {
            let attempt = DeliveryAttempt(
                app: text(), endpoint: text(), eventId: text(), eventType: text(), subject: maybe(text()), attempt: index % 7 + 1,
                outcome: DeliveryAttempt.Outcome.allCases.randomElement(using: &random)!, httpStatus: maybe([200, 204, 410, 503].randomElement(using: &random)!),
                durationMs: maybe(Int64(index)), error: maybe(text()), startedAt: Int64(index) << 30, finishedAt: (Int64(index) << 30) + 7,
                replayedFrom: maybe(text()), nextAttemptAt: maybe(Int64.max), deadLetterReason: maybe(text()))
            let direct = attempt.record(topic: "t").value, tree = attempt.json.serialized()
            if direct != tree {
                Issue.record("direct: \(String(decoding: direct, as: UTF8.self))\ntree:   \(String(decoding: tree, as: UTF8.self))")
            }
            #expect(DeliveryAttempt(json: try JSON.parse(direct)) == attempt)
            for (name, value) in [
                ("subject", attempt.subject as Any?), ("httpStatus", attempt.httpStatus), ("durationMs", attempt.durationMs), ("error", attempt.error),
                ("replayedFrom", attempt.replayedFrom), ("nextAttemptAt", attempt.nextAttemptAt), ("deadLetterReason", attempt.deadLetterReason),
            ] {
                if value == nil { absent.insert(name) } else { present.insert(name) }
            }
        }
        #expect(absent.count == 7 && present.count == 7)
    }

    @Test func anUnknownEventTypeIsRefusedNamingTheMember() {
        let text = Self.renewal.replacingOccurrences(of: "\"name\":\"renewal\"", with: "\"name\":\"refund\"")
        #expect(throws: WireDecodingError.self) { try WireCoding.decode(EventPayload.self, from: Array(text.utf8)) }
    }
}
