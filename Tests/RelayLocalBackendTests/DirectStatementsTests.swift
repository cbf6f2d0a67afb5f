import Foundation
import GRDB
import RelayCore
@testable import RelayLocalBackend
import RelaySQLite
import RelayTestSupport
import Testing

/// The hot path's writes and reads with SQLite's C calls store and read what GRDB's arguments and rows do,
/// and fail as GRDB fails.
@Suite struct DirectStatementsTests {
    static let insert = "INSERT INTO t (i, d, s, b, u) VALUES (?, ?, ?, ?, ?)"

    func makeQueue() throws -> DatabaseQueue {
        let queue = try DatabaseQueue()
        try queue.write { db in
            try db.execute(sql: "CREATE TABLE t (i INTEGER, d REAL, s TEXT, b BLOB, u TEXT, UNIQUE (i))")
        }
        return queue
    }

    /// Each column's value, type and bytes as SQLite keeps them.
    func stored(_ queue: DatabaseQueue) throws -> [[String]] {
        try queue.read { db in
            try Row.fetchAll(
                db,
                sql: """
                    SELECT i, typeof(i), d, typeof(d), s, typeof(s), hex(s), typeof(b), hex(b), u, typeof(u), hex(u) FROM t ORDER BY rowid
                    """
            ).map { row in (0..<row.count).map { String(describing: row[$0] as DatabaseValue) } }
        }
    }

    @Test func theValuesStoredAreTheOnesGRDBsArgumentsStore() throws {
        let text = "naïve – 😀 \\ \" \n \u{0}after a NUL"
        let values: [(Int64?, Double?, String?, [UInt8]?, [UInt8])] = [
            (1, 9.99, text, [0, 1, 2, 255], Array(#"{"a":"é"}"#.utf8)),
            (2, nil, nil, nil, []),
            (3, -0.5, "", [], Array("x".utf8)),
            (.max, .greatestFiniteMagnitude, String(repeating: "y", count: 20_000), Array(repeating: 7, count: 20_000), Array(repeating: 65, count: 13_000)),
        ]
        let direct = try makeQueue(), grdb = try makeQueue()
        // Three rounds: the cached statement is reused from a clean state each time.
        for round in 0..<3 {
            try direct.write { db in
                let write = DirectWrite(try db.cachedStatement(sql: Self.insert))
                for (index, value) in values.enumerated() {
                    try write.execute { parameters in
                        parameters.int64(value.0.map { $0 == .max ? $0 - Int64(round) : $0 + Int64(10 * round) } ?? Int64(index))
                        parameters.double(value.1)
                        parameters.text(value.2)
                        parameters.blob(value.3)
                        parameters.text(utf8: value.4)
                    }
                }
            }
            try grdb.write { db in
                for (index, value) in values.enumerated() {
                    try db.cachedStatement(sql: Self.insert).execute(
                        arguments: [
                            value.0.map { $0 == .max ? $0 - Int64(round) : $0 + Int64(10 * round) } ?? Int64(index), value.1, value.2,
                            value.3.map { Data($0) }, String(decoding: value.4, as: UTF8.self),
                        ])
                }
            }
        }
        let rows = try stored(direct)
        #expect(rows.count == 12)
        #expect(rows == (try stored(grdb)))
        // The NULLs are NULL, the empty text and blob are empty, not NULL.
        #expect(rows[1][3] == "\"null\"" && rows[1][5] == "\"null\"" && rows[1][7] == "\"null\"")
        #expect(rows[2][5] == "\"text\"" && rows[2][7] == "\"blob\"" && rows[2][8] == "\"\"")
        #expect(rows[1][10] == "\"text\"" && rows[1][11] == "\"\"")
    }

    @Test func aConstraintFailsAsGRDBsWouldAndTheStatementIsUsableAfter() throws {
        let queue = try makeQueue()
        try queue.write { db in
            let write = DirectWrite(try db.cachedStatement(sql: Self.insert))
            func row(_ i: Int64) throws {
                try write.execute { parameters in
                    parameters.int64(i)
                    parameters.double(nil)
                    parameters.text("s\(i)")
                    parameters.blob(nil)
                    parameters.text(utf8: [])
                }
            }
            try row(1)
            let error = #expect(throws: DatabaseError.self) { try row(1) }
            #expect(error?.resultCode == .SQLITE_CONSTRAINT)
            #expect(error?.sql == Self.insert)
            try row(2)
        }
        #expect(try queue.read { db in try Int64.fetchAll(db, sql: "SELECT i FROM t ORDER BY i") } == [1, 2])
    }

    @Test func parametersLeftUnboundOrOutsideATransactionAreRefusedBeforeAnythingRuns() throws {
        let queue = try makeQueue()
        try queue.write { db in
            let write = DirectWrite(try db.cachedStatement(sql: Self.insert))
            let error = #expect(throws: DatabaseError.self) {
                try write.execute { parameters in
                    parameters.int64(1)
                    parameters.double(1)
                }
            }
            #expect(error?.resultCode == .SQLITE_MISUSE)
            #expect(error?.message?.contains("2 parameters bound of 5") == true)
        }
        try queue.writeWithoutTransaction { db in
            let write = DirectWrite(try db.cachedStatement(sql: Self.insert))
            let error = #expect(throws: DatabaseError.self) {
                try write.execute { parameters in
                    parameters.int64(1)
                    parameters.double(1)
                    parameters.text("x")
                    parameters.blob([1])
                    parameters.text(utf8: [])
                }
            }
            #expect(error?.resultCode == .SQLITE_MISUSE)
        }
        #expect(try queue.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM t") } == 0)
    }

