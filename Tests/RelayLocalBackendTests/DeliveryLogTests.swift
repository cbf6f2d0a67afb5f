import Foundation
import RelayCore
import RelayLocalBackend
import RelayTestSupport
import Testing

/// The delivery log's storage: attempts recorded once by id, filtered and paged newest first, and kept
/// within their time and row bounds.
@Suite struct DeliveryLogTests {
    static func attempt(
        _ event: String, attempt: Int = 1, outcome: DeliveryAttempt.Outcome = .succeeded, endpoint: String = "hooks", app: String = "demo", at: Int64
    ) -> [UInt8] {
        DeliveryAttempt(
            app: app, endpoint: endpoint, eventId: event, eventType: "renewal", subject: "sub", attempt: attempt, outcome: outcome,
            httpStatus: outcome == .succeeded ? 200 : 500, durationMs: 12, error: outcome == .succeeded ? nil : "HTTP 500", startedAt: at - 12, finishedAt: at
        ).json.serialized()
    }

    static func database() throws -> SubscriptionDatabase {
        try SubscriptionDatabase(path: FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("delivery-log") + ".sqlite").path)
    }

    @Test func attemptsAreRecordedOnceFilteredAndPagedNewestFirst() async throws {
        let log = DeliveryLog(database: try Self.database(), clock: { 10_000_000 })
        let bodies = [
            Self.attempt("e1", outcome: .retrying, at: 1_000), Self.attempt("e1", attempt: 2, at: 2_000),
            Self.attempt("e2", outcome: .dead, endpoint: "other", at: 3_000), Self.attempt("e3", app: "web", at: 4_000),
        ]
        var result = try await log.record(bodies + [Array("not an attempt".utf8)])
        #expect(result.inserted == 4)
        #expect(result.invalid == [4])
        // Written again (the deliverer's retry of its produce): the same rows.
        result = try await log.record(bodies)
        #expect(result.inserted == 0)
        func ids(_ filter: DeliveryLog.Filter) async throws -> [String] {
            try await log.page(filter, before: nil, limit: 100).attempts.compactMap { "\($0["eventId"]?.stringValue ?? ""):\($0["attempt"]?.int64Value ?? 0)" }
        }
        #expect(try await ids(DeliveryLog.Filter()) == ["e3:1", "e2:1", "e1:2", "e1:1"])
        var filter = DeliveryLog.Filter()
        filter.eventId = "e1"
        #expect(try await ids(filter) == ["e1:2", "e1:1"])
        filter = DeliveryLog.Filter()
        filter.outcome = .dead
        #expect(try await ids(filter) == ["e2:1"])
        filter = DeliveryLog.Filter()
        filter.endpoint = "other"
        #expect(try await ids(filter) == ["e2:1"])
        filter = DeliveryLog.Filter()
        filter.apps = ["web"]
        #expect(try await ids(filter) == ["e3:1"])
        filter = DeliveryLog.Filter()
        filter.since = 2_000
        filter.until = 4_000
        #expect(try await ids(filter) == ["e2:1", "e1:2"])
        // Pages: two, then the rest from the cursor.
        let first = try await log.page(DeliveryLog.Filter(), before: nil, limit: 2)
        #expect(first.attempts.count == 2)
        let next = try #require(first.next)
        #expect(try await log.page(DeliveryLog.Filter(), before: next, limit: 2).attempts.compactMap { $0["eventId"]?.stringValue } == ["e1", "e1"])
    }

    @Test func attemptsPastTheRetentionOrTheRowBoundAreRemoved() async throws {
        // Kept 1 s, at most 1,000 rows.
        let log = DeliveryLog(database: try Self.database(), retentionMilliseconds: 1_000, maxAttempts: 1_000, clock: { 10_000 })
        _ = try await log.record([Self.attempt("old", at: 8_000), Self.attempt("recent", at: 9_500)])
        #expect(try await log.page(DeliveryLog.Filter(), before: nil, limit: 10).attempts.compactMap { $0["eventId"]?.stringValue } == ["recent"])
        _ = try await log.record((0..<1_200).map { Self.attempt("bulk-\($0)", at: 9_900) })
        let all = try await log.page(DeliveryLog.Filter(), before: nil, limit: 1_000)
        #expect(all.attempts.count == 1_000)
        #expect(all.next == nil)
        #expect(all.attempts.first?["eventId"] == "bulk-1199")
        #expect(all.attempts.last?["eventId"] == "bulk-200")
        // The same attempts again (a topic read twice): ignored, and they take no row of the bound.
        _ = try await log.record((200..<1_200).map { Self.attempt("bulk-\($0)", at: 9_900) })
        let again = try await log.page(DeliveryLog.Filter(), before: nil, limit: 1_000)
        #expect(again.attempts.count == 1_000)
        #expect(again.attempts.last?["eventId"] == "bulk-200")
    }

    /// A delivery dead-lettered unsent after attempt 2 failed (its endpoint disabled meanwhile): two rows.
    @Test func anUnsentDeadLetterAfterAFailedAttemptIsItsOwnRow() async throws {
        let log = DeliveryLog(database: try Self.database(), clock: { 10_000 })
        _ = try await log.record([Self.attempt("e", attempt: 2, outcome: .retrying, at: 5_000), Self.attempt("e", attempt: 2, outcome: .dead, at: 6_000)])
        var filter = DeliveryLog.Filter()
        filter.eventId = "e"
        #expect(try await log.page(filter, before: nil, limit: 10).attempts.compactMap { $0["outcome"]?.stringValue } == ["dead", "retrying"])
    }
}
