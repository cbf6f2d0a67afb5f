import Foundation
import GRDB
import RelayCore
import RelayLocalBackend
import RelayTestSupport
import Testing

/// A notification's events found without an index by notification: through the ids' index, which holds them
/// together (`apple:<notificationUUID>:renewal`), and a partial index of the events named otherwise.
@Suite struct EventNotificationLookupTests {
    /// Events as the worker names them, and the ones it names otherwise, one notification's id the start of
    /// another's.
    static let recorded: [EventStore.Entry] = [
        .init(app: "demo", body: testEvent("apple:n1:renewal", notification: "n1")),
        .init(app: "demo", body: testEvent("apple:n1:subscription_status_did_change", type: .subscriptionStatusDidChange, notification: "n1")),
        // In the range of n1's ids ("apple:n1:"), of another notification.
        .init(app: "demo", body: testEvent("apple:n1:x:renewal", notification: "n1:x")),
        .init(app: "web", body: testEvent("paddle:ntf_1:0:renewal", store: .paddle, notification: "ntf_1")),
        // A Paddle adjustment is named by the adjustment, a Google full refund by the order.
        .init(app: "web", body: testEvent("paddle:adj_1:cancellation", type: .cancellation, store: .paddle, notification: "ntf_1")),
        .init(app: "demo", body: testEvent("google:voided:GPA.1:cancellation", type: .cancellation, store: .google, notification: "g-1")),
        // A notification's id under another store's name.
        .init(app: "demo", body: testEvent("stripe:g-1:renewal", store: .apple, notification: "g-1")),
        .init(app: "demo", body: testEvent("apple:n2:renewal", notification: .some(nil))),
        .init(app: "demo", body: testEvent("apple:n3:renewal", notification: "n3"), historical: true),
        // A semicolon (the byte after the colon, which ends each range) and a name beyond ASCII.
        .init(app: "demo", body: testEvent("apple:n1;:renewal", notification: "n1;")),
        .init(app: "web", body: testEvent("stripe:né:renewal", store: .stripe, notification: "né")),
    ]

    static let notifications = ["n1", "n1:x", "ntf_1", "g-1", "n2", "n3", "n9", "apple", "n1;", "né", "n"]

    /// The events' ids a filter matches, in recorded order, as the table answers it read whole.
    static func plainQuery(_ queue: DatabaseQueue, _ notification: String, app: String?) throws -> [String] {
        try queue.read { db in
            try String.fetchAll(
                db, sql: "SELECT id FROM event NOT INDEXED WHERE notification_id = ? AND (? IS NULL OR app = ?) ORDER BY seq",
                arguments: [notification, app, app])
        }
    }

    /// Each notification's events, alone or with an app, paged one at a time, counted and summed, are the
    /// table's.
    static func expectAnswersAsTheTable(_ store: EventStore, _ path: String) async throws {
        let reference = try EventsFile.open(path)
        defer { try? reference.close() }
        for notification in notifications {
            for app in [nil, "web"] as [String?] {
                let filter = EventFilter(app: app, notificationId: notification)
                var paged: [String] = []
                var cursor: Int64?
                repeat {
                    let page = try await store.page(filter, after: cursor, limit: 1)
                    paged += page.payloads.compactMap { try? JSON.parse(Array($0.utf8))["data"]?["id"]?.stringValue }
                    cursor = page.next
                } while cursor != nil
                let expected = try Self.plainQuery(reference, notification, app: app)
                #expect(paged == expected, "\(notification) \(app ?? "-")")
                #expect(try await store.count(filter) == expected.count, "\(notification) \(app ?? "-")")
            }
        }
    }

