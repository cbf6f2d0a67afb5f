import Dispatch
import Foundation
import GRDB
import RelaySQLite
public import RelayCore

/// Every standardized event the relay produced, in the local backend's events file (beside its database,
/// `SubscriptionDatabase.eventsPath(forBackend:)`): recorded from
/// `relay.events` by `EventRecorder` (or by an import), queried by the events routes and
/// `revenue-relay events`, summed by the revenue route.
///
/// Recording is idempotent on the event id (`data.id`): a replayed or repeated event is the same row.
/// Each row keeps the payload exactly as delivered, beside the columns the filters and sums read.
public final class EventStore: Sendable {
    let pool: DatabasePool
    /// Writes run here, off Swift's cooperative pool: a commit waits for its fsync.
    private let writer = DispatchQueue(label: "backend-events-writer")

    public init(database: SubscriptionDatabase) {
        pool = database.eventsPool
    }

    static func createSchema(_ db: Database) throws {
        try db.execute(
            sql: """
                CREATE TABLE event (
                    seq INTEGER PRIMARY KEY AUTOINCREMENT,
                    id TEXT NOT NULL UNIQUE,
                    app TEXT NOT NULL,
                    project_id INTEGER NOT NULL,
                    application_id INTEGER NOT NULL,
                    type TEXT NOT NULL,
                    store TEXT NOT NULL,
                    environment TEXT NOT NULL,
                    original_transaction_id TEXT NOT NULL,
                    app_user_id TEXT,
                    product_id TEXT,
                    ts INTEGER NOT NULL,
                    received_at INTEGER NOT NULL,
                    currency TEXT,
                    price_usd REAL,
                    proceeds_usd REAL,
                    price_local REAL,
                    historical INTEGER NOT NULL DEFAULT 0,
                    notification_id TEXT,
                    payload TEXT NOT NULL
                );
                CREATE INDEX event_by_app_time ON event (app, ts);
                CREATE INDEX event_by_user ON event (app_user_id, seq);
                CREATE INDEX event_by_subscription ON event (original_transaction_id, seq);
                CREATE INDEX event_by_notification ON event (notification_id, seq);
                """)
    }

    /// The index SQLite keeps for the events' unique ids (the table's first `UNIQUE`), named by the queries
    /// that read a notification's events through it.
    static let idIndex = "sqlite_autoindex_event_1"

    /// Pages filtered by app alone sorted every event of the app for each page without it.
    static func createAppIndex(_ db: Database) throws {
        try db.execute(sql: "CREATE INDEX event_by_app ON event (app, seq)")
    }

    /// Replaces the index by notification, which each event recorded wrote at a random place (its key is the
    /// notification's id), with one of the few events whose id does not say their notification
    /// (`notificationElsewhere`): the others are found through the ids' index (`EventFilter.notificationId`).
    static func narrowNotificationIndex(_ db: Database) throws {
        try db.execute(
            sql: """
                CREATE INDEX IF NOT EXISTS event_by_notification_elsewhere ON event (notification_id, seq) WHERE \(notificationElsewhere);
                DROP INDEX IF EXISTS event_by_notification;
                """)
    }

    /// An event of a notification whose id does not start with its store and the notification's id. A
    /// notification's events are named `apple:<notificationUUID>:renewal`, so this is a Paddle adjustment
    /// (named by the adjustment), a Google full refund (by the order), or a test's. The text of the
    /// partial index's condition: a query reads the index only with these same words in its own. The others
    /// are found by a range of `idIndex` for each `Store` case, so every stored `store` must be one (`row`
    /// refuses any other): a case renamed or removed needs a migration of the rows.
    package static let notificationElsewhere =
        "notification_id IS NOT NULL AND substr(id, 1, length(store) + length(notification_id) + 2) IS NOT store || ':' || notification_id || ':'"

    /// One event to record: its payload's bytes as delivered, the app key it belongs to, and whether
    /// it came from an import of the store's history rather than a live notification.
    public struct Entry: Sendable {
        public var app: String
        public var body: [UInt8]
        public var historical: Bool

