import Foundation
import Logging
import RelayConfig
import RelayCore
import RelayLocalBackend
import RelayTestSupport
import Testing

/// The grants' schedule (`GrantExpiry`) against an injected clock: a grant's `expire` record is appended
/// once the clock passes its end, never before, once per retry interval while it is still active.
@Suite struct GrantExpiryTests {
    static let start: Int64 = 1_800_000_000_000

    static func grant(_ id: String, expiresAt: Int64?, status: SubscriptionState.Status = .active) -> SubscriptionState {
        SubscriptionState(
            store: .promotional, originalTransactionId: id, applicationId: 1, originalAppUserId: "user-\(id)",
            productId: PromotionalGrant.productId(entitlement: "pro"), status: status, periodType: .promotional, autoRenew: false,
            expiresAt: expiresAt, lastTransactionId: id, sourceTimestamp: start)
    }

    @Test func aGrantEndsWhenTheClockPassesItsEndAndNotBefore() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("grant-expiry"))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let configuration = try RelayConfiguration.parse(
            yaml: """
                backend: { apiKey: "sk_test_0001", database: backend.sqlite, listen: "127.0.0.1:0" }
                apps:
                  - { key: demo, projectId: 1, applicationId: 1, stripe: { signingSecrets: [whsec_x] } }
                """, baseDirectory: directory.path, environment: [:])
        let database = try SubscriptionDatabase(path: configuration.backend.database)
        let now = LockedBox<Int64>(Self.start)
        let appended = LockedBox<[OutgoingRecord]>([])
        let intake = AppPurchases(
            topic: "relay.notifications", storeAPIs: StoreAPIs(), verifyApple: { _, _ in .failure(Rejection(.malformed, "unused")) },
            append: { record in appended.withLock { $0.append(record) } })
        let backend = try LocalBackend(configuration: configuration, database: database, clock: { now.value }, appPurchases: intake)
        for state in [
            Self.grant("g-month", expiresAt: Self.start + 60_000), Self.grant("g-life", expiresAt: nil),
            Self.grant("g-ended", expiresAt: Self.start - 1, status: .expired),
        ] {
            guard case .written = try await database.write(state, ifMatch: 0) else { Issue.record("not written"); return }
        }
        let service = GrantExpiry(backend: backend, logger: Logger(label: "test"), tick: .milliseconds(5))
        let task = Task { try await service.run() }
        defer { task.cancel() }

        // However often it looks before the end: nothing.
        try await waitUntil("several looks") { try await database.nextGrantExpiry() == Self.start + 60_000 }
        try await Task.sleep(for: .milliseconds(50))
        #expect(appended.value.isEmpty)

        now.withLock { $0 = Self.start + 60_000 }
        try await waitUntil("the grant's end appended") { appended.value.count == 1 }
        let record = try #require(appended.value.first)
        #expect(record.topic == "relay.notifications")
        #expect(String(decoding: record.key ?? [], as: UTF8.self) == "promotional:g-month")
        #expect(record.headers.first(named: RelayHeaderName.store)?.stringValue == "promotional")
        #expect(record.headers.first(named: RelayHeaderName.source)?.stringValue == PromotionalGrant.source)
        let body = try #require(PromotionalGrant.Record(json: try JSON.parse(record.value)))
        #expect(body == PromotionalGrant.Record(
            action: .expire, grantId: "g-month", appUserId: "user-g-month", entitlement: "pro", expiresAt: Self.start + 60_000, reason: nil,
            at: Self.start + 60_000))

        // Not applied yet (no worker here): not appended again until the retry interval passed.
        try await Task.sleep(for: .milliseconds(50))
        #expect(appended.value.count == 1)
        now.withLock { $0 += 60_000 }
        try await waitUntil("appended again") { appended.value.count == 2 }
        // Applied: the schedule has nothing left to end.
        var ended = Self.grant("g-month", expiresAt: Self.start + 60_000, status: .expired)
        ended.sourceTimestamp = Self.start + 60_000
        guard case .written = try await database.write(ended, ifMatch: 1) else { Issue.record("not written"); return }
        #expect(try await database.nextGrantExpiry() == nil)
        #expect(try await database.dueGrants(now: .max).isEmpty)
    }
}
