import Foundation
import Logging
import RelayApp
import RelayConfig
import RelayCore
import RelayHistory
import RelayTestSupport
import Testing

/// `reconcile google` on a whole relay (embedded log) against the fake Play Developer API of
/// `GooglePurchaseTests`: subscriptions whose Play notifications were lost (a cancellation, a renewal, an
/// expiry) are found by re-reading each stored token, corrected through the worker with the missed
/// events, once; one in step is left alone; Play's quota (429 with `Retry-After`) is waited out.
@Suite(.serialized) struct GoogleReconcileTests {
    /// `purchase` with its line item changed by `change`.
    static func changed(_ purchase: JSON, state: String? = nil, _ change: (inout [String: JSON]) -> Void) -> JSON {
        guard case .object(var members) = purchase, case .object(var item) = members["lineItems"]?.arrayValue?.first else { return purchase }
        change(&item)
        members["lineItems"] = .array([.object(item)])
        if let state { members["subscriptionState"] = .string(state) }
        return .object(members)
    }

    @Test func missedChangesAreCorrectedOnceWithTheirEventsAndPlaysQuotaIsWaitedOut() async throws {
        let harness = try await GooglePurchaseTests.start(subscriptions: [
            "token-c1": GooglePurchaseTests.subscription(acknowledged: true, order: "GPA.C1"),
            "token-c2": GooglePurchaseTests.subscription(acknowledged: true, order: "GPA.C2"),
            "token-c3": GooglePurchaseTests.subscription(acknowledged: true, order: "GPA.C3"),
            "token-c4": GooglePurchaseTests.subscription(acknowledged: true, order: "GPA.C4"),
        ], acknowledge: false)
        for index in 1...4 { #expect(try await harness.hand("user-c\(index)", token: "token-c\(index)").0 == 200) }
        #expect(try await harness.events("initial_purchase").count == 4)
        // What happened at Play while its notifications were lost: c1's auto-renewal turned off, c2 renewed
        // (a new order, a later expiry), c4 expired; c3 is unchanged.
        harness.play.subscriptions.withLock { purchases in
            purchases["token-c1"] = Self.changed(purchases["token-c1"]!, state: "SUBSCRIPTION_STATE_CANCELED") {
                $0["autoRenewingPlan"] = ["autoRenewEnabled": false]
            }
            purchases["token-c2"] = Self.changed(purchases["token-c2"]!) {
                $0["expiryTime"] = "2099-03-01T00:00:00Z"
                $0["latestSuccessfulOrderId"] = "GPA.C2..0"
            }
            purchases["token-c4"] = Self.changed(purchases["token-c4"]!, state: "SUBSCRIPTION_STATE_EXPIRED") {
                $0["expiryTime"] = "2026-11-01T00:00:00Z"
                $0["autoRenewingPlan"] = ["autoRenewEnabled": false]
            }
        }
        // Play's quota runs out on c3's read: 429 with Retry-After: 120, waited out (recorded, not slept).
        harness.play.throttled.withLock { $0 = ["token-c3"] }
        let waits = LockedBox<[Duration]>([])
        var commands = try GoogleHistoryCommands(
            configuration: harness.relay.configuration, appKey: "demo", producer: try harness.relay.environment.process.log.producer,
            backendURL: harness.backendURL, logger: Logger(label: "test"))
        commands.pacing = HistoryLoop.Pacing(waits: [.milliseconds(1)], maximumRetryAfter: .seconds(600)) { wait in waits.withLock { $0.append(wait) } }
        let lines = LockedBox<[String]>([])
        let summary = try await commands.reconcile(since: nil, progress: { line in lines.withLock { $0.append(line) } })
        #expect(summary.checked == 4)
        #expect(summary.inSync == 1)
        #expect(summary.failures.isEmpty, "\(summary.failures)")
        #expect(Dictionary(uniqueKeysWithValues: summary.corrections.map { ($0.originalTransactionId, $0.action) }) == [
            "token-c1": "SUBSCRIPTION_CANCELED", "token-c2": "SUBSCRIPTION_RENEWED", "token-c4": "SUBSCRIPTION_EXPIRED",
        ])
        #expect(waits.value == [.seconds(120)], "\(waits.value)")
        #expect(lines.value.contains { $0.contains("limits the rate") && $0.contains("120 s") }, "\(lines.value)")
        // Run again before the worker caught up: the same records, absorbed by their ids.
        _ = try await commands.reconcile(since: nil)

