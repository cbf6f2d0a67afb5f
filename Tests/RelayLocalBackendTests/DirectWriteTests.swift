import Foundation
import GRDB
import RelaySQLite
import Testing

/// The hot path's writes bound with SQLite's C calls store what GRDB's arguments stored, and fail as GRDB
/// fails.
@Suite struct DirectWriteTests {
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
        let text = "naïve – 😀 \\ \" \n"
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
}
