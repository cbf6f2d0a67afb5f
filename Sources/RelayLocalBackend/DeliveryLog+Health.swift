import Foundation
import GRDB
public import RelayCore

// The endpoints route's reads of the delivery log (each endpoint's windows, latest failure and backlog) and
// the ledger of what was re-sent.
extension DeliveryLog {
    /// One endpoint's attempts over a window: how many were sent, how many succeeded, how many the endpoint
    /// throttled, and the 50th and 99th percentile of their durations (nearest rank).
    public struct Window: Sendable, Equatable {
        public var attempts = 0
        public var succeeded = 0
        public var throttled = 0
        public var p50Ms: Int64?
        public var p99Ms: Int64?

        var json: JSON {
            // Throttled answers are not failures: the rate is of the attempts that had an outcome.
            let judged = attempts - throttled
            return [
                "attempts": .integer(Int64(attempts)), "succeeded": .integer(Int64(succeeded)), "throttled": .integer(Int64(throttled)),
                "successRate": judged > 0 ? .number(Double(succeeded) / Double(judged)) : .null,
                "p50Ms": p50Ms.map(JSON.integer) ?? .null, "p99Ms": p99Ms.map(JSON.integer) ?? .null,
            ]
        }
    }

    /// An endpoint's health as recorded: its windows, its latest failure, what waits in retry and in the
    /// dead-letter topic (each event counted by its latest attempt), and the deliverers' latest report.
    public struct Health: Sendable {
        public var lastHour = Window()
        public var lastDay = Window()
        public var lastFailure: JSON?
        public var retrying = 0
        public var throttled = 0
        public var dead = 0
        public var status: EndpointStatus?
    }

    public func health(endpoint: String, now: Int64) async throws -> Health {
        try await pool.read { db in
            var health = Health()
            func window(since: Int64) throws -> Window {
                var window = Window()
                let row = try Row.fetchOne(
                    db,
                    sql: """
                        SELECT COUNT(*), COALESCE(SUM(outcome = 'succeeded'), 0), COALESCE(SUM(outcome = 'throttled'), 0) FROM delivery_attempt
                        WHERE endpoint = ? AND finished_at >= ? AND duration_ms IS NOT NULL
                        """,
                    arguments: [endpoint, since])
                window.attempts = row?[0] ?? 0
                window.succeeded = row?[1] ?? 0
                window.throttled = row?[2] ?? 0
                func percentile(_ q: Double) throws -> Int64? {
                    guard window.attempts > 0 else { return nil }
                    let rank = max(1, Int((q * Double(window.attempts)).rounded(.up)))
                    return try Int64.fetchOne(
                        db,
                        sql: """
                            SELECT duration_ms FROM delivery_attempt WHERE endpoint = ? AND finished_at >= ? AND duration_ms IS NOT NULL
                            ORDER BY duration_ms LIMIT 1 OFFSET ?
                            """,
                        arguments: [endpoint, since, rank - 1])
                }
                window.p50Ms = try percentile(0.5)
                window.p99Ms = try percentile(0.99)
                return window
            }
            health.lastHour = try window(since: now - 3_600_000)
            health.lastDay = try window(since: now - 86_400_000)
            let latestFailure = try ["retrying", "dead", "throttled"].compactMap { outcome in
                try Int64.fetchOne(db, sql: "SELECT MAX(seq) FROM delivery_attempt WHERE endpoint = ? AND outcome = ?", arguments: [endpoint, outcome])
            }.max()
            if let latestFailure, let body = try String.fetchOne(db, sql: "SELECT body FROM delivery_attempt WHERE seq = ?", arguments: [latestFailure]) {
                health.lastFailure = try? JSON.parse(Array(body.utf8))
            }
            let backlog = try Row.fetchAll(
                db,
                sql: Self.backlogQuery,
                arguments: [endpoint])
            for row in backlog {
                let count: Int = row["n"]
                switch row["outcome"] as String {
                case "retrying": health.retrying = count
                case "throttled": health.throttled = count
                case "dead": health.dead = count
                default: break
                }
            }
            if let body = try String.fetchOne(db, sql: "SELECT body FROM endpoint_status WHERE endpoint = ?", arguments: [endpoint]),
                let json = try? JSON.parse(Array(body.utf8))
            {
                health.status = EndpointStatus(json: json)
            }
            return health
        }
    }

