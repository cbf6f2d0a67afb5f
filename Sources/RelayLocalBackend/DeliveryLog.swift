public import CoreMetrics
import Dispatch
import Foundation
import GRDB
import RelaySQLite
public import RelayCore

/// The delivery log: every webhook attempt the deliverer made (`DeliveryAttempt`), recorded from the
/// delivery log's topic by `EventRecorder`, or handed over by a deliverer in this process
/// (`InProcessDeliveryLog`), queried by `GET /subscriptions-api/internal/v1/deliveries`.
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
        pool = database.eventsPool
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
                -- Dropped again by the events file's migration e2 (dropEventIndex); released migrations stay as they were.
                CREATE INDEX delivery_attempt_by_event ON delivery_attempt (event_id, seq);
                CREATE INDEX delivery_attempt_by_endpoint ON delivery_attempt (endpoint, seq);
                CREATE INDEX delivery_attempt_by_app ON delivery_attempt (app, seq);
                CREATE INDEX delivery_attempt_by_outcome ON delivery_attempt (outcome, seq);
                """)
    }

    /// What the endpoints route reads: each attempt's duration as a column, indexes by endpoint and time and by
    /// endpoint and event, the deliverers' latest report of each endpoint, and the ledger of resends.
    static func createHealthSchema(_ db: Database) throws {
        try db.execute(
            sql: """
                ALTER TABLE delivery_attempt ADD COLUMN duration_ms INTEGER;
                UPDATE delivery_attempt SET duration_ms = json_extract(body, '$.durationMs');
                CREATE INDEX delivery_attempt_by_endpoint_time ON delivery_attempt (endpoint, finished_at);
                -- Dropped again by the events file's migration e3 (dropEndpointEventIndex).
                CREATE INDEX delivery_attempt_by_endpoint_event ON delivery_attempt (endpoint, event_id, seq, outcome);
                -- Replaced by the events file's migration e5 (coverEndpointOutcomeIndex).
                CREATE INDEX delivery_attempt_by_endpoint_outcome ON delivery_attempt (endpoint, outcome, seq);
                CREATE TABLE endpoint_status (
                    endpoint TEXT PRIMARY KEY,
                    at INTEGER NOT NULL,
                    body TEXT NOT NULL
                );
                -- Each failed attempt re-sent (by resend or recover), so a recover re-sends a failure once.
                CREATE TABLE delivery_resend (
                    failure_id TEXT NOT NULL,
                    requested_at INTEGER NOT NULL,
                    replayed_from TEXT NOT NULL
                );
                CREATE INDEX delivery_resend_by_failure ON delivery_resend (failure_id);
                CREATE INDEX delivery_resend_by_time ON delivery_resend (requested_at);
                CREATE INDEX delivery_resend_by_mark ON delivery_resend (replayed_from);
                """)
    }

    /// Drops the index of attempts by event alone: each attempt recorded changed a page of it at a random place
    /// (its key is the event's id), about 3% of the relay's CPU at saturation (docs/benchmarks.md). An event's
    /// attempts were then found by endpoint and event, the endpoints enumerated when a query names none.
    static func dropEventIndex(_ db: Database) throws {
        try db.execute(sql: "DROP INDEX IF EXISTS delivery_attempt_by_event")
    }

    /// Drops the index of attempts by endpoint and event, the other one recording changed at a random place:
    /// the ids' index serves what it did (`eventAttempts`), the attempts' ids being unique anyway.
    static func dropEndpointEventIndex(_ db: Database) throws {
        try db.execute(sql: "DROP INDEX IF EXISTS delivery_attempt_by_endpoint_event")
    }

    /// Replaces the index by endpoint, outcome and row with one that also holds the event (after the row, so that
    /// it is still written in order): the health's backlog reads an endpoint's failed attempts and their events
    /// from it alone (`backlogQuery`), not from each attempt's row.
    static func coverEndpointOutcomeIndex(_ db: Database) throws {
        try db.execute(
            sql: """
                CREATE INDEX IF NOT EXISTS \(endpointOutcomeIndex) ON delivery_attempt (endpoint, outcome, seq, event_id);
                DROP INDEX IF EXISTS delivery_attempt_by_endpoint_outcome;
                """)
    }

    /// The index by endpoint, outcome, row and event, named by the backlog's query.
    static let endpointOutcomeIndex = "delivery_attempt_by_endpoint_outcome_event"

    /// The index SQLite keeps for the attempts' unique ids (the table's first `UNIQUE`), named by the queries
    /// that read an event's attempts through it.
    static let idIndex = "sqlite_autoindex_delivery_attempt_1"

    /// An endpoint's or an event's name in `eventAttempts`: an SQL expression (`?1`, `f.event_id`), or a value
    /// to bind.
    enum Operand {
        case sql(String)
        case value(String)
    }

    /// The condition that `alias`'s row is an attempt of `endpoint` for `event`, and the values it binds in the
    /// order of its `?`, written so that SQLite reads it as a range of the ids' index: an attempt's id starts
    /// with `endpoint:event:` (`DeliveryAttempt.id`), and every id from that prefix up to the next one after
    /// `:` (`;`, in SQLite's byte order) starts with it. A name holding a colon can put another endpoint's or
    /// event's attempts in the range, so the columns are compared too. The table must be read `INDEXED BY`
    /// `idIndex`: by its own estimates SQLite would rather read the endpoint's every attempt.
    static func eventAttempts(_ alias: String, endpoint: Operand, event: Operand) -> (condition: String, arguments: StatementArguments) {
        var arguments: StatementArguments = []
        func operand(_ operand: Operand) -> String {
            switch operand {
            case .sql(let expression): return expression
            case .value(let value):
                arguments += [value]
                return "?"
            }
        }
        let from = "\(alias).id >= \(operand(endpoint)) || ':' || \(operand(event)) || ':'"
        let upTo = "\(alias).id < \(operand(endpoint)) || ':' || \(operand(event)) || ';'"
        let columns = "\(alias).endpoint = \(operand(endpoint)) AND \(alias).event_id = \(operand(event))"
        return ("\(from) AND \(upTo) AND \(columns)", arguments)
    }

    /// `eventAttempts` of two SQL expressions, which bind nothing.
    static func eventAttempts(_ alias: String, endpoint: String, event: String) -> String {
        eventAttempts(alias, endpoint: .sql(endpoint), event: .sql(event)).condition
    }

    /// Records `attempts` (a repeat of one is the same row), then removes what is past the retention or the
    /// row bound. Returns how many were new and which entries were not attempts.
    public func record(_ bodies: [[UInt8]]) async throws -> (inserted: Int, invalid: [Int]) {
        try await pool.write { db in try self.record(bodies, in: db) }
    }

    /// `record(_:)` inside a transaction the caller holds (the recorder writes a batch's events and attempts
    /// in one commit): the topic's bodies, parsed, each attempt stored with its body as it came.
    func record(_ bodies: [[UInt8]], in db: Database) throws -> (inserted: Int, invalid: [Int]) {
        var rows: [Written] = []
        var invalid: [Int] = []
        for (index, body) in bodies.enumerated() {
            guard let json = try? JSON.parse(body) else {
                invalid.append(index)
                continue
            }
            if let status = EndpointStatus(json: json) {
                rows.append(.status(status))
            } else if let attempt = DeliveryAttempt(json: json) {
                rows.append(.attempt(attempt, body: body))
            } else {
                invalid.append(index)
            }
        }
        return (try insert(rows, in: db), invalid)
    }

    /// Records a deliverer's entries handed over in this process (`InProcessDeliveryLog`), in one transaction;
    /// returns how many attempts were new.
    public func record(_ entries: [DeliveryLogEntry]) async throws -> Int {
        try await pool.write { db in
            try self.insert(
                entries.map { entry in
                    switch entry {
                    case .attempt(let attempt): .attempt(attempt, body: attempt.serialized())
                    case .status(let status): .status(status)
                    }
                }, in: db)
        }
    }

    /// A row to write: an attempt with the body it is stored and answered with, or an endpoint's state.
    private enum Written {
        case attempt(DeliveryAttempt, body: [UInt8])
        case status(EndpointStatus)
    }

    /// Writes `rows`, then removes what is past the retention or the row bound; returns how many attempts were
    /// new. Statements are cached: this runs for every delivery.
    private func insert(_ rows: [Written], in db: Database) throws -> Int {
        let now = clock()
        var inserted = 0
        // With SQLite's C calls (DirectWrite): one row per webhook sent.
        let insert = DirectWrite(
            try db.cachedStatement(
                sql: """
                    INSERT OR IGNORE INTO delivery_attempt (id, app, endpoint, event_id, event_type, subject, attempt, outcome, http_status, finished_at, body, duration_ms)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """))
        for row in rows {
            switch row {
            case .status(let status):
                // The latest report wins (a deliverer's restart reports every endpoint anew).
                try db.cachedStatement(
                    sql: """
                        INSERT INTO endpoint_status (endpoint, at, body) VALUES (?, ?, ?)
                        ON CONFLICT (endpoint) DO UPDATE SET at = excluded.at, body = excluded.body WHERE excluded.at >= endpoint_status.at
                        """
                ).execute(arguments: [status.endpoint, status.at, status.json.serialized().string])
            case .attempt(let attempt, let body):
                try insert.execute { parameters in
                    parameters.text(attempt.id)
                    parameters.text(attempt.app)
                    parameters.text(attempt.endpoint)
                    parameters.text(attempt.eventId)
                    parameters.text(attempt.eventType)
                    parameters.text(attempt.subject)
                    parameters.int64(Int64(attempt.attempt))
                    parameters.text(attempt.outcome.rawValue)
                    parameters.int64(attempt.httpStatus.map(Int64.init))
                    parameters.int64(attempt.finishedAt)
                    // Parsed from it or serialized to it, so it is UTF-8.
                    parameters.text(utf8: body)
                    parameters.int64(attempt.durationMs)
                }
                inserted += db.changesCount
            }
        }
        // Past the retention, and beyond the row bound (the oldest recorded first): a bounded number a batch,
        // so lowering either never makes one transaction delete millions of rows.
        try db.cachedStatement(
            sql: "DELETE FROM delivery_attempt WHERE seq IN (SELECT seq FROM delivery_attempt WHERE finished_at < ? ORDER BY finished_at LIMIT ?)"
        ).execute(arguments: [now - retention, Self.pruneBatch])
        try db.cachedStatement(
            sql: """
                DELETE FROM delivery_attempt WHERE seq IN (
                    SELECT seq FROM delivery_attempt WHERE seq <= (SELECT MAX(seq) FROM delivery_attempt) - ? ORDER BY seq LIMIT ?)
                """
        ).execute(arguments: [maxAttempts, Self.pruneBatch])
        try db.cachedStatement(
            sql: "DELETE FROM delivery_resend WHERE rowid IN (SELECT rowid FROM delivery_resend WHERE requested_at < ? ORDER BY requested_at LIMIT ?)"
        ).execute(arguments: [now - retention, Self.pruneBatch])
        return inserted
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
        let (sql, arguments) = Self.pageQuery(filter, before: cursor, limit: limit)
        return try await pool.read { db in
            let rows = try Row.fetchAll(db, sql: sql, arguments: arguments)
            let page = rows.prefix(limit)
            let attempts = page.compactMap { row in try? JSON.parse(Array((row["body"] as String).utf8)) }
            return (attempts, rows.count > limit ? page.last.map { $0["seq"] as Int64 } : nil)
        }
    }

    /// SQLite's plan for `page(filter, ...)`, one line a step (the tests hold each filter to an index).
    package func pagePlan(_ filter: Filter) async throws -> [String] {
        let (sql, arguments) = Self.pageQuery(filter, before: nil, limit: 50)
        return try await pool.read { db in try db.queryPlan(sql, arguments: arguments) }
    }

    /// The statement of one page and its arguments: the filter's clauses, newest first, one more row than
    /// `limit` (to know whether a next page exists). An event's attempts, or a user's events', are read as
    /// ranges of the ids' index (`eventAttempts`), one for each endpoint recorded when the filter names none
    /// and for each of the user's events: they are a few rows a range, so those ranges are what to read
    /// whatever else the filter says (SQLite, which knows nothing of the rows' spread, would read the app's or
    /// the outcome's every attempt in recorded order instead). `CROSS JOIN` keeps that order of reading.
    private static func pageQuery(_ filter: Filter, before cursor: Int64?, limit: Int) -> (String, StatementArguments) {
        var clauses = ["1 = 1"]
        var arguments: StatementArguments = []
        func add(_ clause: String, _ value: some DatabaseValueConvertible) {
            clauses.append(clause)
            arguments += [value]
        }
        var prefix = ""
        var from = "delivery_attempt d"
        if filter.eventId != nil || filter.appUserId != nil {
            var sources: [String] = []
            let endpoint: Operand
            if let name = filter.endpoint {
                endpoint = .value(name)
            } else {
                prefix = recordedEndpoints + " "
                sources.append("endpoints")
                clauses.append("endpoints.name IS NOT NULL")
                endpoint = .sql("endpoints.name")
            }
            let event: Operand
            if let eventId = filter.eventId {
                event = .value(eventId)
            } else {
                sources.append("event v INDEXED BY event_by_user")
                event = .sql("v.id")
            }
            sources.append("delivery_attempt d INDEXED BY \(idIndex)")
            from = sources.joined(separator: " CROSS JOIN ")
            let range = eventAttempts("d", endpoint: endpoint, event: event)
            clauses.append(range.condition)
            arguments += range.arguments
            if filter.eventId == nil, let user = filter.appUserId { add("v.app_user_id = ?", user) }
        }
        if let cursor { add("d.seq < ?", cursor) }
        if let apps = filter.apps {
            clauses.append(apps.isEmpty ? "0 = 1" : "d.app IN (\(apps.map { _ in "?" }.joined(separator: ", ")))")
            arguments += StatementArguments(apps.sorted())
        }
        if let app = filter.app { add("d.app = ?", app) }
        // A named endpoint and event are the range's own (above), when it is read.
        if let endpoint = filter.endpoint, filter.eventId == nil, filter.appUserId == nil { add("d.endpoint = ?", endpoint) }
        if let user = filter.appUserId, filter.eventId != nil { add("d.event_id IN (SELECT id FROM event WHERE app_user_id = ?)", user) }
        if let outcome = filter.outcome { add("d.outcome = ?", outcome.rawValue) }
        if let since = filter.since { add("d.finished_at >= ?", since) }
        if let until = filter.until { add("d.finished_at < ?", until) }
        let sql = prefix + "SELECT d.seq, d.body FROM \(from) WHERE \(clauses.joined(separator: " AND ")) ORDER BY d.seq DESC LIMIT ?"
        return (sql, arguments + [limit + 1])
    }

    /// Every endpoint with an attempt kept, in name order, found one index seek each (not by reading the
    /// attempts): the next name after the last, until there is none (the last row is NULL).
    private static let recordedEndpoints = """
        WITH RECURSIVE endpoints(name) AS (
            SELECT (SELECT MIN(endpoint) FROM delivery_attempt)
            UNION ALL
            SELECT (SELECT MIN(endpoint) FROM delivery_attempt WHERE endpoint > endpoints.name) FROM endpoints WHERE endpoints.name IS NOT NULL)
        """
}

extension [UInt8] {
    fileprivate var string: String { String(decoding: self, as: UTF8.self) }
}

/// The delivery log as a deliverer in the backend's process writes it (`DeliveryLogRecorder`): each batch of
/// attempts and endpoint states in one transaction, counted as `EventRecorder` counts those it reads from
/// the topic.
public struct InProcessDeliveryLog: DeliveryLogRecorder {
    private let log: DeliveryLog
    private let recorded: Counter

    public init(log: DeliveryLog, metrics: any MetricsFactory) {
        self.log = log
        recorded = Counter(label: "relay_delivery_log_recorded_total", dimensions: [], factory: metrics)
    }

    public func recordFromDeliverer(_ entries: [DeliveryLogEntry]) async throws(DeliveryLogWriteError) {
        let inserted: Int
        do {
            inserted = try await log.record(entries)
        } catch let error as DatabaseError {
            // Busy, locked, out of space or failing I/O may pass; anything else (read-only, corrupt) will not.
            let passing: [ResultCode] = [.SQLITE_BUSY, .SQLITE_LOCKED, .SQLITE_FULL, .SQLITE_IOERR, .SQLITE_NOMEM, .SQLITE_PROTOCOL, .SQLITE_INTERRUPT]
            throw DeliveryLogWriteError(reason: "\(error)", isRetriable: passing.contains(error.resultCode.primaryResultCode))
        } catch {
            throw DeliveryLogWriteError(reason: "\(error)", isRetriable: true)
        }
        recorded.increment(by: inserted)
    }
}