        public init(app: String, body: [UInt8], historical: Bool = false) {
            self.app = app
            self.body = body
            self.historical = historical
        }
    }

    /// Why an entry was not recorded: its body is not a standardized event.
    public struct InvalidEvent: Error, Sendable, CustomStringConvertible {
        public var reason: String
        public var description: String { "not a standardized event: \(reason)" }
    }

    /// Records `entries` in one transaction (one fsync) and returns how many were new; an id already
    /// recorded is left as it is. An entry whose body is not a standardized event is skipped and
    /// returned in `invalid` (with its index), never stored half.
    public func record(_ entries: [Entry]) async throws -> (inserted: Int, invalid: [(Int, InvalidEvent)]) {
        try await record(entries, alongside: nil)
    }

    /// - Parameter alongside: more writes for the same transaction (the recorder's delivery log batch).
    func record(
        _ entries: [Entry], alongside: (@Sendable (Database) throws -> Void)?
    ) async throws -> (inserted: Int, invalid: [(Int, InvalidEvent)]) {
        var rows: [EventRow] = []
        var invalid: [(Int, InvalidEvent)] = []
        for (index, entry) in entries.enumerated() {
            do {
                rows.append(try Self.row(entry))
            } catch let error as InvalidEvent {
                invalid.append((index, error))
            }
        }
        guard !rows.isEmpty || alongside != nil else { return (0, invalid) }
        let prepared = rows
        let inserted = try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Int, any Error>) in
            writer.async { [pool] in
                continuation.resume(
                    with: Result {
                        try pool.write { db in
                            // With SQLite's C calls (DirectWrite): every event the relay produces is a row.
                            let insert = DirectWrite(
                                try db.cachedStatement(
                                    sql: """
                                        INSERT OR IGNORE INTO event (id, app, project_id, application_id, type, store, environment,
                                            original_transaction_id, app_user_id, product_id, ts, received_at, currency, price_usd,
                                            proceeds_usd, price_local, historical, notification_id, payload)
                                        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                                        """))
                            var count = 0
                            for row in prepared {
                                try insert.execute(row.bind)
                                count += db.changesCount
                            }
                            try alongside?(db)
                            return count
                        }
                    })
            }
        }
        return (inserted, invalid)
    }

    /// The members `row` reads, at any depth: the rest of the payload (most of it) is checked, not built.
    package static let columnMembers: JSON.MemberNames = [
        "type", "projectId", "applicationId", "timestamp", "data", "id", "source", "store", "notificationId", "environment",
        "originalTransactionId", "appUserId", "originalAppUserId", "productId", "ts", "currencyCode", "price", "proceeds",
        "priceInPurchasedCurrency",
    ]

    /// One event's columns, in the INSERT's order.
    private struct EventRow: Sendable {
        var id: String
        var app: String
        var projectId: Int64
        var applicationId: Int64
        var type: String
        var store: String
        var environment: String
        var originalTransactionId: String
        var appUserId: String?
        var productId: String?
        var ts: Int64
        var receivedAt: Int64
        var currency: String?
        var priceUSD: Double?
        var proceedsUSD: Double?
        var priceLocal: Double?
        var historical: Bool
        var notificationId: String?
        /// The event's JSON as it came (parsed, so UTF-8), kept as text.
        var payload: [UInt8]

        func bind(_ parameters: inout DirectWrite.Parameters) {
            parameters.text(id)
            parameters.text(app)
            parameters.int64(projectId)
            parameters.int64(applicationId)
            parameters.text(type)
            parameters.text(store)
            parameters.text(environment)
            parameters.text(originalTransactionId)
            parameters.text(appUserId)
            parameters.text(productId)
            parameters.int64(ts)
            parameters.int64(receivedAt)
            parameters.text(currency)
            parameters.double(priceUSD)
            parameters.double(proceedsUSD)
            parameters.double(priceLocal)
            parameters.int64(historical ? 1 : 0)
            parameters.text(notificationId)
            parameters.text(utf8: payload)
        }
    }

    /// The row of one event. Read from the event's JSON value, not decoded into `EventPayload`: every
    /// event the relay produces is recorded, and JSONDecoder took 35 µs for the typed event against
    /// 16 µs for JSON.parse of the same 1.1 KB (`revenue-relay-bench codec`), on the path the end-to-end
    /// benchmark showed to matter. The checks are the ones the columns need.
    private static func row(_ entry: Entry) throws -> EventRow {
        guard let payload = try? JSON.parse(entry.body, keepingMembersNamed: columnMembers), case .object = payload else {
            throw InvalidEvent(reason: "not a JSON object")
        }
        guard let typeText = payload["type"]?.stringValue, let type = EventType(rawValue: typeText) else {
            throw InvalidEvent(reason: "type: expected an event type")
        }
        let data = payload["data"] ?? .null
        func text(_ key: String) throws(InvalidEvent) -> String {
            guard let value = data[key]?.stringValue, !value.isEmpty else { throw InvalidEvent(reason: "data.\(key): expected a non-empty string") }
            return value
        }
        func integer(_ value: JSON?, _ name: String) throws(InvalidEvent) -> Int64 {
            guard let number = value?.int64Value else { throw InvalidEvent(reason: "\(name): expected an integer") }
            return number
        }
        guard let storeText = data["source"]?["store"]?.stringValue, let store = Store(rawValue: storeText) else {
            throw InvalidEvent(reason: "data.source.store: expected apple, google, stripe or paddle")
        }
        // A status change names its user `appUserId`; the other events `originalAppUserId`.
        let user = type == .subscriptionStatusDidChange ? data["appUserId"]?.stringValue : data["originalAppUserId"]?.stringValue
        return EventRow(
            id: try text("id"), app: entry.app, projectId: try integer(payload["projectId"], "projectId"),
            applicationId: try integer(payload["applicationId"], "applicationId"), type: type.rawValue, store: store.rawValue,
            environment: try text("environment"), originalTransactionId: try text("originalTransactionId"), appUserId: user,
            productId: data["productId"]?.stringValue, ts: try integer(data["ts"], "data.ts"), receivedAt: try integer(payload["timestamp"], "timestamp"),
            currency: data["currencyCode"]?.stringValue, priceUSD: data["price"]?.doubleValue, proceedsUSD: data["proceeds"]?.doubleValue,
            priceLocal: data["priceInPurchasedCurrency"]?.doubleValue, historical: entry.historical,
            notificationId: data["source"]?["notificationId"]?.stringValue, payload: entry.body)
    }

    // MARK: Reading

    /// The recorded events that match `filter`, after `cursor` (a previous page's `next`), oldest
    /// recorded first: at most `limit` payloads (JSON text as delivered) and the cursor of the next page,
    /// nil when this page reached the end.
    public func page(_ filter: EventFilter, after cursor: Int64?, limit: Int) async throws -> (payloads: [String], next: Int64?) {
        let (sql, arguments) = Self.pageQuery(filter, after: cursor, limit: limit)
        return try await pool.read { db in
            let rows = try Row.fetchAll(db, sql: sql, arguments: arguments)
            let page = rows.prefix(limit)
            let next: Int64? = rows.count > limit ? page.last?["seq"] : nil
            return (page.map { $0["payload"] }, next)
        }
    }

    /// One more row than `limit`, to know whether a next page exists.
    private static func pageQuery(_ filter: EventFilter, after cursor: Int64?, limit: Int) -> (String, StatementArguments) {
        let (clause, arguments) = filter.sql(after: cursor)
        return ("SELECT seq, payload FROM event WHERE \(clause) ORDER BY seq LIMIT ?", arguments + [limit + 1])
    }

    /// SQLite's plan for `page(filter, ...)`, one line a step: a page must walk an index in `seq`
    /// order, not sort what the filter matches (which makes an export quadratic).
    package func pagePlan(_ filter: EventFilter) async throws -> [String] {
        let (sql, arguments) = Self.pageQuery(filter, after: 0, limit: 500)
        return try await pool.read { db in try db.queryPlan(sql, arguments: arguments) }
    }

    /// Revenue in USD from the recorded events that match `filter`, grouped by `groupBy`, summed by SQL.
    public func revenue(_ filter: EventFilter, groupBy: [RevenueGrouping]) async throws -> RevenueReport {
        let (clause, arguments) = filter.sql(after: nil)
        let keys = groupBy.map(\.column)
        let select = (keys + [
            "ROUND(COALESCE(SUM(CASE WHEN price_usd > 0 THEN price_usd END), 0), 2) AS gross",
            "ROUND(COALESCE(SUM(CASE WHEN price_usd < 0 THEN -price_usd END), 0), 2) AS refunds",
            "ROUND(COALESCE(SUM(price_usd), 0), 2) AS net",
            "ROUND(COALESCE(SUM(proceeds_usd), 0), 2) AS proceeds",
            "COUNT(CASE WHEN price_usd > 0 THEN 1 END) AS purchases",
            "COUNT(CASE WHEN price_usd < 0 THEN 1 END) AS refund_count",
        ]).joined(separator: ", ")
        // Events that move no money (a status change, a cancellation without refund) have a null
        // price; a price the relay could not convert (no exchange rate) is null too and counted apart.
        let aliases = groupBy.map(\.alias).joined(separator: ", ")
        let grouping = groupBy.isEmpty ? "" : " GROUP BY \(aliases) ORDER BY \(aliases)"
        let sql = "SELECT \(select) FROM event WHERE \(clause) AND price_usd IS NOT NULL\(grouping)"
        let unconverted = "SELECT COUNT(*) FROM event WHERE \(clause) AND price_usd IS NULL AND price_local IS NOT NULL"
        return try await pool.read { db in
            let rows = try Row.fetchAll(db, sql: sql, arguments: arguments).map { row in
                RevenueReport.Row(
                    group: Dictionary(uniqueKeysWithValues: groupBy.map { ($0.rawValue, row[$0.alias] as String?) }),
                    gross: row["gross"], refunds: row["refunds"], net: row["net"], proceeds: row["proceeds"],
                    purchases: row["purchases"], refundCount: row["refund_count"])
            }
            let missing = try Int.fetchOne(db, sql: unconverted, arguments: arguments) ?? 0
            return RevenueReport(groupBy: groupBy, rows: rows, eventsWithoutRate: missing)
        }
    }

    /// The payload of the event with this id, as delivered; nil when it is not recorded.
    public func payload(id: String) async throws -> String? {
        try await pool.read { db in try String.fetchOne(db, sql: "SELECT payload FROM event WHERE id = ?", arguments: [id]) }
    }

    /// The payloads of the newest `limit` events that match `filter` (by recorded order), newest first.
    public func latest(_ filter: EventFilter, limit: Int) async throws -> [String] {
        let (clause, arguments) = filter.sql(after: nil)
        return try await pool.read { db in
            try String.fetchAll(db, sql: "SELECT payload FROM event WHERE \(clause) ORDER BY seq DESC LIMIT ?", arguments: arguments + [limit])
        }
    }

    /// How many recorded events match `filter`.
    public func count(_ filter: EventFilter = EventFilter()) async throws -> Int {
        let (clause, arguments) = filter.sql(after: nil)
        return try await pool.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM event WHERE \(clause)", arguments: arguments) ?? 0 }
    }
}