    /// A recorded attempt and its row number.
    public struct Recorded: Sendable {
        public var seq: Int64
        public var attempt: DeliveryAttempt
    }

    /// The attempt with this id (`DeliveryAttempt.id`), if still kept.
    public func attempt(id: String) async throws -> Recorded? {
        try await pool.read { db in
            guard let row = try Row.fetchOne(db, sql: "SELECT seq, body FROM delivery_attempt WHERE id = ?", arguments: [id]),
                let json = try? JSON.parse(Array((row["body"] as String).utf8)), let attempt = DeliveryAttempt(json: json)
            else { return nil }
            return Recorded(seq: row["seq"], attempt: attempt)
        }
    }

    /// What a recover found: the failures it claimed to re-send, those re-sent before, and whether more
    /// are left beyond `limit`.
    public struct Claim: Sendable {
        public var claimed: [Recorded] = []
        public var alreadyResent = 0
        public var more = false
    }

    /// Claims, in one transaction, the deliveries of `endpoint` to re-send: each event whose latest attempt
    /// to this endpoint failed (`retrying`) or died (`dead`) in `[since, until)`, that has not succeeded there
    /// since its first failure in the range (a re-send that worked, then a failed retry of the original
    /// chain, is not sent a third time), unless that latest failure was re-sent before. A re-sent delivery
    /// that fails again fails after `until` when the range ends now, so the same range never claims it again.
    /// At most `limit`; each claimed failure is written to the ledger with its `recoverMark` (the re-sent
    /// delivery's `relay-replayed-from`), so concurrent and later recovers skip it.
    public func claimFailures(
        endpoint: String, since: Int64, until: Int64, limit: Int, now: Int64
    ) async throws -> Claim {
        try await pool.write { db in
            var claim = Claim()
            let rows = try Row.fetchAll(
                db,
                sql: Self.claimQuery,
                arguments: [endpoint, since, until])
            for row in rows {
                if row["resent"] as Bool {
                    claim.alreadyResent += 1
                    continue
                }
                guard claim.claimed.count < limit else {
                    claim.more = true
                    break
                }
                guard let json = try? JSON.parse(Array((row["body"] as String).utf8)), let attempt = DeliveryAttempt(json: json) else { continue }
                let recorded = Recorded(seq: row["seq"], attempt: attempt)
                try Self.ledger(db, recorded, now: now, replayedFrom: Self.recoverMark(recorded))
                claim.claimed.append(recorded)
            }
            return claim
        }
    }

    /// The `relay-replayed-from` of a recover's re-sent delivery, and its ledger mark.
    static func recoverMark(_ failure: Recorded) -> String { "recover:\(failure.seq)" }

    /// Writes an explicit resend of `recorded` to the ledger (a recover then skips that failure); written before
    /// the resend is appended, and forgotten if the append fails.
    public func recordResend(_ recorded: Recorded, now: Int64, replayedFrom: String) async throws {
        try await pool.write { db in try Self.ledger(db, recorded, now: now, replayedFrom: replayedFrom) }
    }

    /// Forgets claimed resends whose records could not be appended, so a later recover tries them again.
    public func forgetResends(replayedFrom marks: [String]) async throws {
        guard !marks.isEmpty else { return }
        try await pool.write { db in
            for chunk in stride(from: 0, to: marks.count, by: 500).map({ Array(marks[$0..<min($0 + 500, marks.count)]) }) {
                try db.execute(
                    sql: "DELETE FROM delivery_resend WHERE replayed_from IN (\(chunk.map { _ in "?" }.joined(separator: ", ")))",
                    arguments: StatementArguments(chunk))
            }
        }
    }

