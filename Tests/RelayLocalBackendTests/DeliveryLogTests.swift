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
    /// A deliverer in this process hands its entries over as values: stored as the topic's body would have
    /// been, the same row as that body recorded from the topic, and the endpoint's state kept.
    @Test func entriesHandedOverAreStoredAsTheirTopicBodiesWouldBe() async throws {
        let log = DeliveryLog(database: try Self.database(), clock: { 10_000 })
        let attempt = DeliveryAttempt(
            app: "demo", endpoint: "hooks", eventId: "apple:n1:renewal", eventType: "renewal", subject: "sub", attempt: 1, outcome: .retrying,
            httpStatus: 503, durationMs: 12, error: "HTTP 503", startedAt: 8_988, finishedAt: 9_000, nextAttemptAt: 9_500)
        let status = EndpointStatus(endpoint: "hooks", app: "demo", circuitOpen: true, disabled: false, pausedUntil: nil, at: 9_001)
        #expect(try await log.record([.attempt(attempt), .status(status)]) == 1)
        // The same attempt from the topic (a deliverer elsewhere, or a restart's repeat) is the same row.
        #expect(try await log.record([attempt.serialized()]).inserted == 0)
        let page = try await log.page(DeliveryLog.Filter(), before: nil, limit: 10)
        #expect(page.attempts == [attempt.json])
        #expect(page.attempts.first.flatMap(DeliveryAttempt.init(json:)) == attempt)
        #expect(try await log.health(endpoint: "hooks", now: 10_000).status == status)
    }

    @Test func anUnsentDeadLetterAfterAFailedAttemptIsItsOwnRow() async throws {
        let log = DeliveryLog(database: try Self.database(), clock: { 10_000 })
        _ = try await log.record([Self.attempt("e", attempt: 2, outcome: .retrying, at: 5_000), Self.attempt("e", attempt: 2, outcome: .dead, at: 6_000)])
        var filter = DeliveryLog.Filter()
        filter.eventId = "e"
        #expect(try await log.page(filter, before: nil, limit: 10).attempts.compactMap { $0["outcome"]?.stringValue } == ["dead", "retrying"])
    }

    @Test func healthCountsWindowsPercentilesTheBacklogAndTheDeliverersReport() async throws {
        let now: Int64 = 100_000_000
        let log = DeliveryLog(database: try Self.database(), clock: { now })
        func attempt(_ event: String, _ number: Int, _ outcome: DeliveryAttempt.Outcome, duration: Int64?, at: Int64, endpoint: String = "hooks") -> [UInt8] {
            DeliveryAttempt(
                app: "demo", endpoint: endpoint, eventId: event, eventType: "renewal", subject: "sub", attempt: number, outcome: outcome,
                httpStatus: duration == nil ? nil : (outcome == .succeeded ? 200 : 500), durationMs: duration, error: outcome == .succeeded ? nil : "HTTP 500",
                startedAt: at - (duration ?? 0), finishedAt: at
            ).json.serialized()
        }
        // In the last hour: durations 10..100 (ten attempts, eight succeeded, one failed for good, one throttled);
        // two hours ago: one more failure (only in the day's window), still retrying; an unsent dead letter counts in no window.
        var bodies = (1...8).map { attempt("ok\($0)", 1, .succeeded, duration: Int64($0) * 10, at: now - 60_000) }
        bodies.append(attempt("bad", 1, .dead, duration: 90, at: now - 50_000))
        bodies.append(attempt("slow", 1, .throttled, duration: 100, at: now - 40_000))
        bodies.append(attempt("old", 1, .retrying, duration: 1_000, at: now - 7_200_000))
        bodies.append(attempt("unsent", 1, .dead, duration: nil, at: now - 30_000))
        bodies.append(attempt("elsewhere", 1, .dead, duration: 5, at: now - 30_000, endpoint: "other"))
        bodies.append(
            EndpointStatus(endpoint: "hooks", app: "demo", circuitOpen: true, disabled: false, pausedUntil: now + 5_000, at: now - 1_000).json.serialized())
        // An older report arriving late does not win.
        bodies.append(EndpointStatus(endpoint: "hooks", app: "demo", circuitOpen: false, disabled: false, pausedUntil: nil, at: now - 2_000).json.serialized())
        let result = try await log.record(bodies)
        #expect(result.invalid.isEmpty)
        let health = try await log.health(endpoint: "hooks", now: now)
        #expect(health.lastHour.attempts == 10)
        #expect(health.lastHour.succeeded == 8)
        #expect(health.lastHour.throttled == 1)
        // Nearest rank over 10, 20, ..., 100: the 5th and the 10th.
        #expect(health.lastHour.p50Ms == 50)
        #expect(health.lastHour.p99Ms == 100)
        #expect(health.lastDay.attempts == 11)
        #expect(health.lastDay.p99Ms == 1_000)
        #expect(health.dead == 2)
        #expect(health.retrying == 1)
        #expect(health.throttled == 1)
        #expect(health.lastFailure?["eventId"] == "unsent")
        #expect(health.status?.circuitOpen == true)
        #expect(health.status?.pausedUntil == now + 5_000)

        // Recover claims each failed event once: the dead and retrying ones in the range, not the throttled or succeeded.
        let claim = try await log.claimFailures(
            endpoint: "hooks", since: now - 86_400_000, until: now, limit: 2, now: now)
        #expect(claim.claimed.count == 2)
        #expect(claim.more)
        let rest = try await log.claimFailures(
            endpoint: "hooks", since: now - 86_400_000, until: now, limit: 10, now: now)
        #expect(Set((claim.claimed + rest.claimed).map(\.attempt.eventId)) == ["bad", "old", "unsent"])
        #expect(rest.alreadyResent == 2)
        // The same failure written again (a repeated record) is no new failure: nothing to claim.
        _ = try await log.record([attempt("bad", 1, .dead, duration: 90, at: now - 50_000)])
        let none = try await log.claimFailures(
            endpoint: "hooks", since: now - 86_400_000, until: now, limit: 10, now: now)
        #expect(none.claimed.isEmpty && none.alreadyResent == 3)
        // The re-sent delivery failed again: a new failure, claimed again.
        _ = try await log.record([
            DeliveryAttempt(
                app: "demo", endpoint: "hooks", eventId: "bad", eventType: "renewal", subject: "sub", attempt: 1, outcome: .dead, httpStatus: 500, durationMs: 9,
                error: "HTTP 500", startedAt: now - 5_000, finishedAt: now - 4_000, replayedFrom: "recover:9"
            ).json.serialized()
        ])
        let again = try await log.claimFailures(
            endpoint: "hooks", since: now - 86_400_000, until: now, limit: 10, now: now)
        #expect(again.claimed.map(\.attempt.eventId) == ["bad"])
    }
}