        try await waitUntil("the corrections applied") {
            let c1 = try await harness.state("token-c1")
            let c2 = try await harness.state("token-c2")
            let c4 = try await harness.state("token-c4")
            return c1?.autoRenew == false && c2?.expiresAt == Timestamp.milliseconds("2099-03-01T00:00:00Z") && c4?.status == .expired
        }
        // Once each: a repeat of a record is replayed with the same event ids, which receivers deduplicate.
        @Sendable func distinct(_ type: String) async throws -> Int { Set(try await harness.events(type).compactMap { $0["data"]?["id"]?.stringValue }).count }
        try await waitUntil("the missed events") {
            let cancellations = try await distinct("cancellation")
            let renewals = try await distinct("renewal")
            let expirations = try await distinct("expiration")
            return cancellations == 1 && renewals == 1 && expirations == 1
        }
        let renewal = try #require(try await harness.events("renewal").first)
        #expect(renewal["data"]?["transactionId"] == "GPA.C2..0", "\(renewal)")
        #expect(renewal["data"]?["source"]?["notificationId"]?.stringValue?.hasPrefix("reconcile:token-c2:2:") == true, "\(renewal)")
        #expect(try await harness.events("cancellation").first?["data"]?["originalTransactionId"] == "token-c1")
        #expect(try await harness.entitlements("user-c4") == [])
        #expect(try await harness.entitlements("user-c2") == ["pro"])
        // Delivered like live events: not historical.
        let records = try await harness.relay.records(topic: harness.relay.configuration.topics.events)
        #expect(records.allSatisfy { $0.headers.first(named: RelayHeaderName.historical) == nil }, "\(records.map(\.headers))")

        // In step now: nothing more is appended (c4 is no longer active, so no longer listed).
        let notifications = try await harness.relay.records(topic: harness.relay.configuration.topics.notifications).count
        let again = try await commands.reconcile(since: nil)
        #expect(again.corrections.isEmpty, "\(again.corrections)")
        #expect(again.checked == 3)
        #expect(try await harness.relay.records(topic: harness.relay.configuration.topics.notifications).count == notifications)
        #expect(try await distinct("cancellation") == 1)
        #expect(try await distinct("renewal") == 1)
        try await harness.stop()
    }

    @Test func aForgedReconcileRecordIsRejected() async throws {
        let harness = try await GooglePurchaseTests.start(subscriptions: ["token-f": GooglePurchaseTests.subscription(acknowledged: true)], acknowledge: false)
        // A reconcile record with a purchase notification type it never appends (4, a purchase) is malformed.
        let body: JSON = ["purchaseToken": "token-f", "productId": "pro_monthly", "kind": "subscription", "notificationType": 4, "reconcile": "4:0"]
        let producer = try harness.relay.environment.process.log.producer
        _ = try await producer.produce(
            RawNotification(
                store: .google, app: "demo", receivedAtMilliseconds: Int64(Date().timeIntervalSince1970 * 1000), body: body.serialized(),
                requestHeaders: [:], source: RawNotification.playAPISource
            ).record(topic: harness.relay.configuration.topics.notifications, subject: "token-f"))
        try await waitUntil("the rejection") {
            String(decoding: try await harness.relay.get("/metrics").body, as: UTF8.self).contains(#"reason="malformed""#)
        }
        #expect(try await harness.state("token-f") == nil)
        try await harness.stop()
    }
}
