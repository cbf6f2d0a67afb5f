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
}
