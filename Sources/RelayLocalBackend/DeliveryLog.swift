import Dispatch
import Foundation
import GRDB
public import RelayCore

/// The delivery log: every webhook attempt the deliverer made (`DeliveryAttempt`), recorded from the
/// delivery log's topic by `EventRecorder`, queried by `GET /subscriptions-api/internal/v1/deliveries`.
/// Recording is idempotent on the attempt's id. Attempts are kept for `retention` and at most
/// `maxAttempts` rows: each recording removes up to `pruneBatch` older ones for each bound. Pages come newest
/// recorded first (a failed attempt's record can be recorded a little after a later success's).
public final class DeliveryLog: Sendable {
    let pool: DatabasePool
    public let retention: Int64
    public let maxAttempts: Int
    let clock: @Sendable () -> Int64

    /// The most rows one recording removes for each bound.
    static let pruneBatch = 5_000

    public init(database: SubscriptionDatabase, retentionMilliseconds: Int64 = 30 * 86_400_000, maxAttempts: Int = 10_000_000, clock: (@Sendable () -> Int64)? = nil) {
        pool = database.pool
        retention = retentionMilliseconds
        self.maxAttempts = maxAttempts
        self.clock = clock ?? { Int64(Date().timeIntervalSince1970 * 1000) }
    }

    static func createSchema(_ db: Database) throws {
        try db.execute(
            sql: """
                CREATE TABLE delivery_attempt (
                    -- No AUTOINCREMENT: an ignored repeat takes no number, so the newest row's number less the
                    -- oldest's is the row count the bound is kept by.
                    seq INTEGER PRIMARY KEY,
                    id TEXT NOT NULL UNIQUE,
                    app TEXT NOT NULL,
                    endpoint TEXT NOT NULL,
                    event_id TEXT NOT NULL,
                    event_type TEXT NOT NULL,
                    subject TEXT,
                    attempt INTEGER NOT NULL,
                    outcome TEXT NOT NULL,
                    http_status INTEGER,
                    finished_at INTEGER NOT NULL,
                    body TEXT NOT NULL
                );
                CREATE INDEX delivery_attempt_by_time ON delivery_attempt (finished_at);
                CREATE INDEX delivery_attempt_by_event ON delivery_attempt (event_id, seq);
                CREATE INDEX delivery_attempt_by_endpoint ON delivery_attempt (endpoint, seq);
                CREATE INDEX delivery_attempt_by_app ON delivery_attempt (app, seq);
                CREATE INDEX delivery_attempt_by_outcome ON delivery_attempt (outcome, seq);
                """)
    }

    /// Records `attempts` (a repeat of one is the same row), then removes what is past the retention or the
    /// row bound. Returns how many were new and which entries were not attempts.
    public func record(_ bodies: [[UInt8]]) async throws -> (inserted: Int, invalid: [Int]) {
        let now = clock()
        let retention = self.retention
        let maxAttempts = self.maxAttempts
        return try await pool.write { db in
            var inserted = 0
            var invalid: [Int] = []
            for (index, body) in bodies.enumerated() {
                guard let json = try? JSON.parse(body), let attempt = DeliveryAttempt(json: json) else {
                    invalid.append(index)
                    continue
                }
                try db.execute(
                    sql: """
                        INSERT OR IGNORE INTO delivery_attempt (id, app, endpoint, event_id, event_type, subject, attempt, outcome, http_status, finished_at, body)
                        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                        """,
                    arguments: [
                        attempt.id, attempt.app, attempt.endpoint, attempt.eventId, attempt.eventType, attempt.subject, attempt.attempt,
                        attempt.outcome.rawValue, attempt.httpStatus, attempt.finishedAt, attempt.json.serialized().string,
                    ])
                inserted += db.changesCount
            }
            // Past the retention, and beyond the row bound (the oldest recorded first): a bounded number a batch,
            // so lowering either never makes one transaction delete millions of rows.
            try db.execute(
                sql: "DELETE FROM delivery_attempt WHERE seq IN (SELECT seq FROM delivery_attempt WHERE finished_at < ? ORDER BY finished_at LIMIT ?)",
                arguments: [now - retention, Self.pruneBatch])
            try db.execute(
                sql: """
                    DELETE FROM delivery_attempt WHERE seq IN (
                        SELECT seq FROM delivery_attempt WHERE seq <= (SELECT MAX(seq) FROM delivery_attempt) - ? ORDER BY seq LIMIT ?)
                    """,
                arguments: [maxAttempts, Self.pruneBatch])
            return (inserted, invalid)
        }
    }

    /// Which attempts a query wants; every member narrows (nil: any).
    public struct Filter: Sendable, Equatable {
        public var apps: Set<String>?
        public var app: String?
        public var endpoint: String?
        public var eventId: String?
        /// The events of this app user (through the events store).
        public var appUserId: String?
        public var outcome: DeliveryAttempt.Outcome?
        /// `finishedAt` at or after `since`, before `until` (Unix ms).
        public var since: Int64?
        public var until: Int64?

        public init() {}
    }

    /// A page of attempts, newest first: at most `limit`, before `cursor` (a previous page's `next`).
    public func page(_ filter: Filter, before cursor: Int64?, limit: Int) async throws -> (attempts: [JSON], next: Int64?) {
        var clauses = ["1 = 1"]
        var arguments: StatementArguments = []
        func add(_ clause: String, _ value: some DatabaseValueConvertible) {
            clauses.append(clause)
            arguments += [value]
        }
        if let cursor { add("seq < ?", cursor) }
        if let apps = filter.apps {
            clauses.append(apps.isEmpty ? "0 = 1" : "app IN (\(apps.map { _ in "?" }.joined(separator: ", ")))")
            arguments += StatementArguments(apps.sorted())
        }
        if let app = filter.app { add("app = ?", app) }
        if let endpoint = filter.endpoint { add("endpoint = ?", endpoint) }
        if let eventId = filter.eventId { add("event_id = ?", eventId) }
        if let user = filter.appUserId { add("event_id IN (SELECT id FROM event WHERE app_user_id = ?)", user) }
        if let outcome = filter.outcome { add("outcome = ?", outcome.rawValue) }
        if let since = filter.since { add("finished_at >= ?", since) }
        if let until = filter.until { add("finished_at < ?", until) }
        let sql = "SELECT seq, body FROM delivery_attempt WHERE \(clauses.joined(separator: " AND ")) ORDER BY seq DESC LIMIT ?"
        let arguments2 = arguments + [limit + 1]
        return try await pool.read { db in
            let rows = try Row.fetchAll(db, sql: sql, arguments: arguments2)
            let page = rows.prefix(limit)
            let attempts = page.compactMap { row in try? JSON.parse(Array((row["body"] as String).utf8)) }
            return (attempts, rows.count > limit ? page.last.map { $0["seq"] as Int64 } : nil)
        }
    }
}

extension [UInt8] {
    fileprivate var string: String { String(decoding: self, as: UTF8.self) }
}
