import GRDB
import RelaySQLite
import Testing

/// The transactions and savepoints the hot path runs with cached statements behave as GRDB's own.
@Suite struct CachedTransactionsTests {
    struct Refused: Error {}

    @Test func aSavepointThatThrowsTakesBackOnlyItsOwnWritesAndTheTransactionGoesOn() throws {
        let queue = try DatabaseQueue()
        try queue.write { db in try db.execute(sql: "CREATE TABLE t (x INTEGER)") }
        // Three times over: the cached statements are reused, each time from a clean state.
        for round in 0..<3 {
            try queue.write { db in
                try db.execute(sql: "INSERT INTO t VALUES (?)", arguments: [round * 10 + 1])
                #expect(throws: Refused.self) {
                    try CachedTransactions.savepoint(db) {
                        try db.execute(sql: "INSERT INTO t VALUES (?)", arguments: [round * 10 + 2])
                        throw Refused()
                    }
                }
                #expect(db.isInsideTransaction)
                let three = try CachedTransactions.savepoint(db) {
                    try db.execute(sql: "INSERT INTO t VALUES (?)", arguments: [round * 10 + 3])
                    return 3
                }
                #expect(three == 3)
            }
        }
        #expect(try queue.read { db in try Int.fetchAll(db, sql: "SELECT x FROM t ORDER BY x") } == [1, 3, 11, 13, 21, 23])
    }

    @Test func aDeferredTransactionCommitsWhatItDidAndRollsBackWhenItThrows() throws {
        let queue = try DatabaseQueue()
        try queue.write { db in try db.execute(sql: "CREATE TABLE t (x INTEGER)") }
        for round in 0..<3 {
            try queue.writeWithoutTransaction { db in
                let count = try CachedTransactions.deferred(db) { db in
                    try db.execute(sql: "INSERT INTO t VALUES (?)", arguments: [round])
                    return try Int.fetchOne(db, sql: "SELECT count(*) FROM t") ?? -1
                }
                #expect(count == round + 1)
                #expect(!db.isInsideTransaction)
                #expect(throws: Refused.self) {
                    try CachedTransactions.deferred(db) { db in
                        try db.execute(sql: "INSERT INTO t VALUES (?)", arguments: [100 + round])
                        throw Refused()
                    }
                }
                #expect(!db.isInsideTransaction)
            }
        }
        #expect(try queue.read { db in try Int.fetchAll(db, sql: "SELECT x FROM t ORDER BY x") } == [0, 1, 2])
    }

    /// An error SQLite answers by rolling the whole transaction back (here `INSERT OR ROLLBACK` on a duplicate,
    /// as a full disk or an I/O error would): the savepoints after it fail as aborted, none of the writes is
    /// committed, and the process goes on.
    @Test func aTransactionRolledBackUnderASavepointFailsTheWritesAfterItAndCommitsNothing() throws {
        let queue = try DatabaseQueue()
        try queue.write { db in try db.execute(sql: "CREATE TABLE t (x INTEGER PRIMARY KEY)") }
        var outcomes: [String] = []
        #expect(throws: (any Error).self) {
            try queue.write { db in
                for value in [1, 1, 2] {
                    do {
                        try CachedTransactions.savepoint(db) { try db.execute(sql: "INSERT OR ROLLBACK INTO t VALUES (?)", arguments: [value]) }
                        outcomes.append("written")
                    } catch let error as DatabaseError {
                        outcomes.append(error.resultCode == .SQLITE_ABORT ? "aborted" : "failed")
                    }
                }
            }
        }
        #expect(outcomes == ["written", "failed", "aborted"])
        #expect(try queue.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM t") } == 0)
        // The connection is usable again.
        try queue.write { db in try CachedTransactions.savepoint(db) { try db.execute(sql: "INSERT INTO t VALUES (3)") } }
        #expect(try queue.read { db in try Int.fetchAll(db, sql: "SELECT x FROM t") } == [3])
    }

    @Test func aReadTransactionRolledBackUnderItsBodyIsReportedAbortedNotCommitted() throws {
        let queue = try DatabaseQueue()
        try queue.write { db in try db.execute(sql: "CREATE TABLE t (x INTEGER PRIMARY KEY); INSERT INTO t VALUES (1)") }
        try queue.writeWithoutTransaction { db in
            #expect {
                try CachedTransactions.deferred(db) { db in
                    try db.execute(sql: "INSERT INTO t VALUES (2)")
                    // Caught by the body, but the transaction is gone: what follows would run in autocommit.
                    _ = try? db.execute(sql: "INSERT OR ROLLBACK INTO t VALUES (1)")
                    try db.execute(sql: "INSERT INTO t VALUES (3)")
                }
            } throws: { ($0 as? DatabaseError)?.resultCode == .SQLITE_ABORT }
            #expect(!db.isInsideTransaction)
        }
        // Only the write the body made in autocommit, after SQLite's rollback, is there: nothing was committed
        // as the transaction's.
        #expect(try queue.read { db in try Int.fetchAll(db, sql: "SELECT x FROM t ORDER BY x") } == [1, 3])
    }
}