/// Which recorded events a query wants; every member narrows (nil: any).
public struct EventFilter: Sendable, Equatable {
    public var app: String?
    /// Only these apps' events (a read key's row security); nil: any app.
    public var apps: [String]?
    public var appUserId: String?
    public var originalTransactionId: String?
    /// Event types (`renewal`, ...): any of them.
    public var types: [EventType] = []
    public var store: Store?
    /// `PRODUCTION` or `SANDBOX`.
    public var environment: String?
    /// The store's event time (`data.ts`), Unix milliseconds: at or after `since`, before `until`.
    public var since: Int64?
    public var until: Int64?
    /// Whether events imported from a store's history are included. Default: yes.
    public var historical: Bool?
    /// Only the events of this store notification (`data.source.notificationId`: Apple's notificationUUID,
    /// `import:<transactionId>` for an import's).
    public var notificationId: String?

    public init(
        app: String? = nil, appUserId: String? = nil, originalTransactionId: String? = nil, types: [EventType] = [], store: Store? = nil,
        environment: String? = nil, since: Int64? = nil, until: Int64? = nil, historical: Bool? = nil, notificationId: String? = nil
    ) {
        self.app = app
        self.appUserId = appUserId
        self.originalTransactionId = originalTransactionId
        self.types = types
        self.store = store
        self.environment = environment
        self.since = since
        self.until = until
        self.historical = historical
        self.notificationId = notificationId
    }