    @Test func aNotificationsEventsAreFoundHoweverTheyAreNamed() async throws {
        let path = EventsFile.path("event-notification")
        defer { EventsFile.remove(path) }
        let store = EventStore(database: try SubscriptionDatabase(path: path))
        _ = try await store.record(Self.recorded)
        func ids(_ notification: String) async throws -> [String] {
            try await store.page(EventFilter(notificationId: notification), after: nil, limit: 100).payloads.compactMap {
                try? JSON.parse(Array($0.utf8))["data"]?["id"]?.stringValue
            }
        }
        #expect(try await ids("n1") == ["apple:n1:renewal", "apple:n1:subscription_status_did_change"])
        #expect(try await ids("n1:x") == ["apple:n1:x:renewal"])
        #expect(try await ids("ntf_1") == ["paddle:ntf_1:0:renewal", "paddle:adj_1:cancellation"])
        #expect(try await ids("g-1") == ["google:voided:GPA.1:cancellation", "stripe:g-1:renewal"])
        #expect(try await ids("n2") == [])
        #expect(try await ids("n3") == ["apple:n3:renewal"])
        #expect(try await ids("n1;") == ["apple:n1;:renewal"])
        #expect(try await ids("né") == ["stripe:né:renewal"])
        try await Self.expectAnswersAsTheTable(store, path)
        // Only the events named otherwise are in the partial index.
        let queue = try EventsFile.open(path)
        let named = try await queue.read { db in
            try String.fetchAll(db, sql: "SELECT id FROM event INDEXED BY event_by_notification_elsewhere WHERE \(EventStore.notificationElsewhere) ORDER BY seq")
        }
        try queue.close()
        #expect(named == ["paddle:adj_1:cancellation", "google:voided:GPA.1:cancellation", "stripe:g-1:renewal"])
    }

    /// A notification's page reads the ids' index and the partial one, in recorded order (no sort), never the
    /// table.
    @Test(arguments: [
        EventFilter(notificationId: "n1"), EventFilter(app: "demo", notificationId: "n1"), EventFilter(appUserId: "user-1", notificationId: "n1"),
        EventFilter(types: [.renewal], store: .apple, since: 1, notificationId: "n1"),
    ])
    func aNotificationsPageReadsTheIdsIndex(_ filter: EventFilter) async throws {
        let path = EventsFile.path("event-notification")
        defer { EventsFile.remove(path) }
        let plan = try await EventStore(database: try SubscriptionDatabase(path: path)).pagePlan(filter)
        #expect(plan.filter { $0.hasPrefix("SEARCH event USING COVERING INDEX sqlite_autoindex_event_1 (id>? AND id<?)") }.count == Store.allCases.count, "\(plan)")
        #expect(plan.contains { $0.hasPrefix("SEARCH event USING INDEX event_by_notification_elsewhere (notification_id=?)") }, "\(plan)")
        #expect(!plan.contains { $0.hasPrefix("SCAN") || $0.contains("TEMP B-TREE") }, "\(plan)")
    }

    /// A file from before, with the index by notification and events named otherwise already recorded, gets
    /// the partial index built from them and loses the other.
    @Test func aFileFromBeforeGetsThePartialIndex() async throws {
        let path = EventsFile.path("event-notification")
        defer { EventsFile.remove(path) }
        do {
            _ = try SubscriptionDatabase(path: path)
        }
        // As the previous version left it: the index by notification, and no record of the migration.
        let queue = try EventsFile.open(path)
        try await queue.write { db in
            try db.execute(sql: "DROP INDEX event_by_notification_elsewhere")
            try db.execute(sql: "CREATE INDEX event_by_notification ON event (notification_id, seq)")
            try db.execute(sql: "DELETE FROM grdb_migrations WHERE identifier LIKE 'e4:%'")
        }
        try queue.close()
        do {
            // Recorded by the previous version: what it writes, with the index it had.
            let older = try EventsFile.open(path)
            try await older.write { db in
                for entry in Self.recorded {
                    let data = try #require(try JSON.parse(entry.body)["data"])
                    try db.execute(
                        sql: """
                            INSERT INTO event (id, app, project_id, application_id, type, store, environment, original_transaction_id, ts, received_at,
                                notification_id, payload) VALUES (?, ?, 1, 7, 'renewal', ?, 'PRODUCTION', '1000', 0, 0, ?, ?)
                            """,
                        arguments: [
                            data["id"]?.stringValue, entry.app, data["source"]?["store"]?.stringValue, data["source"]?["notificationId"]?.stringValue,
                            String(decoding: entry.body, as: UTF8.self),
                        ])
                }
            }
            try older.close()
        }
        #expect(try EventsFile.indexes(path, of: "event").contains("event_by_notification"))
        let store = EventStore(database: try SubscriptionDatabase(path: path))
        #expect(try !EventsFile.indexes(path, of: "event").contains("event_by_notification"))
        #expect(try EventsFile.indexes(path, of: "event").contains("event_by_notification_elsewhere"))
        try await Self.expectAnswersAsTheTable(store, path)
    }
}
