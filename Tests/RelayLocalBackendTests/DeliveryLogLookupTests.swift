import Foundation
import GRDB
import RelayCore
import RelayLocalBackend
import RelayTestSupport
import Testing

/// An event's attempts, and a user's, found without an index by event, or by endpoint and event: as ranges of
/// the attempts' ids' index (an id starts `endpoint:event:`), every endpoint recorded enumerated when the filter
/// names none.
@Suite struct DeliveryLogLookupTests {
    @Test func anEventsAndAUsersAttemptsAreFoundAtEveryEndpoint() async throws {
        let path = EventsFile.path("delivery-lookup")
        defer { EventsFile.remove(path) }
        let database = try SubscriptionDatabase(path: path)
        _ = try await EventStore(database: database).record([
            .init(app: "demo", body: testEvent("apple:n1:renewal", user: "user-1")),
            .init(app: "demo", body: testEvent("apple:n2:renewal", user: "user-2")),
            .init(app: "web", body: testEvent("stripe:n3:renewal", store: .stripe, user: "user-1")),
        ])
        let log = DeliveryLog(database: database, clock: { 10_000 })
        // Endpoint names that sort around each other, one with a colon, and one with only other events.
        let attempts: [(String, String, String, Int64)] = [
            ("apple:n1:renewal", "a", "demo", 1_000), ("apple:n2:renewal", "b", "demo", 2_000), ("apple:n1:renewal", "b:c", "demo", 3_000),
            ("stripe:n3:renewal", "zz", "web", 4_000), ("apple:n1:renewal", "zz", "demo", 5_000), ("apple:n2:renewal", "a", "demo", 6_000),
        ]
        _ = try await log.record(attempts.map { event, endpoint, app, at in DeliveryLogTests.attempt(event, endpoint: endpoint, app: app, at: at) })
        // Its id starts as the attempts' of apple:n1:renewal at b:c do ("b:c:apple:n1:renewal:"): the same range
        // of ids, another endpoint and event. (Its first attempt's id would be theirs, and be recorded as theirs.)
        _ = try await log.record([DeliveryLogTests.attempt("c:apple:n1:renewal", attempt: 2, endpoint: "b", at: 7_000)])
        func found(_ configure: (inout DeliveryLog.Filter) -> Void) async throws -> [String] {
            var filter = DeliveryLog.Filter()
            configure(&filter)
            return try await log.page(filter, before: nil, limit: 100).attempts.compactMap {
                "\($0["eventId"]?.stringValue ?? "")@\($0["endpoint"]?.stringValue ?? "")"
            }
        }
        #expect(try await found { $0.eventId = "apple:n1:renewal" } == ["apple:n1:renewal@zz", "apple:n1:renewal@b:c", "apple:n1:renewal@a"])
        #expect(try await found { $0.eventId = "apple:n1:renewal"; $0.endpoint = "b:c" } == ["apple:n1:renewal@b:c"])
        #expect(try await found { $0.eventId = "c:apple:n1:renewal" } == ["c:apple:n1:renewal@b"])
        #expect(try await found { $0.eventId = "apple:n2:renewal"; $0.outcome = .succeeded } == ["apple:n2:renewal@a", "apple:n2:renewal@b"])
        #expect(try await found { $0.appUserId = "user-1" } == [
            "apple:n1:renewal@zz", "stripe:n3:renewal@zz", "apple:n1:renewal@b:c", "apple:n1:renewal@a",
        ])
        #expect(try await found { $0.appUserId = "user-1"; $0.apps = ["web"] } == ["stripe:n3:renewal@zz"])
        #expect(try await found { $0.eventId = "apple:n9:renewal" } == [])
        // Paged: the cursor goes on from the last one.
        var filter = DeliveryLog.Filter()
        filter.eventId = "apple:n1:renewal"
        let first = try await log.page(filter, before: nil, limit: 2)
        #expect(first.attempts.count == 2)
        #expect(try await log.page(filter, before: try #require(first.next), limit: 2).attempts.compactMap { $0["endpoint"]?.stringValue } == ["a"])
        // Every combination, paged two at a time, answers what the plain query answers (no endpoint list,
        // no index named, `NOT INDEXED`: SQLite reads the table itself).
        let reference = try EventsFile.open(path)
        for eventId in [nil, "apple:n1:renewal"] as [String?] {
            for user in [nil, "user-1"] as [String?] {
                for apps in [nil, ["demo"], []] as [Set<String>?] {
                    for endpoint in [nil, "zz"] as [String?] {
                        for (window, outcome) in [(nil, nil), ((2_000 as Int64, 5_500 as Int64), nil), (nil, .succeeded), ((2_000, 5_500), .succeeded)]
                            as [((Int64, Int64)?, DeliveryAttempt.Outcome?)]
                        {
                            var filter = DeliveryLog.Filter()
                            (filter.eventId, filter.appUserId, filter.apps, filter.endpoint) = (eventId, user, apps, endpoint)
                            (filter.since, filter.until) = (window?.0, window?.1)
                            filter.app = apps == ["demo"] ? "demo" : nil
                            filter.outcome = outcome
                            var paged: [String] = []
                            var cursor: Int64?
                            repeat {
                                let page = try await log.page(filter, before: cursor, limit: 2)
                                paged += page.attempts.compactMap { $0["id"]?.stringValue }
                                cursor = page.next
                            } while cursor != nil
                            #expect(paged == (try Self.plainQuery(reference, filter)), "\(filter)")
                        }
                    }
                }
            }
        }
        try reference.close()
        // An empty log has no endpoint to go through.
        let emptyPath = EventsFile.path("delivery-lookup")
        defer { EventsFile.remove(emptyPath) }
        let empty = DeliveryLog(database: try SubscriptionDatabase(path: emptyPath), clock: { 10_000 })
        filter = DeliveryLog.Filter()
        filter.appUserId = "user-1"
        #expect(try await empty.page(filter, before: nil, limit: 10).attempts.isEmpty)
    }

    /// The attempts' ids a filter matches, newest first, as the table answers it read whole.
    static func plainQuery(_ queue: DatabaseQueue, _ filter: DeliveryLog.Filter) throws -> [String] {
        var clauses = ["1 = 1"]
        var arguments: [any DatabaseValueConvertible] = []
        if let apps = filter.apps {
            clauses.append(apps.isEmpty ? "0 = 1" : "app IN (\(apps.map { _ in "?" }.joined(separator: ", ")))")
            arguments += apps.sorted()
        }
        for (clause, value) in [
            ("app = ?", filter.app), ("endpoint = ?", filter.endpoint), ("event_id = ?", filter.eventId),
            ("event_id IN (SELECT id FROM event WHERE app_user_id = ?)", filter.appUserId), ("outcome = ?", filter.outcome?.rawValue),
        ] {
            if let value {
                clauses.append(clause)
                arguments.append(value)
            }
        }
        if let since = filter.since { clauses.append("finished_at >= ?"); arguments.append(since) }
        if let until = filter.until { clauses.append("finished_at < ?"); arguments.append(until) }
        return try queue.read { db in
            try String.fetchAll(
                db, sql: "SELECT id FROM delivery_attempt NOT INDEXED WHERE \(clauses.joined(separator: " AND ")) ORDER BY seq DESC",
                arguments: StatementArguments(arguments))
        }
    }

    /// Each filter reads an index: the attempts by event as ranges of the ids' index, never the whole table in
    /// recorded order (`SCAN d`, which reads every attempt kept for an event seen once).
    @Test(arguments: [
        ["eventId"], ["appUserId"], ["eventId", "apps"], ["appUserId", "apps"], ["eventId", "endpoint"], ["eventId", "outcome"],
        ["appUserId", "since"], ["eventId", "appUserId"], ["eventId", "noApps"], ["appUserId", "app", "until"],
        ["appUserId", "endpoint", "outcome"],
    ])
    func anEventFilterReadsTheIdsIndex(_ members: [String]) async throws {
        let path = EventsFile.path("delivery-lookup")
        defer { EventsFile.remove(path) }
        var filter = DeliveryLog.Filter()
        for member in members {
            switch member {
            case "eventId": filter.eventId = "apple:n1:renewal"
            case "appUserId": filter.appUserId = "user-1"
            case "apps": filter.apps = ["demo", "web"]
            case "endpoint": filter.endpoint = "hooks"
            case "outcome": filter.outcome = .dead
            case "noApps": filter.apps = []
            case "app": filter.app = "demo"
            case "until": filter.until = 9_000
            default: filter.since = 1_000
            }
        }
        let plan = try await DeliveryLog(database: try SubscriptionDatabase(path: path)).pagePlan(filter)
        #expect(plan.contains { $0.hasPrefix("SEARCH d USING INDEX sqlite_autoindex_delivery_attempt_1 (id>? AND id<?)") }, "\(plan)")
        #expect(!plan.contains { $0.hasPrefix("SCAN d") || $0.hasPrefix("SCAN v") || $0.hasPrefix("SCAN event") }, "\(plan)")
    }

    /// An endpoint's backlog and a recover's claim read each failed event's attempts at that endpoint alone,
    /// though another endpoint's attempts share the range of ids they read ("a:b:x:" is both event "b:x" at "a"
    /// and event "x" at "a:b").
    @Test func theBacklogAndARecoverTellEndpointsWithColonsApart() async throws {
        let path = EventsFile.path("delivery-lookup")
        defer { EventsFile.remove(path) }
        let log = DeliveryLog(database: try SubscriptionDatabase(path: path), clock: { 10_000 })
        func attempt(_ event: String, _ endpoint: String, _ outcome: DeliveryAttempt.Outcome, at: Int64) -> [UInt8] {
            DeliveryLogTests.attempt(event, outcome: outcome, endpoint: endpoint, at: at)
        }
        _ = try await log.record([
            attempt("b:x", "a", .dead, at: 1_000), attempt("x", "a:b", .succeeded, at: 2_000),
            attempt("y", "a", .retrying, at: 3_000), attempt("y", "a", .succeeded, at: 4_000),
            attempt("z", "a:b", .retrying, at: 5_000), attempt("b:z", "a", .succeeded, at: 6_000),
        ])
        let health = try await log.health(endpoint: "a", now: 10_000)
        #expect((health.dead, health.retrying, health.throttled) == (1, 0, 0))
        let other = try await log.health(endpoint: "a:b", now: 10_000)
        #expect((other.dead, other.retrying, other.throttled) == (0, 1, 0))
        let claim = try await log.claimFailures(endpoint: "a", since: 0, until: 10_000, limit: 10, now: 10_000)
        #expect(claim.claimed.map(\.attempt.eventId) == ["b:x"])
        let claimed = try await log.claimFailures(endpoint: "a:b", since: 0, until: 10_000, limit: 10, now: 10_000)
        #expect(claimed.claimed.map(\.attempt.eventId) == ["z"])
    }

    /// Names with a semicolon (the byte after the colon, which ends each range) or beyond ASCII are found as
    /// exactly as the others: each endpoint's attempts of each event, its backlog.
    @Test func namesWithSemicolonsOrBeyondASCIIAreFoundExactly() async throws {
        let path = EventsFile.path("delivery-lookup")
        defer { EventsFile.remove(path) }
        let log = DeliveryLog(database: try SubscriptionDatabase(path: path), clock: { 10_000 })
        let endpoints = ["a", "a;", "a;b", "é", "éa", "a:"]
        let events = ["x", "x;", "x;y", "ü", "x:"]
        var bodies: [[UInt8]] = []
        var at: Int64 = 1_000
        for endpoint in endpoints {
            for event in events {
                at += 1
                bodies.append(DeliveryLogTests.attempt(event, outcome: .dead, endpoint: endpoint, at: at))
            }
        }
        _ = try await log.record(bodies)
        for endpoint in endpoints {
            for event in events {
                var filter = DeliveryLog.Filter()
                (filter.endpoint, filter.eventId) = (endpoint, event)
                let found = try await log.page(filter, before: nil, limit: 10).attempts
                #expect(found.compactMap { "\($0["endpoint"]?.stringValue ?? "")|\($0["eventId"]?.stringValue ?? "")" } == ["\(endpoint)|\(event)"])
            }
            #expect(try await log.health(endpoint: endpoint, now: 10_000).dead == events.count, "\(endpoint)")
        }
        for event in events {
            var filter = DeliveryLog.Filter()
            filter.eventId = event
            #expect(try await log.page(filter, before: nil, limit: 10).attempts.count == endpoints.count, "\(event)")
        }
    }

    /// The backlog and a recover's claim read an event's attempts as ranges of the ids' index, and the
    /// endpoint's attempts by an index, never the table in recorded order.
    @Test func theBacklogAndARecoverReadIndexes() async throws {
        let path = EventsFile.path("delivery-lookup")
        defer { EventsFile.remove(path) }
        let plans = try await DeliveryLog(database: try SubscriptionDatabase(path: path)).healthPlans()
        #expect(
            plans.backlog.contains { $0.hasPrefix("SEARCH delivery_attempt USING COVERING INDEX delivery_attempt_by_endpoint_outcome_event (endpoint=? AND outcome=?)") },
            "\(plans.backlog)")
        for (plan, aliases) in [(plans.backlog, ["s"]), (plans.claim, ["x", "s", "m"])] {
            for alias in aliases {
                #expect(plan.contains { $0.hasPrefix("SEARCH \(alias) USING INDEX sqlite_autoindex_delivery_attempt_1 (id>? AND id<?)") }, "\(plan)")
            }
            #expect(!plan.contains { $0.hasPrefix("SCAN") && !$0.hasPrefix("SCAN f") }, "\(plan)")
        }
    }

    /// A file from before (with the index by event, or by endpoint and event, and by endpoint and outcome
    /// without the event) gets the indexes of now when opened, the attempts it holds found as before; a new one
    /// never has the old ones.
    @Test(arguments: [["e2", "e3", "e5"], ["e3", "e5"], ["e5"]])
    func theIndexesByEventAreDroppedFromAFileThatHasThem(_ unapplied: [String]) async throws {
        let path = EventsFile.path("delivery-lookup")
        defer { EventsFile.remove(path) }
        let dropped: Set = ["delivery_attempt_by_event", "delivery_attempt_by_endpoint_event", "delivery_attempt_by_endpoint_outcome"]
        do {
            let log = DeliveryLog(database: try SubscriptionDatabase(path: path), clock: { 10_000 })
            _ = try await log.record([DeliveryLogTests.attempt("apple:n1:renewal", at: 1_000)])
        }
        #expect(try EventsFile.indexes(path, of: "delivery_attempt").isDisjoint(with: dropped))
        let now: Set = ["sqlite_autoindex_delivery_attempt_1", "delivery_attempt_by_endpoint_outcome_event"]
        #expect(try EventsFile.indexes(path, of: "delivery_attempt").isSuperset(of: now))
        // As the previous version left it: the indexes it had, and no record of the migrations that change them.
        let queue = try EventsFile.open(path)
        try await queue.write { db in
            if unapplied.contains("e2") { try db.execute(sql: "CREATE INDEX delivery_attempt_by_event ON delivery_attempt (event_id, seq)") }
            if unapplied.contains("e3") {
                try db.execute(sql: "CREATE INDEX delivery_attempt_by_endpoint_event ON delivery_attempt (endpoint, event_id, seq, outcome)")
            }
            try db.execute(sql: "DROP INDEX delivery_attempt_by_endpoint_outcome_event")
            try db.execute(sql: "CREATE INDEX delivery_attempt_by_endpoint_outcome ON delivery_attempt (endpoint, outcome, seq)")
            for migration in unapplied { try db.execute(sql: "DELETE FROM grdb_migrations WHERE identifier LIKE ?", arguments: ["\(migration):%"]) }
        }
        try queue.close()
        #expect(try EventsFile.indexes(path, of: "delivery_attempt").contains("delivery_attempt_by_endpoint_outcome"))
        let database = try SubscriptionDatabase(path: path)
        #expect(try EventsFile.indexes(path, of: "delivery_attempt").isDisjoint(with: dropped))
        #expect(try EventsFile.indexes(path, of: "delivery_attempt").isSuperset(of: now))
        let log = DeliveryLog(database: database, clock: { 10_000 })
        _ = try await log.record([DeliveryLogTests.attempt("apple:n1:renewal", endpoint: "other", at: 2_000)])
        var filter = DeliveryLog.Filter()
        filter.eventId = "apple:n1:renewal"
        #expect(try await log.page(filter, before: nil, limit: 10).attempts.compactMap { $0["endpoint"]?.stringValue } == ["other", "hooks"])
        _ = try await log.record([DeliveryLogTests.attempt("apple:n1:renewal", attempt: 2, outcome: .dead, endpoint: "other", at: 3_000)])
        #expect(try await log.health(endpoint: "other", now: 10_000).dead == 1)
    }
}