    func sql(after cursor: Int64?) -> (String, StatementArguments) {
        var clauses = ["1 = 1"]
        var arguments: StatementArguments = []
        func add(_ clause: String, _ value: some DatabaseValueConvertible) {
            clauses.append(clause)
            arguments += [value]
        }
        if let cursor { add("seq > ?", cursor) }
        if let app { add("app = ?", app) }
        if let apps {
            clauses.append(apps.isEmpty ? "0 = 1" : "app IN (\(apps.map { _ in "?" }.joined(separator: ", ")))")
            arguments += StatementArguments(apps)
        }
        if let appUserId { add("app_user_id = ?", appUserId) }
        if let originalTransactionId { add("original_transaction_id = ?", originalTransactionId) }
        if !types.isEmpty {
            clauses.append("type IN (\(types.map { _ in "?" }.joined(separator: ", ")))")
            arguments += StatementArguments(types.map(\.rawValue))
        }
        if let store { add("store = ?", store.rawValue) }
        if let environment { add("environment = ?", environment) }
        if let since { add("ts >= ?", since) }
        if let until { add("ts < ?", until) }
        if let historical { add("historical = ?", historical) }
        if let notificationId {
            // A notification's events: the range of the ids' index that starts `<store>:<notification>:`, for
            // each store, and those named otherwise (`EventStore.notificationElsewhere`). The column's
            // comparison keeps a notification whose id starts as this one's and goes on with a colon out.
            add("notification_id = ?", notificationId)
            let ranges = Store.allCases.map { _ in "SELECT seq FROM event INDEXED BY \(EventStore.idIndex) WHERE id >= ? AND id < ?" }
            let elsewhere = "SELECT seq FROM event INDEXED BY event_by_notification_elsewhere WHERE notification_id = ? AND \(EventStore.notificationElsewhere)"
            clauses.append("seq IN (\((ranges + [elsewhere]).joined(separator: " UNION ALL ")))")
            for store in Store.allCases { arguments += ["\(store.rawValue):\(notificationId):", "\(store.rawValue):\(notificationId);"] }
            arguments += [notificationId]
        }
        return (clauses.joined(separator: " AND "), arguments)
    }
}

