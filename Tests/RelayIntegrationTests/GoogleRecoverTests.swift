import Foundation
import Logging
import RelayApp
import RelayConfig
import RelayCore
import RelayHistory
import RelayTestSupport
import Testing

/// `recover google` on a whole relay (embedded log) against the fake Play Developer API of
/// `GooglePurchaseTests` with its Voided Purchases API (pages of two, a 429 first): a refund Play's
/// notification of was lost is found only by `recover google`, applied once, and takes its money back; a
/// refund the relay heard of is left alone; a second run appends nothing.
@Suite(.serialized) struct GoogleRecoverTests {
    @Test func aRefundFoundOnlyByRecoverIsAppliedOnceAndARerunAppendsNothing() async throws {
        let harness = try await GooglePurchaseTests.start(subscriptions: [
            "token-r1": GooglePurchaseTests.subscription(order: "GPA.R1"), "token-r2": GooglePurchaseTests.subscription(order: "GPA.R2"),
        ], acknowledge: false)
        // Two purchases the relay knows, handed over by their users.
        #expect(try await harness.hand("user-r1", token: "token-r1").0 == 200)
        #expect(try await harness.hand("user-r2", token: "token-r2").0 == 200)
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        harness.play.voided.withLock {
            $0 = [
                ["kind": "androidpublisher#voidedPurchase", "purchaseToken": "token-r1", "orderId": "GPA.R1", "purchaseTimeMillis": "1893456000000",
                 "voidedTimeMillis": .string(String(now - 3_600_000)), "voidedSource": 0, "voidedReason": 1],
                ["kind": "androidpublisher#voidedPurchase", "purchaseToken": "token-r2", "orderId": "GPA.R2", "purchaseTimeMillis": "1893456000000",
                 "voidedTimeMillis": .string(String(now - 1_800_000)), "voidedSource": 2, "voidedReason": 7],
                ["kind": "androidpublisher#voidedPurchase", "purchaseToken": "token-unknown", "orderId": "GPA.X", "purchaseTimeMillis": "1893456000000",
                 "voidedTimeMillis": .string(String(now - 900_000)), "voidedSource": 0, "voidedReason": 0],
            ]
        }
        // Play's notification of the second refund reached the relay; the first one's was lost.
        var notification = GooglePushSigner.developerNotification()
        if case .object(var members) = notification {
            members.removeValue(forKey: "subscriptionNotification")
            members["voidedPurchaseNotification"] = ["purchaseToken": "token-r2", "orderId": "GPA.R2", "productType": 1, "refundType": 1]
            notification = .object(members)
        }
        let claims = GooglePushSigner.claims(issuedAt: now / 1000, overrides: ["aud": "https://relay.test/google"])
        #expect(try await harness.relay.http.send(
            "POST", harness.relay.baseURL + "/v1/notifications/google/demo",
            headers: [("Content-Type", "application/json"), ("Authorization", "Bearer \(GooglePushSigner().token(claims))")],
            body: GooglePushSigner.envelope(notification, messageId: "m-voided-r2")
        ).status == 200)
        try await waitUntil("the live refund") { try await harness.events("cancellation").count == 1 }

        let commands = try GoogleHistoryCommands(
            configuration: harness.relay.configuration, appKey: "demo", producer: try harness.relay.environment.process.log.producer,
            backendURL: harness.backendURL, logger: Logger(label: "test"))
        let summary = try await commands.recover(since: now - 86_400_000, until: nil)
        // The unknown token's refund is appended too: the relay never recorded it (the worker then finds no
        // purchase of it to take back, and its events say so).
        #expect(summary == GoogleHistoryCommands.RecoverSummary(found: 3, alreadyProcessed: 1, reingested: 2))
        // The requests: the quota error once, then two pages.
        let calls = harness.play.voidedCalls.value
        #expect(calls.count >= 3, "\(calls)")
        #expect(calls.last?.contains("token=2") == true, "\(calls)")
        #expect(calls.allSatisfy { $0.contains("type=1") && $0.contains("startTime=") }, "\(calls)")
        // The lost refund takes its money back, once.
        try await waitUntil("the recovered refund") {
            try await harness.events("cancellation").contains { $0["data"]?["transactionId"] == "GPA.R1" }
        }
        let refund = try #require(try await harness.events("cancellation").first { $0["data"]?["transactionId"] == "GPA.R1" })
        #expect(refund["data"]?["cancelReason"] == "CUSTOMER_SUPPORT")
        #expect((refund["data"]?["price"]?.doubleValue ?? 0) < 0, "\(refund)")
        #expect(refund["data"]?["source"]?["notificationId"] == "voided:GPA.R1")
        // The unknown purchase's refund goes out as the live notification's would: a cancellation whose
        // price is unknown (null), naming no user.
        try await waitUntil("the unknown one's refund") { try await harness.events("cancellation").count == 3 }
        let unknown = try #require(try await harness.events("cancellation").first { $0["data"]?["transactionId"] == "GPA.X" })
        #expect(unknown["data"]?["price"] == .null)
        // Again: every refund is recorded; nothing is appended.
        let again = try await commands.recover(since: now - 86_400_000, until: nil)
        #expect(again == GoogleHistoryCommands.RecoverSummary(found: 3, alreadyProcessed: 3, reingested: 0))
        #expect(try await harness.events("cancellation").filter { $0["data"]?["transactionId"] == "GPA.R1" }.count == 1)
        // Play's own notification of the recovered refund arrives late (Pub/Sub retried it for days): the same
        // refund, the same event id; the events store counts it once.
        if case .object(var members) = notification {
            members["voidedPurchaseNotification"] = ["purchaseToken": "token-r1", "orderId": "GPA.R1", "productType": 1, "refundType": 1]
            notification = .object(members)
        }
        #expect(try await harness.relay.http.send(
            "POST", harness.relay.baseURL + "/v1/notifications/google/demo",
            headers: [("Content-Type", "application/json"), ("Authorization", "Bearer \(GooglePushSigner().token(claims))")],
            body: GooglePushSigner.envelope(notification, messageId: "m-voided-r1-late")
        ).status == 200)
        try await waitUntil("the late notification applied") {
            try await harness.state("token-r1")?.recentNotifications.contains { $0.id == "m-voided-r1-late" } == true
        }
        let recorded = try await harness.relay.http.send(
            "GET", harness.backendURL + "/subscriptions-api/internal/v1/events?type=cancellation&environment=ALL&originalTransactionId=token-r1",
            headers: [("Authorization", "Bearer test-backend-key")])
        #expect(try JSON.parse(recorded.body)["events"]?.arrayValue?.count == 1, "\(String(decoding: recorded.body, as: UTF8.self))")
        // A play-api record Google's list does not hold (forged, or written by hand) is rejected, never applied.
        let forged: JSON = [
            "version": "1.0", "packageName": "com.example.app", "eventTimeMillis": .string(String(now)),
            "voidedPurchaseNotification": ["purchaseToken": "token-r2", "orderId": "GPA.FORGED", "productType": 1, "refundType": 1],
        ]
        _ = try await harness.relay.environment.process.log.producer.produce([
            RawNotification(
                store: .google, app: "demo", receivedAtMilliseconds: now, body: forged.serialized(), requestHeaders: [:], source: RawNotification.playAPISource
            ).record(topic: harness.relay.configuration.topics.notifications, subject: "token-r2")
        ])
        let rejected = try await harness.relay.records(topic: harness.relay.configuration.topics.rejected, atLeast: 1)
        #expect(rejected.first?.headers.first(named: RelayHeaderName.rejectReason)?.stringValue == "purchase_not_found")
        #expect(Set(try await harness.events("cancellation").compactMap { $0["data"]?["id"]?.stringValue }).count == 3)
        try await harness.stop()
    }
}
