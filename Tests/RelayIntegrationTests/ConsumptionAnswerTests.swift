import Foundation
import RelayApp
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayTestSupport
import Testing

/// Answers to CONSUMPTION_REQUEST notifications (`apps[].apple.consumption`), a whole relay (embedded
/// log, local backend) against the fake App Store Server API, with signed test notifications.
@Suite(.serialized) struct ConsumptionAnswerTests {
    let signer = AppleSigner()

    static func configuration(fake: FakeAppStore, consumption: Bool) throws -> RelayConfiguration {
        let answers = "consumption: { customerConsented: true, sampleContentProvided: true, refundPreference: DECLINE }"
        let apple = [AppleRelayConfiguration.serverApi(fake)] + (consumption ? [answers] : [])
        return try AppleRelayConfiguration.parse(AppleRelayConfiguration.text(apple: apple), name: "consumption")
    }

    /// A notification body of `type` with its own UUID, for `transaction`.
    func body(_ type: String, subtype: String? = nil, uuid: String, transaction: JSON = AppleSigner.transaction()) -> String {
        var payload = signer.notificationPayload(type: type, subtype: subtype, transaction: transaction)
        if case .object(var members) = payload {
            members["notificationUUID"] = .string(uuid)
            payload = .object(members)
        }
        return String(decoding: signer.body(payload), as: UTF8.self)
    }

    static func metric(_ relay: TestRelay, _ name: String, _ labels: [String]) async throws -> Int? {
        let text = try await relay.get("/metrics").bodyText
        for line in text.split(separator: "\n") where line.hasPrefix(name + "{") && labels.allSatisfy({ line.contains($0) }) {
            return line.split(separator: " ").last.flatMap { Double($0) }.map { Int($0) }
        }
        return nil
    }

    static func put(_ fake: FakeAppStore) -> [TestHTTPRequest] {
        fake.requests.filter { $0.method == "PUT" }
    }

    @Test func aConsumptionRequestIsAnsweredWithTheStoredStateAndTheConfiguration() async throws {
        let fake = try await FakeAppStore(systemClock: true) { _, _ in TestHTTPResponse(status: 202, text: "") }
        let relay = try await TestRelay(configuration: try Self.configuration(fake: fake, consumption: true), log: .embedded)
        // The subscription exists and gives access: DELIVERED, and no consumptionPercentage (auto-renewable).
        #expect(try await relay.post("/v1/notifications/apple/demo", body: body("SUBSCRIBED", subtype: "INITIAL_BUY", uuid: "sub-1")).status == 200)
        #expect(try await relay.post("/v1/notifications/apple/demo", body: body("CONSUMPTION_REQUEST", uuid: "consumption-1")).status == 200)
        try await waitUntil("the consumption answer") { !Self.put(fake).isEmpty }
        let request = try #require(Self.put(fake).first)
        #expect(request.path == "/inApps/v2/transactions/consumption/2000000999999999")
        #expect(
            try JSON.parse(request.body)
                == ["customerConsented": true, "deliveryStatus": "DELIVERED", "sampleContentProvided": true, "refundPreference": "DECLINE"])