    private static func ledger(_ db: Database, _ recorded: Recorded, now: Int64, replayedFrom: String) throws {
        try db.execute(
            sql: "INSERT INTO delivery_resend (failure_id, requested_at, replayed_from) VALUES (?, ?, ?)",
            arguments: [recorded.attempt.id, now, replayedFrom])
    }

    /// The events whose latest attempt to endpoint `?1` failed, by that attempt's outcome: each event's latest
    /// failed attempt (read with its event from `endpointOutcomeIndex` alone), unless a later attempt of the
    /// event (a success: the failures are all in the first read) is found in its range of the ids' index
    /// (`eventAttempts`). Its cost follows the endpoint's failures kept, not its history.
    static let backlogQuery = """
        SELECT outcome, COUNT(*) AS n FROM (
            SELECT event_id, outcome, MAX(seq) AS latest FROM delivery_attempt INDEXED BY \(DeliveryLog.endpointOutcomeIndex)
            WHERE endpoint = ?1 AND outcome IN ('retrying', 'throttled', 'dead') GROUP BY event_id) f
        WHERE NOT EXISTS (
            SELECT 1 FROM delivery_attempt s INDEXED BY \(DeliveryLog.idIndex)
            WHERE \(DeliveryLog.eventAttempts("s", endpoint: "?1", event: "f.event_id")) AND s.seq > f.latest)
        GROUP BY outcome
        """

    /// `claimFailures`' candidates of endpoint `?1` in `[?2, ?3)`: each event that failed there in the range
    /// (by endpoint and time), its latest attempt, whether that one was re-sent before, and whether the
    /// event succeeded after its first failure in the range, the event's attempts read through the ids' index.
    static let claimQuery = """
        WITH failed AS (
            SELECT DISTINCT event_id FROM delivery_attempt
            WHERE endpoint = ?1 AND finished_at >= ?2 AND finished_at < ?3 AND outcome IN ('retrying', 'dead')
        )
        SELECT d.seq, d.body, d.app, EXISTS (SELECT 1 FROM delivery_resend r WHERE r.failure_id = d.id) AS resent
        FROM failed f JOIN delivery_attempt d
            ON d.seq = (
                SELECT MAX(x.seq) FROM delivery_attempt x INDEXED BY \(DeliveryLog.idIndex)
                WHERE \(DeliveryLog.eventAttempts("x", endpoint: "?1", event: "f.event_id")))
        WHERE d.outcome IN ('retrying', 'dead') AND d.finished_at >= ?2 AND d.finished_at < ?3
            AND NOT EXISTS (
                SELECT 1 FROM delivery_attempt s INDEXED BY \(DeliveryLog.idIndex)
                WHERE \(DeliveryLog.eventAttempts("s", endpoint: "?1", event: "f.event_id")) AND s.outcome = 'succeeded'
                    AND s.seq > (
                        SELECT MIN(m.seq) FROM delivery_attempt m INDEXED BY \(DeliveryLog.idIndex)
                        WHERE \(DeliveryLog.eventAttempts("m", endpoint: "?1", event: "f.event_id"))
                            AND m.finished_at >= ?2 AND m.finished_at < ?3 AND m.outcome IN ('retrying', 'dead')))
        ORDER BY d.seq
        """

    /// SQLite's plans for the health's backlog and for a recover's claim, one line a step (the tests hold
    /// them to indexes).
    package func healthPlans() async throws -> (backlog: [String], claim: [String]) {
        try await pool.read { db in
            (try db.queryPlan(Self.backlogQuery, arguments: ["hooks"]), try db.queryPlan(Self.claimQuery, arguments: ["hooks", 0, 1]))
        }
    }
}