/// What revenue is grouped by.
public enum RevenueGrouping: String, Sendable, CaseIterable {
    /// The UTC day of the store's event time (`2026-11-24`).
    case day
    case month
    case product
    case store
    /// The currency the customer paid in.
    case currency
    case app

    var alias: String { rawValue }

    var column: String {
        switch self {
        case .day: "strftime('%Y-%m-%d', ts / 1000, 'unixepoch') AS day"
        case .month: "strftime('%Y-%m', ts / 1000, 'unixepoch') AS month"
        case .product: "product_id AS product"
        case .store: "store AS store"
        case .currency: "currency AS currency"
        case .app: "app AS app"
        }
    }
}

/// Revenue in USD: gross (purchases and renewals), refunds, net (gross less refunds), proceeds (what
/// the developer keeps after the store's commission and tax, refunds subtracted), per group.
public struct RevenueReport: Sendable, Equatable {
    public struct Row: Sendable, Equatable {
        /// The group's value per grouping (`day`: `2026-11-24`, `product`: the product id, ...); null when the events lack it.
        public var group: [String: String?]
        public var gross: Double
        public var refunds: Double
        public var net: Double
        public var proceeds: Double
        public var purchases: Int
        public var refundCount: Int
    }

    public var groupBy: [RevenueGrouping]
    public var rows: [Row]
    /// Events that moved money in a currency without an exchange rate: not in the sums.
    public var eventsWithoutRate: Int
}
