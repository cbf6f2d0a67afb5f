import Foundation
import GRDB
import GRDBSQLite
import RelaySQLite
import Testing

/// The WAL's gathered writes: every committed frame is in the file, as another connection through the
/// default VFS reads it, when the commit returns; a rolled-back transaction's spilled frames never count;
/// the database stays whole.
@Suite struct GatheringWALTests {
    /// Rows and total bytes of table `t`, read through SQLite's own unix VFS on a connection of its own.
    func plainCount(_ path: String) throws -> (rows: Int64, bytes: Int64, integrity: String) {
        var handle: OpaquePointer?
        guard sqlite3_open_v2(path, &handle, SQLITE_OPEN_READONLY, "unix") == SQLITE_OK, let handle else {
            throw DatabaseError(message: "open \(path) through unix failed")
        }
        defer { sqlite3_close_v2(handle) }
        func scalar(_ sql: String) throws -> (Int64, Int64, String) {
            var statement: OpaquePointer?
            guard sqlite3_prepare_v2(handle, sql, -1, &statement, nil) == SQLITE_OK else {
                throw DatabaseError(message: String(cString: sqlite3_errmsg(handle)))
            }
            defer { sqlite3_finalize(statement) }
            guard sqlite3_step(statement) == SQLITE_ROW else { throw DatabaseError(message: String(cString: sqlite3_errmsg(handle))) }
            let text = sqlite3_column_text(statement, 0).map { String(cString: $0) } ?? ""
            return (sqlite3_column_int64(statement, 0), sqlite3_column_int64(statement, 1), text)
        }
        let (rows, bytes, _) = try scalar("SELECT count(*), coalesce(sum(length(data)), 0) FROM t")
        let (_, _, integrity) = try scalar("PRAGMA integrity_check")
        return (rows, bytes, integrity)
    }

    func temporaryPath() throws -> String {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("gathering-wal-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory.appendingPathComponent("db.sqlite").path
    }

    /// With `synchronous = FULL` (the relay's) the commit's sync writes the frames out; with NORMAL nothing
    /// syncs, and the commit frame alone must.
    @Test(arguments: ["FULL", "NORMAL"])
    func everyCommitIsInTheFileWhenItReturns(synchronous: String) throws {
        let path = try temporaryPath()
        defer { try? FileManager.default.removeItem(atPath: (path as NSString).deletingLastPathComponent) }
        let pool = try DurableSQLite.openPool(path: path, busyTimeout: 5)
        try pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA synchronous = \(synchronous)") }
        #expect(GatheringWAL.isRegistered && String(cString: sqlite3_vfs_find(nil).pointee.zName) == GatheringWAL.name)
        try pool.write { db in try db.execute(sql: "CREATE TABLE t (id INTEGER PRIMARY KEY, data BLOB NOT NULL)") }
        var generator = SystemRandomNumberGenerator()
        var rows: Int64 = 0, bytes: Int64 = 0
        for round in 0..<60 {
            // One row of a few bytes, or many of up to 20 KB (overflow pages): one to hundreds of frames a
            // commit, many of them past the gathering buffer (about 30 frames).
            let count = round % 3 == 0 ? 1 : Int.random(in: 2...120, using: &generator)
            let sizes = (0..<count).map { _ in round % 3 == 0 ? 3 : Int.random(in: 10...20_000, using: &generator) }
            try pool.write { db in
                for size in sizes {
                    try db.execute(sql: "INSERT INTO t (data) VALUES (?)", arguments: [Data(repeating: UInt8(round), count: size)])
                }
            }
            rows += Int64(count)
            bytes += Int64(sizes.reduce(0, +))
            let plain = try plainCount(path)
            #expect(plain.rows == rows && plain.bytes == bytes, "round \(round): \(plain)")
        }
        // Checkpointed and written on (the WAL restarts from its start), still whole.
        try pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)") }
        try pool.write { db in try db.execute(sql: "INSERT INTO t (data) VALUES (?)", arguments: [Data(repeating: 1, count: 5_000)]) }
        let plain = try plainCount(path)
        #expect(plain.rows == rows + 1 && plain.integrity == "ok")
    }

    /// A transaction larger than the page cache spills frames into the WAL before it commits; rolled back,
    /// none of them may be read, and the next commit writes over them.
    @Test func aRolledBackTransactionsSpilledFramesNeverCount() throws {
        let path = try temporaryPath()
        defer { try? FileManager.default.removeItem(atPath: (path as NSString).deletingLastPathComponent) }
        let pool = try DurableSQLite.openPool(path: path, busyTimeout: 5)
        try pool.write { db in try db.execute(sql: "CREATE TABLE t (id INTEGER PRIMARY KEY, data BLOB NOT NULL)") }
        try pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA cache_size = 10") }
        struct Abandoned: Error {}
        for round in 0..<5 {
            #expect(throws: Abandoned.self) {
                try pool.write { db in
                    for _ in 0..<300 { try db.execute(sql: "INSERT INTO t (data) VALUES (?)", arguments: [Data(repeating: 9, count: 3_000)]) }
                    // The pages spilled to the WAL are read back by the transaction that wrote them.
                    let seen = try Row.fetchOne(db, sql: "SELECT count(*), sum(length(data)), sum(unicode(data) = 9) FROM t")
                    #expect(seen?[0] == Int64(300 + round * (round + 1) / 2), "round \(round)")
                    #expect(seen?[1] == Int64(300 * 3_000 + 100 * round * (round + 1) / 2))
                    #expect(seen?[2] == 300 as Int64)
                    throw Abandoned()
                }
            }
            try pool.write { db in
                for _ in 0..<(round + 1) { try db.execute(sql: "INSERT INTO t (data) VALUES (?)", arguments: [Data(repeating: 2, count: 100)]) }
            }
        }
        let plain = try plainCount(path)
        #expect(plain.rows == 15 && plain.bytes == 1_500 && plain.integrity == "ok", "\(plain)")
        let count = try pool.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM t") }
        #expect(count == 15)
    }
}