        // A consumable the relay holds: DELIVERED, with a consumptionPercentage of 100 % (it cannot see partial use).
        func consumable(_ id: String) -> JSON {
            var transaction = AppleSigner.transaction(originalTransactionId: id)
            if case .object(var members) = transaction {
                members["type"] = "Consumable"
                members["transactionId"] = .string(id)
                members["expiresDate"] = nil
                transaction = .object(members)
            }
            return transaction
        }
        let bought = consumable("3000000000000001")
        #expect(try await relay.post("/v1/notifications/apple/demo", body: body("ONE_TIME_CHARGE", uuid: "charge-2", transaction: bought)).status == 200)
        #expect(
            try await relay.post("/v1/notifications/apple/demo", body: body("CONSUMPTION_REQUEST", uuid: "consumption-2", transaction: bought)).status
                == 200)
        try await waitUntil("the second answer") { Self.put(fake).count == 2 }
        let second = Self.put(fake)[1]
        #expect(second.path == "/inApps/v2/transactions/consumption/3000000000000001")
        #expect(
            try JSON.parse(second.body) == [
                "customerConsented": true, "deliveryStatus": "DELIVERED", "sampleContentProvided": true, "consumptionPercentage": 100_000,
                "refundPreference": "DECLINE",
            ])

        // A purchase the relay never saw: not answered ("not delivered" would argue for the refund), counted.
        let unknown = consumable("3000000000000002")
        #expect(
            try await relay.post("/v1/notifications/apple/demo", body: body("CONSUMPTION_REQUEST", uuid: "consumption-3", transaction: unknown)).status
                == 200)
        try await waitUntil("the unknown purchase counted") {
            try await Self.metric(relay, "relay_consumption_answers_total", [#"app="demo""#, #"result="unknown_purchase""#]) == 1
        }
        #expect(Self.put(fake).count == 2)
        #expect(fake.refusals.value.isEmpty, "\(fake.refusals.value)")
        #expect(try await Self.metric(relay, "relay_consumption_answers_total", [#"app="demo""#, #"result="sent""#]) == 2)
        try await relay.stop()
        await fake.stop()
    }

    @Test func withoutConsumptionConfiguredNothingIsSent() async throws {
        let fake = try await FakeAppStore(systemClock: true) { _, _ in TestHTTPResponse(status: 202, text: "") }
        let relay = try await TestRelay(configuration: try Self.configuration(fake: fake, consumption: false), log: .embedded)
        #expect(try await relay.post("/v1/notifications/apple/demo", body: body("CONSUMPTION_REQUEST", uuid: "consumption-1")).status == 200)
        try await waitUntil("the request processed") {
            try await Self.metric(relay, "relay_notifications_accepted_total", [#"store="apple""#]) == 1
        }
        try await Task.sleep(for: .milliseconds(300))
        #expect(fake.requests.isEmpty)
        try await relay.stop()
        await fake.stop()
    }

    @Test func aRefusedKeyFinishesTheRecordAndIsCounted() async throws {
        let fake = try await FakeAppStore(systemClock: true) { _, _ in
            FakeAppStore.appleError(401, 0, "Unauthenticated")
        }
        let relay = try await TestRelay(configuration: try Self.configuration(fake: fake, consumption: true), log: .embedded)
        let backendURL = await relay.environment.process.backendAddress.value()
        #expect(try await relay.post("/v1/notifications/apple/demo", body: body("SUBSCRIBED", subtype: "INITIAL_BUY", uuid: "sub-1")).status == 200)
        #expect(try await relay.post("/v1/notifications/apple/demo", body: body("CONSUMPTION_REQUEST", uuid: "consumption-1")).status == 200)
        // The same subscription's next notification runs only once the request's record finished.
        #expect(try await relay.post("/v1/notifications/apple/demo", body: body("DID_CHANGE_RENEWAL_STATUS", subtype: "AUTO_RENEW_DISABLED", uuid: "renew-1")).status == 200)
        try await waitUntil("the next notification's events") {
            let response = try await relay.http.send(
                "GET", backendURL + "/subscriptions-api/internal/v1/events?environment=ALL&notificationId=renew-1",
                headers: [("Authorization", "Bearer test-backend-key")])
            return !((try JSON.parse(response.body))["events"]?.arrayValue ?? []).isEmpty
        }
        #expect(Self.put(fake).count == 1, "a refused key is not retried")
        #expect(try await Self.metric(relay, "relay_consumption_answers_total", [#"app="demo""#, #"result="key_refused""#]) == 1)
        try await relay.stop()
        await fake.stop()
    }

    @Test func appleUnavailableRetriesTheRecordUntilTheAnswerIsTaken() async throws {
        // Three 503s (the client's own retry, then the worker's), then Apple takes it.
        let fake = try await FakeAppStore(systemClock: true) { _, index in
            index < 3 ? FakeAppStore.appleError(503, 5_000_000, "An unknown error occurred.") : TestHTTPResponse(status: 202, text: "")
        }
        let relay = try await TestRelay(configuration: try Self.configuration(fake: fake, consumption: true), log: .embedded)
        #expect(try await relay.post("/v1/notifications/apple/demo", body: body("SUBSCRIBED", subtype: "INITIAL_BUY", uuid: "sub-1")).status == 200)
        #expect(try await relay.post("/v1/notifications/apple/demo", body: body("CONSUMPTION_REQUEST", uuid: "consumption-1")).status == 200)
        try await waitUntil("the answer taken") {
            try await Self.metric(relay, "relay_consumption_answers_total", [#"app="demo""#, #"result="sent""#]) == 1
        }
        #expect(Self.put(fake).count == 4)
        #expect(try await Self.metric(relay, "relay_consumption_answers_total", [#"app="demo""#, #"result="unavailable""#]) ?? 0 >= 1)
        try await relay.stop()
        await fake.stop()
    }
}