    @Test func readsGiveWhatGRDBsRowsGive() throws {
        let queue = try makeQueue()
        try queue.write { db in
            for (i, text) in [(1, "é 😀"), (2, ""), (3, "plain")] as [(Int64, String)] {
                try db.execute(sql: Self.insert, arguments: [i, Double(i) / 4, text, nil, i == 3 ? nil : text])
            }
        }
        // Twice: the cached statement is reset and its bindings cleared after each read.
        for _ in 0..<2 {
            try queue.read { db in
                let read = DirectRead(try db.cachedStatement(sql: "SELECT i, s, u, b FROM t WHERE i >= ? AND s <> ? ORDER BY i"))
                var rows: [(Int64, String?, [UInt8]?, Bool)] = []
                try read.forEach { parameters in
                    parameters.int64(2)
                    parameters.text("nothing")
                } row: { columns in
                    rows.append((columns.int64(0), columns.text(1), columns.textBytes(2), columns.bytes(3) == nil))
                }
                let grdb = try Row.fetchAll(db, sql: "SELECT i, s, u, b FROM t WHERE i >= ? AND s <> ? ORDER BY i", arguments: [2, "nothing"])
                #expect(rows.map(\.0) == grdb.map { $0[0] as Int64 })
                #expect(rows.map(\.1) == grdb.map { $0[1] as String? })
                #expect(rows.map { $0.2.map { String(decoding: $0, as: UTF8.self) } } == grdb.map { $0[2] as String? })
                // An empty text is empty, not NULL; NULL is nil.
                #expect(rows[0].1 == "" && rows[0].2 == [] && rows[1].2 == nil && rows.allSatisfy(\.3))
                // No rows: the body never runs.
                try read.forEach { parameters in
                    parameters.int64(10)
                    parameters.text("")
                } row: { _ in Issue.record("no row matches") }
            }
        }
    }

    @Test func blobsReadBackAsStoredNullEmptyAndBytes() throws {
        let queue = try makeQueue()
        try queue.write { db in
            for (i, blob) in [(1, nil), (2, Data()), (3, Data([0, 1, 255]))] as [(Int64, Data?)] {
                try db.execute(sql: Self.insert, arguments: [i, nil, "s", blob, "u"])
            }
        }
        let read = try queue.read { db in
            var blobs: [[UInt8]?] = []
            try DirectRead(try db.cachedStatement(sql: "SELECT b FROM t ORDER BY i")).forEach { _ in } row: { blobs.append($0.bytes(0)) }
            return blobs
        }
        #expect(read == [nil, [], [0, 1, 255]])
    }

    @Test func aReadsFailureIsTheRowsOwnOrSQLites() throws {
        struct Stop: Error {}
        let queue = try makeQueue()
        try queue.write { db in try db.execute(sql: Self.insert, arguments: [1, 1.0, "a", nil, "b"]) }
        try queue.read { db in
            let read = DirectRead(try db.cachedStatement(sql: "SELECT i FROM t WHERE i = ?"))
            #expect(throws: Stop.self) { try read.forEach { $0.int64(1) } row: { _ in throw Stop() } }
            let unbound = #expect(throws: DatabaseError.self) { try read.forEach { _ in } row: { _ in } }
            #expect(unbound?.resultCode == .SQLITE_MISUSE)
            // The statement is usable after both.
            var seen: [Int64] = []
            try read.forEach { $0.int64(1) } row: { seen.append($0.int64(0)) }
            #expect(seen == [1])
        }
    }

