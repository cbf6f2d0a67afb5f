import ArgumentParser
import RelayCore
import RelayLocalBackend

/// What the wire models cost on the hot path: a subscription state read and written once per
/// notification (by hand over `JSON`, and through Foundation's coders), and each event encoded once
/// (Foundation's encoder, and the `JSON` value type's serialization of the same value).
struct CodecBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "codec", abstract: "Microseconds per encode and decode of the state and the event payload, Foundation's coders against JSON.")

    @Option(help: "Seconds per measurement.")
    var seconds: Double = 2

    func run() async throws {
        let state = Self.state()
        let stateBytes = state.json.serialized()
        let stored = try SubscriptionState(serialized: stateBytes)
        let payload = try WireCoding.decode(EventPayload.self, from: Array(Self.eventText.utf8))
        let payloadJSON = payload.json
        let payloadBytes = WireCoding.encode(payload)
        let attempt = DeliveryAttempt(
            app: "demo", endpoint: "https-hooks", eventId: "apple:5b6d8e2c-1f0a-4c1e-9a57-3f2f0b6a9c11:renewal", eventType: "renewal",
            subject: "apple:2000000100000001", attempt: 1, outcome: .succeeded, httpStatus: 204, durationMs: 3, error: nil,
            startedAt: 1_890_000_000_000, finishedAt: 1_890_000_000_003)
        let rows: [(String, Double)] = [
            ("state decode, by hand: JSON.parse + init(json:) (\(stateBytes.count) B)", measure(seconds: seconds) { _ in
                _ = try? SubscriptionState(json: JSON.parse(stateBytes))
            }),
            ("state encode, by hand: json.serialized()", measure(seconds: seconds) { _ in _ = state.json.serialized() }),
            ("state decode, stored form: init(serialized:), contexts kept as bytes", measure(seconds: seconds) { _ in
                _ = try? SubscriptionState(serialized: stateBytes)
            }),
            ("state encode, stored form: serialized() of a state read that way", measure(seconds: seconds) { _ in _ = stored.serialized() }),
            ("state decode, JSONDecoder (contexts as JSON values)", measure(seconds: seconds) { _ in
                _ = try? WireCoding.decode(SubscriptionState.self, from: stateBytes)
            }),
            ("event encode, JSONEncoder (\(WireCoding.encode(payload).count) B)", measure(seconds: seconds) { _ in _ = WireCoding.encode(payload) }),
            ("event serialize, the same value as JSON", measure(seconds: seconds) { _ in _ = payloadJSON.serialized() }),
            ("event serialize, the tree built and written (before StandardEvent.body wrote directly)", measure(seconds: seconds) { _ in
                _ = payload.json.serialized()
            }),
            ("event serialize, written directly: EventPayload.serialized() (StandardEvent.body)", measure(seconds: seconds) { _ in
                _ = payload.serialized()
            }),
            ("attempt record, the tree built and written", measure(seconds: seconds) { _ in _ = attempt.json.serialized() }),
            ("attempt record, written directly: DeliveryAttempt.serialized() (the record's value)", measure(seconds: seconds) { _ in
                _ = attempt.serialized()
            }),
            ("event decode, JSONDecoder", measure(seconds: seconds) { _ in _ = try? WireCoding.decode(EventPayload.self, from: payloadBytes) }),
            ("event parse, JSON.parse", measure(seconds: seconds) { _ in _ = try? JSON.parse(payloadBytes) }),
            ("event parse, the events recorder's members only: JSON.parse(keepingMembersNamed:)", measure(seconds: seconds) { _ in
                _ = try? JSON.parse(payloadBytes, keepingMembersNamed: EventStore.columnMembers)
            }),
        ]
        print("| operation | µs each |")
        print("| --- | ---: |")
        for (name, rate) in rows { print("| \(name) | \(String(format: "%.1f", 1_000_000 / rate)) |") }
    }

    /// A renewing subscription as the worker keeps it: sixteen remembered notifications (the limit),
    /// each with the prior state in its context, and five recorded payments.
    static func state() -> SubscriptionState {
        let prior = SubscriptionState(
            store: .apple, originalTransactionId: "2000000100000001", applicationId: 1, originalAppUserId: "user-1", appUserIds: ["user-1"],
            productId: "com.example.pro.monthly", status: .active, expiresAt: 1_900_000_000_000, lastTransactionId: "2000000100000009",
            sourceTimestamp: 1_890_000_000_000)
        var state = prior
        state.transactions = (0..<5).map {
            .init(id: "200000010000000\($0)", productId: "com.example.pro.monthly", purchasedAt: 1_890_000_000_000 + Int64($0), periodType: .normal, amount: "9.99", currency: "USD")
        }
        state.version = 12
        state.recentNotifications = (0..<16).map { index in
            .init(id: "c5f0a1b2-0000-4000-8000-0000000000\(10 + index)", context: ["receivedAt": .integer(1_890_000_000_000), "prior": prior.json, "others": []])
        }
        return state
    }

    static let eventText = """
        {"applicationId":1,"data":{"bundleId":"com.example.app","cancelReason":null,"commissionPercentage":0.15,"countryCode":"US","currencyCode":"USD",\
        "entitlements":[{"id":"pro","type":"SERVICE_LEVEL"}],"environment":"PRODUCTION","exchangeRate":1.0,"expirationAt":1900000000000,\
        "expirationReason":null,"gracePeriodExpiresAt":null,"id":"apple:c5f0a1b2-0000-4000-8000-000000000001:renewal","isFamilyShare":false,\
        "isSmallBusiness":false,"isTrialConversion":false,"name":"renewal","newProductId":null,"offerCode":null,"originalAppUserId":"user-1",\
        "originalTransactionId":"2000000100000001","periodType":"NORMAL","price":9.99,"priceInPurchasedCurrency":9.99,\
        "proceeds":8.49,"productId":"com.example.pro.monthly","purchasedAt":1890000000000,"sdkEvents":[],\
        "source":{"notificationId":"c5f0a1b2-0000-4000-8000-000000000001","store":"apple","subtype":null,"type":"DID_RENEW"},"store":"APP_STORE",\
        "subscriptionStatus":{"entitlements":[{"id":"pro","type":"SERVICE_LEVEL"}],"status":"ACTIVE"},"takehomePercentage":0.85,\
        "taxPercentage":null,"transactionId":"2000000100000009","ts":1890000000000},"object":"event","projectId":1,"timestamp":1890000000000,\
        "type":"renewal"}
        """
}
