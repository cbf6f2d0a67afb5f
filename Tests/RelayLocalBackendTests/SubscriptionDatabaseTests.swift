import Foundation
import GRDB
import RelayConfig
import RelayCore
@testable import RelayLocalBackend
import RelayTestSupport
import Testing

@Suite struct SubscriptionDatabaseTests {
    /// A backend database as the relay made it before the events store had a file of its own (the migrations
    /// up to v9), holding two events (the counter at 7: events 3–7 were recorded and later removed), three
    /// attempts (numbered 1, 5 and 9), an endpoint's status and a resend mark.
    private func databaseBeforeTheSplit() throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("backend-before") + "/backend.sqlite").path
        try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        let pool = try DatabasePool(path: path)
        try SubscriptionDatabase.migrator.migrate(pool, upTo: SubscriptionDatabase.lastMigrationWithEvents)
        try pool.write { db in
            for (seq, id) in [(1, "apple:n1:renewal"), (2, "apple:n2:renewal")] {
                try db.execute(
                    sql: """
                        INSERT INTO event (seq, id, app, project_id, application_id, type, store, environment, original_transaction_id,
                            app_user_id, product_id, ts, received_at, historical, notification_id, payload)
                        VALUES (?, ?, 'demo', 1, 7, 'renewal', 'apple', 'PRODUCTION', '1000', 'user-1', 'p', 1767225600000, 1767225600005, 0, ?, ?)
                        """, arguments: [seq, id, id, String(decoding: testEvent(id), as: UTF8.self)])
            }
            try db.execute(sql: "UPDATE sqlite_sequence SET seq = 7 WHERE name = 'event'")
            // Numbers with gaps, as pruning leaves them.
            for seq in [1, 5, 9] {
                try db.execute(
                    sql: """
                        INSERT INTO delivery_attempt (seq, id, app, endpoint, event_id, event_type, subject, attempt, outcome, http_status,
                            finished_at, body, duration_ms)
                        VALUES (?, ?, 'demo', 'e1', 'apple:n1:renewal', 'renewal', '1000', 1, 'delivered', 204, 1767225600100, '{}', 12)
                        """, arguments: [seq, "a\(seq)"])
            }
            try db.execute(sql: "INSERT INTO endpoint_status (endpoint, at, body) VALUES ('e1', 1767225600100, '{\"state\":\"healthy\"}')")
            try db.execute(sql: "INSERT INTO delivery_resend (failure_id, requested_at, replayed_from) VALUES ('a0', 1767225600200, 'deliveries:0:5')")
        }
        try pool.close()
        return path
    }

    /// A connection of the test's own, waiting out the lock a closing pool's last connection holds for a moment.
    private func open(_ path: String) throws -> DatabaseQueue {
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        return try DatabaseQueue(path: path, configuration: configuration)
    }

    /// What the events file holds, read apart from the relay's code.
    private func eventsFile(_ backendPath: String) throws -> (events: [String], counter: Int64?, attempts: Int, statuses: Int, resends: Int) {
        let queue = try open(SubscriptionDatabase.eventsPath(forBackend: backendPath))
        return try queue.read { db in
            (
                try String.fetchAll(db, sql: "SELECT seq || ':' || id FROM event ORDER BY seq"),
                try Int64.fetchOne(db, sql: "SELECT seq FROM sqlite_sequence WHERE name = 'event'"),
                try Int.fetchOne(db, sql: "SELECT count(*) FROM delivery_attempt") ?? -1,
                try Int.fetchOne(db, sql: "SELECT count(*) FROM endpoint_status") ?? -1,
                try Int.fetchOne(db, sql: "SELECT count(*) FROM delivery_resend") ?? -1
            )
        }
    }

    private func tables(_ path: String) throws -> [String] {
        try open(path).read { db in try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'table'") }
    }

    @Test func theEventsStoreAndTheDeliveryLogLiveInAFileOfTheirOwn() async throws {
        // Their recorder's batches must not hold the writer the worker's state writes wait for.
        let path = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("backend-split") + "/backend.sqlite").path
        #expect(SubscriptionDatabase.eventsPath(forBackend: path).hasSuffix("/backend-events.sqlite"))
        #expect(SubscriptionDatabase.eventsPath(forBackend: "/data/state.db") == "/data/state.db-events")
        let database = try SubscriptionDatabase(path: path)
        #expect(try database.commitsAreSynced())
        let recorded = try await EventStore(database: database).record([.init(app: "demo", body: testEvent("apple:n1:renewal"))])
        #expect(recorded.inserted == 1)
        #expect(try eventsFile(path).events == ["1:apple:n1:renewal"])
        let backendTables = try tables(path)
        #expect(Set(backendTables).isDisjoint(with: SubscriptionDatabase.eventsTables), "\(backendTables)")
        #expect(backendTables.contains("subscription"))
        // Opened again (every restart): the move is not attempted twice, and what was recorded is there.
        let reopened = try SubscriptionDatabase(path: path)
        #expect(try await EventStore(database: reopened).count() == 1)
    }

    @Test func aStoreFromBeforeTheSplitHasItsEventsMovedWithTheirNumbersAtFirstOpen() async throws {
        let path = try databaseBeforeTheSplit()
        let database = try SubscriptionDatabase(path: path)
        let moved = try eventsFile(path)
        #expect(moved.events == ["1:apple:n1:renewal", "2:apple:n2:renewal"])
        #expect(moved.counter == 7)
        #expect(moved.attempts == 3 && moved.statuses == 1 && moved.resends == 1)
        // The events routes' cursors stay valid: the next event is numbered after every one handed out.
        let events = EventStore(database: database)
        _ = try await events.record([.init(app: "demo", body: testEvent("apple:n3:renewal"))])
        #expect(try eventsFile(path).events.last == "8:apple:n3:renewal")
        let page = try await events.page(EventFilter(app: "demo"), after: 1, limit: 10)
        #expect(page.payloads.count == 2)
        #expect(try await DeliveryLog(database: database).page(DeliveryLog.Filter(), before: nil, limit: 10).attempts.count == 3)
        let backendTables = try tables(path)
        #expect(Set(backendTables).isDisjoint(with: SubscriptionDatabase.eventsTables), "\(backendTables)")
    }

    /// The events file as a move that ran as far as `copy` left it: migrated, then `copy` run on it.
    private func eventsFileOfAMove(from path: String, _ copy: (Database) throws -> Void) throws {
        let eventsPool = try DatabasePool(path: SubscriptionDatabase.eventsPath(forBackend: path))
        try SubscriptionDatabase.eventsMigrator.migrate(eventsPool)
        try eventsPool.writeWithoutTransaction { db in
            try db.execute(sql: "ATTACH DATABASE ? AS backend", arguments: [path])
            try db.inTransaction {
                try copy(db)
                return .commit
            }
            try db.execute(sql: "DETACH DATABASE backend")
        }
        try eventsPool.close()
    }

    @Test func aMoveThatFinishedBeforeACrashIsNotCopiedAgain() async throws {
        // The move committed its mark, and the process died before the backend file dropped the tables: the
        // next open only drops them. (Copied again, the events' keys would refuse the copy and the relay would
        // not start; a resend mark has no key, and would be there twice.)
        let path = try databaseBeforeTheSplit()
        let eventsPool = try DatabasePool(path: SubscriptionDatabase.eventsPath(forBackend: path))
        try SubscriptionDatabase.eventsMigrator.migrate(eventsPool)
        try SubscriptionDatabase.moveEvents(from: path, into: eventsPool, logger: testLogger())
        try eventsPool.close()
        #expect(try eventsFile(path).resends == 1)
        #expect(try tables(path).contains("event"))
        let database = try SubscriptionDatabase(path: path)
        let moved = try eventsFile(path)
        #expect(moved.events.count == 2 && moved.attempts == 3 && moved.statuses == 1 && moved.resends == 1)
        #expect(moved.counter == 7)
        #expect(Set(try tables(path)).isDisjoint(with: SubscriptionDatabase.eventsTables))
        withExtendedLifetime(database) {}
    }

    @Test func aMoveCutShortGoesOnAfterItsLastCommittedRow() async throws {
        // A large store's move is batches of rows, each committed: killed halfway (a startup probe), the next
        // start copies the rest, once.
        let path = try databaseBeforeTheSplit()
        try eventsFileOfAMove(from: path) { db in
            try db.execute(sql: "INSERT INTO main.event SELECT * FROM backend.event WHERE seq = 1")
        }
        #expect(try eventsFile(path).events == ["1:apple:n1:renewal"])
        // Going on in batches of one row: each a commit of its own, across the attempts' gaps.
        let eventsPool = try DatabasePool(path: SubscriptionDatabase.eventsPath(forBackend: path))
        try SubscriptionDatabase.moveEvents(from: path, into: eventsPool, logger: testLogger(), batch: 1)
        try eventsPool.close()
        let database = try SubscriptionDatabase(path: path)
        let moved = try eventsFile(path)
        #expect(moved.events == ["1:apple:n1:renewal", "2:apple:n2:renewal"])
        #expect(moved.counter == 7 && moved.attempts == 3 && moved.statuses == 1 && moved.resends == 1)
        withExtendedLifetime(database) {}
    }

    @Test func anEventsFileThatIsNotAMovesRefusesToStartAndDropsNothing() async throws {
        // Rows under the same numbers that are not the backend's (a file from another store): going on would
        // skip the backend's rows below them, and dropping the tables would lose them.
        let path = try databaseBeforeTheSplit()
        try eventsFileOfAMove(from: path) { db in
            try db.execute(
                sql: """
                    INSERT INTO main.event SELECT seq, 'another:store:renewal', app, project_id, application_id, type, store, environment,
                        original_transaction_id, app_user_id, product_id, ts, received_at, currency, price_usd, proceeds_usd, price_local,
                        historical, notification_id, payload
                    FROM backend.event WHERE seq = 1
                    """)
        }
        #expect {
            _ = try SubscriptionDatabase(path: path)
        } throws: { error in
            "\(error)".contains("lacks 1 event rows") && "\(error)".contains("aside")
        }
        #expect(try tables(path).contains("event"), "the backend's events were dropped")
    }

    @Test func aFileMissingRowsBelowTheOnesItHoldsRefusesToGoOn() async throws {
        // An attempt numbered 5 without the one numbered 1: going on after 5 would never copy 1.
        let path = try databaseBeforeTheSplit()
        try eventsFileOfAMove(from: path) { db in
            try db.execute(sql: "INSERT INTO main.delivery_attempt SELECT * FROM backend.delivery_attempt WHERE seq = 5")
        }
        #expect {
            _ = try SubscriptionDatabase(path: path)
        } throws: { error in
            "\(error)".contains("lacks 1 delivery_attempt rows") && "\(error)".contains("aside")
        }
        #expect(try tables(path).contains("delivery_attempt"), "the backend's attempts were dropped")
    }

    /// Upgraded (moved), gone back by restoring the backend file only, recorded there, upgraded again: the events
    /// file is marked moved, and the backend's new event, attempt or resend mark is in it nowhere.
    @Test(arguments: [
        "INSERT INTO event SELECT 8, 'apple:n9:renewal', app, project_id, application_id, type, store, environment, original_transaction_id, app_user_id, product_id, ts, received_at, currency, price_usd, proceeds_usd, price_local, historical, notification_id, payload FROM event WHERE seq = 1",
        "INSERT INTO delivery_attempt SELECT 12, 'a12', app, endpoint, event_id, event_type, subject, attempt, outcome, http_status, finished_at, body, duration_ms FROM delivery_attempt WHERE seq = 1",
        "INSERT INTO delivery_resend (failure_id, requested_at, replayed_from) VALUES ('a1', 1767225600300, 'deliveries:0:6')",
    ])
    func whatAnOlderVersionAddedAfterTheMoveStopsTheStart(_ sql: String) async throws {
        let path = try databaseBeforeTheSplit()
        let eventsPool = try DatabasePool(path: SubscriptionDatabase.eventsPath(forBackend: path))
        try SubscriptionDatabase.eventsMigrator.migrate(eventsPool)
        try SubscriptionDatabase.moveEvents(from: path, into: eventsPool, logger: testLogger())
        try eventsPool.close()
        try await open(path).write { db in try db.execute(sql: sql) }
        #expect {
            _ = try SubscriptionDatabase(path: path)
        } throws: { error in
            "\(error)".contains("1 events, delivery attempts or resend marks that") && "\(error)".contains("aside")
        }
        #expect(Set(try tables(path)).isSuperset(of: SubscriptionDatabase.eventsTables), "what was recorded since was dropped")
    }

    @Test func theCounterOfAStoreWhoseEventsWereAllRemovedComesAlong() async throws {
        // No row to copy, so the events file has no counter of its own yet: it is made from the backend's.
        let path = try databaseBeforeTheSplit()
        try await open(path).write { db in try db.execute(sql: "DELETE FROM event") }
        let database = try SubscriptionDatabase(path: path)
        #expect(try eventsFile(path).counter == 7)
        _ = try await EventStore(database: database).record([.init(app: "demo", body: testEvent("apple:n3:renewal"))])
        #expect(try eventsFile(path).events == ["8:apple:n3:renewal"])
    }

    /// `backend.commitInterval`: writes that come sooner than the interval after a commit started wait for the
    /// rest of it, share one commit, and are written.
    @Test(.timeLimit(.minutes(1))) func writesSoonerThanTheCommitIntervalWaitForItAndShareOneCommit() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("backend") + "/backend.sqlite").path
        let interval = Duration.seconds(1)
        let metrics = TestMetrics()
        let database = try SubscriptionDatabase(path: path, commitInterval: interval, metrics: metrics)
        let clock = ContinuousClock()
        // Before the first write: its commit starts after this, and the next may not start within the interval.
        let start = clock.now
        guard case .written = try await database.write(testSubscriptionState("first", at: 1_000), ifMatch: 0) else {
            Issue.record("the first write was not written")
            return
        }
        #expect(metrics.value(of: "relay_backend_state_commits_total", []) == 1)
        let outcomes = try await withThrowingTaskGroup(of: SubscriptionDatabase.WriteOutcome.self) { group in
            for index in 0..<5 { group.addTask { try await database.write(testSubscriptionState("next-\(index)", at: 1_000), ifMatch: 0) } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(clock.now - start >= interval)
        #expect(metrics.value(of: "relay_backend_state_commits_total", []) == 2)
        #expect(metrics.value(of: "relay_backend_state_writes_total", []) == 6)
        #expect(outcomes.allSatisfy { if case .written(let stored) = $0 { stored.version == 1 } else { false } })
        #expect(try await database.subscription(store: .apple, originalTransactionId: "next-1")?.version == 1)
    }

    /// A 90 s interval: the first write of a fresh database is not held back by it (one that waited would run
    /// past the one-minute time limit).
    @Test(.timeLimit(.minutes(1))) func aWriteToAnIdleWriterIsCommittedAtOnce() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("backend") + "/backend.sqlite").path
        let database = try SubscriptionDatabase(path: path, commitInterval: .seconds(90))
        guard case .written = try await database.write(testSubscriptionState("alone", at: 1_000), ifMatch: 0) else {
            Issue.record("the write was not written")
            return
        }
    }

    @Test func concurrentWritesAreCommittedTogetherAndEachIsCheckedAgainstItsVersion() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("backend") + "/backend.sqlite").path
        let database = try SubscriptionDatabase(path: path)
        // Durable on power loss, not only on a crash: the writer's commits are fsynced.
        #expect(try database.commitsAreSynced())

        // 40 writers at once: 20 create distinct subscriptions, 20 race to create the same one.
        let outcomes = try await withThrowingTaskGroup(of: (String, SubscriptionDatabase.WriteOutcome).self) { group in
            for index in 0..<20 {
                group.addTask { ("own", try await database.write(testSubscriptionState("own-\(index)", user: "owner-\(index)", at: 1_000), ifMatch: 0)) }
                group.addTask { ("shared", try await database.write(testSubscriptionState("shared", user: "user-\(index)", at: 1_000), ifMatch: 0)) }
            }
            return try await group.reduce(into: [(String, SubscriptionDatabase.WriteOutcome)]()) { $0.append($1) }
        }
        let own = outcomes.filter { $0.0 == "own" }.map(\.1)
        #expect(own.allSatisfy { if case .written(let stored) = $0 { stored.version == 1 } else { false } })
        let shared = outcomes.filter { $0.0 == "shared" }.map(\.1)
        let written = shared.compactMap { outcome -> SubscriptionState? in if case .written(let stored) = outcome { stored } else { nil } }
        #expect(written.count == 1)
        // The others were told who won, and nothing of theirs was stored.
        #expect(shared.filter { if case .versionMismatch(let current) = $0 { current?.version == 1 } else { false } }.count == 19)
        let stored = try await database.subscription(store: .apple, originalTransactionId: "shared")
        #expect(stored == written.first)
        #expect(try await database.subscriptions(ofUser: written.first!.originalAppUserId!).map(\.originalTransactionId) == ["shared"])

        // A later write moves the version on, once per write.
        guard case .written(let second) = try await database.write(testSubscriptionState("shared", at: 2_000), ifMatch: 1) else {
            Issue.record("not written")
            return
        }
        #expect(second.version == 2)
        // One write that fails (refused, it must name the stored state, whose row no longer decodes) fails
        // alone; the writes committed with it land. (A write that goes through never decodes the stored state.)
        let raw = try DatabaseQueue(path: path)
        try await raw.write { db in try db.execute(sql: "UPDATE subscription SET state = '{\"broken\": true}' WHERE original_transaction_id = 'own-3'") }
        let mixed = await withTaskGroup(of: (String, Bool).self) { group in
            group.addTask { ("own-3", (try? await database.write(testSubscriptionState("own-3", user: "owner-3", at: 3_000), ifMatch: 0)) != nil) }
            for index in 20..<40 {
                group.addTask { ("own-\(index)", (try? await database.write(testSubscriptionState("own-\(index)", user: "owner-\(index)", at: 3_000), ifMatch: 0)) != nil) }
            }
            return await group.reduce(into: [String: Bool]()) { $0[$1.0] = $1.1 }
        }
        #expect(mixed["own-3"] == false)
        #expect(mixed.filter { $0.key != "own-3" }.values.allSatisfy { $0 }, "\(mixed.filter { !$0.value })")
        // A write that names the stored version goes through without decoding the old row, and replaces it.
        guard case .written(let repaired) = try await database.write(testSubscriptionState("own-3", user: "owner-3", at: 3_000), ifMatch: 1) else {
            Issue.record("the write over the broken row was refused")
            return
        }
        #expect(repaired.version == 2)
        #expect(try await database.subscription(store: .apple, originalTransactionId: "own-3") == repaired)

        // A user's other subscriptions leave out the one named.
        #expect(try await database.subscriptions(ofUser: "owner-1").map(\.originalTransactionId) == ["own-1"])
        #expect(try await database.subscriptions(ofUser: "owner-1", excluding: (.apple, "own-1")).isEmpty)
    }

    @Test func aWriteRefusedOrStaleStoresNothingAndTheUsersFollowTheState() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("backend") + "/backend.sqlite").path
        let database = try SubscriptionDatabase(path: path)
        let first = try await database.write(testSubscriptionState("sub", user: "user-a", at: 1_000), ifMatch: 0)
        guard case .written(let stored) = first else { Issue.record("not written: \(first)"); return }

        // Refused: the wrong version names the stored state; older in source time is stale. Neither changes it.
        #expect(try await database.write(testSubscriptionState("sub", user: "user-b", at: 2_000), ifMatch: 0) == .versionMismatch(current: stored))
        #expect(try await database.write(testSubscriptionState("sub", user: "user-b", at: 500), ifMatch: 1) == .stale(current: stored))
        #expect(try await database.subscription(store: .apple, originalTransactionId: "sub") == stored)
        #expect(try await database.subscriptions(ofUser: "user-b").isEmpty)

        // A renewal of the same user keeps it that user's; a new owner takes it from the first.
        guard case .written = try await database.write(testSubscriptionState("sub", user: "user-a", at: 2_000), ifMatch: 1) else {
            Issue.record("the renewal was not written")
            return
        }
        #expect(try await database.subscriptions(ofUser: "user-a").map(\.version) == [2])
        guard case .written = try await database.write(testSubscriptionState("sub", user: "user-b", at: 3_000), ifMatch: 2) else {
            Issue.record("the new owner's state was not written")
            return
        }
        #expect(try await database.subscriptions(ofUser: "user-a").isEmpty)
        #expect(try await database.subscriptions(ofUser: "user-b").map(\.version) == [3])
    }
}

/// The in-process backend checks a state without a JSON round trip: the check must agree with the decoder.