    @Test func aWriteAfterSQLiteRolledTheTransactionBackIsRefused() throws {
        let queue = try makeQueue()
        try queue.write { db in try db.execute(sql: Self.insert, arguments: [1, nil, "a", nil, "b"]) }
        try queue.writeWithoutTransaction { db in
            try db.execute(sql: "BEGIN")
            // A conflict under OR ROLLBACK ends the transaction: SQLite is back in autocommit.
            #expect(throws: DatabaseError.self) { try db.execute(sql: "INSERT OR ROLLBACK INTO t (i) VALUES (1)") }
            #expect(!db.isInsideTransaction)
            let error = #expect(throws: DatabaseError.self) {
                try DirectWrite(try db.cachedStatement(sql: Self.insert)).execute { parameters in
                    parameters.int64(2)
                    parameters.double(nil)
                    parameters.text("c")
                    parameters.blob(nil)
                    parameters.text(utf8: [])
                }
            }
            #expect(error?.resultCode == .SQLITE_MISUSE)
        }
        #expect(try queue.read { db in try Int64.fetchAll(db, sql: "SELECT i FROM t") } == [1])
    }

    @Test func aStatementThatReturnsRowsOrIsBeingSteppedIsRefused() throws {
        let queue = try makeQueue()
        try queue.write { db in
            try db.execute(sql: Self.insert, arguments: [1, nil, "a", nil, "b"])
            try db.execute(sql: Self.insert, arguments: [2, nil, "a", nil, "b"])
            let returning = #expect(throws: DatabaseError.self) {
                try DirectWrite(try db.cachedStatement(sql: "UPDATE t SET s = ? RETURNING i")).execute { $0.text("x") }
            }
            #expect(returning?.resultCode == .SQLITE_MISUSE)
            // The same query run again from inside its own row would restart it under the outer loop.
            let read = DirectRead(try db.cachedStatement(sql: "SELECT i FROM t WHERE s = ?"))
            var outer: [Int64] = []
            let nested = #expect(throws: DatabaseError.self) {
                try read.forEach { $0.text("a") } row: { columns in
                    outer.append(columns.int64(0))
                    try read.forEach { $0.text("a") } row: { _ in }
                }
            }
            #expect(nested?.resultCode == .SQLITE_MISUSE && outer == [1])
        }
        #expect(try queue.read { db in try String.fetchAll(db, sql: "SELECT s FROM t") } == ["a", "a"])
    }

    /// Each hot statement's columns in order: an event and an attempt recorded, read back column by column.
    @Test func theEventAndAttemptRowsHoldEachValueInItsColumn() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("direct") + ".sqlite").path
        let database = try SubscriptionDatabase(path: path)
        let events = EventStore(database: database)
        let body = testEvent(
            "apple:n9:renewal", user: "user-9", subject: "sub-9", product: "com.example.pro", ts: 1_767_225_600_000, price: 9.99, proceeds: 8.49,
            currency: "EUR", local: 9.19)
        #expect(try await events.record([EventStore.Entry(app: "demo", body: body, historical: true)]).inserted == 1)
        let attempt = DeliveryAttempt(
            app: "demo", endpoint: "hook", eventId: "apple:n9:renewal", eventType: "renewal", subject: "sub-9", attempt: 2, outcome: .retrying,
            httpStatus: 503, durationMs: 31, error: "HTTP 503", startedAt: 1_000, finishedAt: 1_031)
        #expect(try await DeliveryLog(database: database, clock: { 2_000 }).record([attempt.json.serialized()]).inserted == 1)
        let eventValues: [(String, DatabaseValue)] = ([
            ("id", "apple:n9:renewal"), ("app", "demo"), ("project_id", Int64(1)), ("application_id", Int64(7)), ("type", "renewal"),
            ("store", "apple"), ("environment", "PRODUCTION"), ("original_transaction_id", "sub-9"), ("app_user_id", "user-9"),
            ("product_id", "com.example.pro"), ("ts", Int64(1_767_225_600_000)), ("received_at", Int64(1_767_225_600_005)), ("currency", "EUR"),
            ("price_usd", 9.99), ("proceeds_usd", 8.49), ("price_local", 9.19), ("historical", Int64(1)),
            ("notification_id", "apple:n9:renewal"), ("payload", String(decoding: body, as: UTF8.self)),
        ] as [(String, any DatabaseValueConvertible)]).map { ($0.0, $0.1.databaseValue) }
        let attemptValues: [(String, DatabaseValue)] = ([
            ("id", attempt.id), ("app", "demo"), ("endpoint", "hook"), ("event_id", "apple:n9:renewal"), ("event_type", "renewal"),
            ("subject", "sub-9"), ("attempt", Int64(2)), ("outcome", "retrying"), ("http_status", Int64(503)), ("finished_at", Int64(1_031)),
            ("body", String(decoding: attempt.json.serialized(), as: UTF8.self)), ("duration_ms", Int64(31)),
        ] as [(String, any DatabaseValueConvertible)]).map { ($0.0, $0.1.databaseValue) }
        try await database.eventsPool.read { db in
            let event = try #require(try Row.fetchOne(db, sql: "SELECT * FROM event"))
            for (name, value) in eventValues {
                let stored: DatabaseValue = event[name]
                #expect(stored == value, "event.\(name)")
            }
            let row = try #require(try Row.fetchOne(db, sql: "SELECT * FROM delivery_attempt"))
            for (name, value) in attemptValues {
                let stored: DatabaseValue = row[name]
                #expect(stored == value, "delivery_attempt.\(name)")
            }
        }
    }
}
