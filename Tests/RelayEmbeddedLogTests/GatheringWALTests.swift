import Foundation
import GRDB
import GRDBSQLite
import RelayCore
@testable import RelaySQLite
import RelayTestSupport
import Testing

/// The WAL's gathered writes: every committed frame is in the file when the commit returns, whole (a copy
/// of the files taken then recovers it); a rolled-back transaction's frames never count and are never
/// written over another writer's; a failed write fails its commit; two processes killed at random points
/// lose no commit.
@Suite struct GatheringWALTests {
    /// A connection through SQLite's own unix VFS, for the checks: it sees the files, not our buffers. With
    /// `vfs` nil, through the process's default (the gathering VFS, once registered).
    final class PlainConnection {
        let handle: OpaquePointer

        init(_ path: String, readOnly: Bool = true, vfs: String? = "unix") throws {
            var handle: OpaquePointer?
            let flags = readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE
            let code = sqlite3_open_v2(path, &handle, flags, vfs)
            guard code == SQLITE_OK, let handle else {
                let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? "no connection"
                sqlite3_close_v2(handle)
                throw DatabaseError(message: "open \(path) through \(vfs ?? "the default VFS") failed (\(code)): \(message)")
            }
            self.handle = handle
            sqlite3_busy_timeout(handle, 5_000)
        }

        deinit {
            sqlite3_close_v2(handle)
        }

        func execute(_ sql: String) throws {
            guard sqlite3_exec(handle, sql, nil, nil, nil) == SQLITE_OK else {
                throw DatabaseError(message: String(cString: sqlite3_errmsg(handle)))
            }
        }

        /// The first row's first three columns as integers and its first as text.
        func row(_ sql: String) throws -> (first: Int64, second: Int64, third: Int64, text: String) {
            var statement: OpaquePointer?
            guard sqlite3_prepare_v2(handle, sql, -1, &statement, nil) == SQLITE_OK else {
                throw DatabaseError(message: String(cString: sqlite3_errmsg(handle)))
            }
            defer { sqlite3_finalize(statement) }
            guard sqlite3_step(statement) == SQLITE_ROW else { throw DatabaseError(message: String(cString: sqlite3_errmsg(handle))) }
            let text = sqlite3_column_text(statement, 0).map { String(cString: $0) } ?? ""
            return (sqlite3_column_int64(statement, 0), sqlite3_column_int64(statement, 1), sqlite3_column_int64(statement, 2), text)
        }

        /// Rows and total bytes of table `t`, and the integrity check's verdict.
        func census() throws -> (rows: Int64, bytes: Int64, integrity: String) {
            let (rows, bytes, _, _) = try row("SELECT count(*), coalesce(sum(length(data)), 0) FROM t")
            return (rows, bytes, try row("PRAGMA integrity_check").text)
        }
    }

    func temporaryPath() throws -> String {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("gathering-wal-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory.appendingPathComponent("db.sqlite").path
    }

    /// Removes the test's files, and stops watching its WAL.
    func removeDirectory(of path: String) {
        GatheringWAL.unwatch(path + "-wal")
        try? FileManager.default.removeItem(atPath: (path as NSString).deletingLastPathComponent)
    }

    /// What a crash at this moment would leave: the database file and its WAL copied as they are (no
    /// wal-index, so SQLite recovers from the WAL's frames and checksums alone), opened through unix.
    func census(ofCopy path: String) throws -> (rows: Int64, bytes: Int64, integrity: String) {
        let copy = try temporaryPath()
        defer { removeDirectory(of: copy) }
        try FileManager.default.copyItem(atPath: path, toPath: copy)
        try FileManager.default.copyItem(atPath: path + "-wal", toPath: copy + "-wal")
        return try PlainConnection(copy, readOnly: false).census()
    }

    func openPool(_ path: String, synchronous: String = "FULL") throws -> DatabasePool {
        let pool = try DurableSQLite.openPool(path: path, busyTimeout: 5)
        try pool.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA synchronous = \(synchronous)")
            try db.execute(sql: "CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, data BLOB NOT NULL)")
        }
        GatheringWAL.watch(path + "-wal")
        return pool
    }

    /// With `synchronous = FULL` (the relay's) the commit's sync writes the frames out; with NORMAL nothing
    /// syncs, and the commit frame alone must.
    @Test(arguments: ["FULL", "NORMAL"])
    func everyCommitIsInTheFileWhenItReturns(synchronous: String) throws {
        let path = try temporaryPath()
        defer { removeDirectory(of: path) }
        let pool = try openPool(path, synchronous: synchronous)
        #expect(GatheringWAL.isRegistered && String(cString: sqlite3_vfs_find(nil).pointee.zName) == GatheringWAL.name)
        var generator = SeededGenerator(seed: synchronous == "FULL" ? 1 : 2)
        var rows: Int64 = 0, bytes: Int64 = 0
        let plain = try PlainConnection(path)
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
            let seen = try plain.census()
            #expect(seen.rows == rows && seen.bytes == bytes, "round \(round): \(seen)")
            if round % 10 == 9 {
                let recovered = try census(ofCopy: path)
                #expect(recovered.rows == rows && recovered.bytes == bytes && recovered.integrity == "ok", "round \(round): \(recovered)")
            }
        }
        #expect(GatheringWAL.watched(path + "-wal").gatheredWrites >= 60, "the WAL's frames were gathered")
        // Checkpointed whole by another connection as the relay's checkpointer does (PASSIVE), and written on:
        // the next writer starts the WAL again from its first frame, over the old ones. Then truncated.
        let checkpointed = try PlainConnection(path, readOnly: false).row("PRAGMA wal_checkpoint(PASSIVE)")
        // Not busy, and every frame of the WAL copied: the next writer may start the WAL again.
        #expect(checkpointed.first == 0 && checkpointed.second > 0 && checkpointed.third == checkpointed.second, "\(checkpointed)")
        for round in 0..<3 {
            try pool.write { db in try db.execute(sql: "INSERT INTO t (data) VALUES (?)", arguments: [Data(repeating: 1, count: 5_000)]) }
            #expect(try plain.census() == (rows + 1, bytes + 5_000, "ok"), "round \(round) after the restart")
            #expect(try census(ofCopy: path) == (rows + 1, bytes + 5_000, "ok"), "round \(round) after the restart")
            rows += 1
            bytes += 5_000
        }
        try pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)") }
        try pool.write { db in try db.execute(sql: "INSERT INTO t (data) VALUES (?)", arguments: [Data(repeating: 1, count: 5_000)]) }
        #expect(try plain.census() == (rows + 1, bytes + 5_000, "ok"))
        #expect(try census(ofCopy: path) == (rows + 1, bytes + 5_000, "ok"))
    }

    /// Frames spilled under a savepoint that is rolled back to are written over by the same transaction's
    /// next frames; what commits is the transaction without them (at NORMAL: no sync writes anything out).
    @Test func aSavepointRolledBackToAfterASpillCommitsWithoutIt() throws {
        GatheringWAL.registerAsDefault()
        let path = try temporaryPath()
        defer { removeDirectory(of: path) }
        GatheringWAL.watch(path + "-wal")
        let connection = try PlainConnection(path, readOnly: false, vfs: nil)
        try connection.execute(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA cache_size = 10; CREATE TABLE t (id INTEGER PRIMARY KEY, data BLOB NOT NULL)")
        for round in 0..<4 {
            try connection.execute(
                """
                BEGIN IMMEDIATE;
                INSERT INTO t (data) VALUES (zeroblob(100));
                SAVEPOINT s;
                WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(100 + 40 * round))
                INSERT INTO t (data) SELECT randomblob(3000) FROM n;
                ROLLBACK TO s;
                WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5) INSERT INTO t (data) SELECT zeroblob(100) FROM n;
                RELEASE s;
                COMMIT
                """)
            let expected = (Int64(6 * (round + 1)), Int64(600 * (round + 1)), "ok")
            #expect(try PlainConnection(path).census() == expected, "round \(round)")
            #expect(try census(ofCopy: path) == expected, "round \(round)")
        }
        #expect(GatheringWAL.watched(path + "-wal").gatheredWrites > 0)
    }

    /// A connection in exclusive locking mode takes the WAL's locks without telling the VFS, so nothing
    /// could be dropped at them: once it is set, the WAL gathers nothing, and what commits is whole. The
    /// pragma reaches the VFS on the main database only; an attached one stops gathering because the VFS
    /// no longer sees its write lock taken. (The same connection gathered before, so the watch sees the WAL.)
    @Test(arguments: ["main", "attached"])
    func anExclusiveLockingModeConnectionGathersNothing(database: String) throws {
        GatheringWAL.registerAsDefault()
        let mainPath = try temporaryPath()
        let path = database == "main" ? mainPath : (mainPath as NSString).deletingLastPathComponent + "/attached.sqlite"
        defer {
            GatheringWAL.unwatch(path + "-wal")
            removeDirectory(of: mainPath)
        }
        GatheringWAL.watch(path + "-wal")
        let table = database == "main" ? "main.t" : "attached.t"
        let insert = """
            BEGIN IMMEDIATE;
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20) INSERT INTO \(table) (data) SELECT zeroblob(3000) FROM n;
            COMMIT
            """
        do {
            let connection = try PlainConnection(mainPath, readOnly: false, vfs: nil)
            try connection.execute(
                """
                PRAGMA journal_mode = WAL; PRAGMA cache_size = 10; ATTACH '\(path == mainPath ? ":memory:" : path)' AS attached;
                PRAGMA attached.journal_mode = WAL; CREATE TABLE \(table) (id INTEGER PRIMARY KEY, data BLOB NOT NULL)
                """)
            for _ in 0..<5 { try connection.execute(insert) }
            let gathered = GatheringWAL.watched(path + "-wal").gatheredWrites
            #expect(gathered > 0, "the connection gathered before exclusive locking")
            try connection.execute("PRAGMA locking_mode = EXCLUSIVE")
            for _ in 0..<10 { try connection.execute(insert) }
            #expect(try census(ofCopy: path) == (300, 900_000, "ok"))
            #expect(GatheringWAL.watched(path + "-wal").gatheredWrites == gathered)
        }
        #expect(try PlainConnection(path).census() == (300, 900_000, "ok"))
    }

    /// A full disk while gathered frames are written out for a read, inside a statement SQLite then rolls
    /// back alone (`SQLITE_FULL` with a statement journal): the transaction goes on, but its dropped frames
    /// are missing from the WAL, so it must never commit. The next transaction commits.
    @Test func aFullDiskWhileWritingOutForAReadLeavesATransactionThatCannotCommit() throws {
        GatheringWAL.registerAsDefault()
        let path = try temporaryPath()
        defer { removeDirectory(of: path) }
        let connection = try PlainConnection(path, readOnly: false, vfs: nil)
        try connection.execute(
            """
            PRAGMA journal_mode = WAL; PRAGMA cache_size = 10;
            CREATE TABLE t (id INTEGER PRIMARY KEY, data BLOB NOT NULL); CREATE TABLE u (id INTEGER PRIMARY KEY, data BLOB NOT NULL);
            INSERT INTO t (data) VALUES (zeroblob(10))
            """)
        for round in 0..<3 {
            try connection.execute(
                """
                BEGIN IMMEDIATE;
                WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200) INSERT INTO t (data) SELECT randomblob(3000) FROM n
                """)
            GatheringWAL.watch(path + "-wal", failAfter: 0, failure: SQLITE_FULL)
            // Reads the pages spilled last, still gathered, and writes a few small rows.
            #expect(throws: DatabaseError.self, "round \(round): the statement's read failed") {
                try connection.execute("INSERT INTO u (data) SELECT length(data) FROM t ORDER BY id DESC")
            }
            #expect(GatheringWAL.watched(path + "-wal").failAfter == nil, "round \(round): the failure was injected")
            #expect(throws: DatabaseError.self, "round \(round): the transaction committed without frames it wrote") {
                try connection.execute("COMMIT")
            }
            if sqlite3_get_autocommit(connection.handle) == 0 { try connection.execute("ROLLBACK") }
            #expect(try PlainConnection(path).census() == (1, 10, "ok"), "round \(round)")
            #expect(try census(ofCopy: path) == (1, 10, "ok"), "round \(round)")
        }
        try connection.execute("INSERT INTO u (data) VALUES (zeroblob(10))")
        #expect(try PlainConnection(path).row("SELECT count(*) FROM u").first == 1)
    }

    /// A transaction larger than the page cache spills frames into the WAL before it commits, and writes
    /// some of those pages again; at commit SQLite rewrites the checksums of the frames after the first
    /// one written again, the commit frame's last. At NORMAL nothing syncs: those rewritten headers must
    /// be in the file when the commit returns, or a crash recovers none of the transaction.
    @Test func rewrittenFramesAreInTheFileWhenTheCommitReturns() throws {
        let path = try temporaryPath()
        defer { removeDirectory(of: path) }
        let pool = try openPool(path, synchronous: "NORMAL")
        try pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA cache_size = 10") }
        var rows: Int64 = 0, bytes: Int64 = 0
        for round in 0..<6 {
            try pool.write { db in
                for _ in 0..<200 { try db.execute(sql: "INSERT INTO t (data) VALUES (?)", arguments: [Data(repeating: 7, count: 900)]) }
                // The first rows' pages went to the WAL long ago; written again, in place in their frames.
                try db.execute(sql: "UPDATE t SET data = zeroblob(1000) WHERE id IN (SELECT id FROM t ORDER BY id DESC LIMIT 10 OFFSET 190)")
                try db.execute(sql: "INSERT INTO t (data) VALUES (?)", arguments: [Data(repeating: 8, count: 50)])
            }
            rows += 201
            bytes += 200 * 900 + 10 * 100 + 50
            let recovered = try census(ofCopy: path)
            #expect(recovered.rows == rows && recovered.bytes == bytes && recovered.integrity == "ok", "round \(round): \(recovered)")
        }
    }

    /// A transaction larger than the page cache spills frames into the WAL before it commits; rolled back,
    /// none of them may be read, and the next commit writes over them.
    @Test func aRolledBackTransactionsSpilledFramesNeverCount() throws {
        let path = try temporaryPath()
        defer { removeDirectory(of: path) }
        let pool = try openPool(path)
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
        #expect(try PlainConnection(path).census() == (15, 1_500, "ok"))
        #expect(try census(ofCopy: path) == (15, 1_500, "ok"))
        let count = try pool.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM t") }
        #expect(count == 15)
    }

    /// A rolled-back transaction leaves frames gathered; another writer then commits frames at the same
    /// places in the WAL. The first connection reads those places and writes on: the other writer's
    /// commits must stay as they were committed (the gathered frames were dropped when the rolled-back
    /// transaction released the write lock, not written over them).
    @Test func anotherWritersCommitsAreNeverOverwrittenByARolledBackTransactionsFrames() throws {
        let path = try temporaryPath()
        defer { removeDirectory(of: path) }
        let pool = try openPool(path)
        try pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA cache_size = 10") }
        let other = try PlainConnection(path, readOnly: false)
        struct Abandoned: Error {}
        var rows: Int64 = 0, bytes: Int64 = 0
        for round in 0..<5 {
            #expect(throws: Abandoned.self) {
                try pool.write { db in
                    // Spilled frames, the last few dozen still gathered when the transaction rolls back.
                    for _ in 0..<(40 + round * 7) {
                        try db.execute(sql: "INSERT INTO t (data) VALUES (?)", arguments: [Data(repeating: 0x45, count: 3_000)])
                    }
                    throw Abandoned()
                }
            }
            // The other writer's transaction, as large: its frames land where the abandoned ones were.
            try other.execute(
                """
                BEGIN IMMEDIATE;
                WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(40 + round * 7))
                INSERT INTO t (data) SELECT zeroblob(3000) FROM n;
                COMMIT
                """)
            rows += Int64(40 + round * 7)
            bytes += Int64(3_000 * (40 + round * 7))
            // The connection that gathered reads the other writer's rows, from where its frames were gathered,
            // then commits.
            let seen = try pool.writeWithoutTransaction { db in
                try Row.fetchOne(db, sql: "SELECT count(*), sum(length(data)), (SELECT count(*) FROM t WHERE unicode(data) = 69) FROM t")
            }
            #expect(seen?[0] == rows && seen?[1] == bytes && seen?[2] == 0 as Int64, "round \(round)")
            try pool.write { db in try db.execute(sql: "INSERT INTO t (data) VALUES (?)", arguments: [Data(repeating: 1, count: 10)]) }
            rows += 1
            bytes += 10
            #expect(try other.census() == (rows, bytes, "ok"), "round \(round)")
            #expect(try census(ofCopy: path) == (rows, bytes, "ok"), "round \(round)")
        }
        #expect(try other.row("SELECT count(*) FROM t WHERE unicode(data) = 69").first == 0)
    }

    /// A gathered write that fails fails the commit (or the statement that spilled); the transaction rolls
    /// back, nothing of it is in the file or ever written later, and the next transaction commits.
    /// `failAfter` 0: the first gathered write fails (a small transaction's commit, a large one's first
    /// spill); 2: a later spill's.
    @Test(arguments: [0, 2])
    func aFailedWriteFailsItsTransactionAndNothingOfItIsWrittenLater(failAfter: Int) throws {
        let path = try temporaryPath()
        defer { removeDirectory(of: path) }
        let pool = try openPool(path)
        try pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA cache_size = 10") }
        try pool.write { db in try db.execute(sql: "INSERT INTO t (data) VALUES (?)", arguments: [Data(repeating: 1, count: 100)]) }
        var rows: Int64 = 1, bytes: Int64 = 100
        for round in 0..<4 {
            let large = round % 2 == 1 || failAfter > 0
            GatheringWAL.watch(path + "-wal", failAfter: failAfter)
            do {
                try pool.write { db in
                    for _ in 0..<(large ? 150 : 1) {
                        try db.execute(sql: "INSERT INTO t (data) VALUES (?)", arguments: [Data(repeating: 0x45, count: large ? 3_000 : 20)])
                    }
                }
                Issue.record("round \(round): the transaction committed though a write of its frames failed")
            } catch let error as DatabaseError {
                #expect(error.resultCode == .SQLITE_IOERR, "round \(round): \(error)")
            }
            #expect(GatheringWAL.watched(path + "-wal").failAfter == nil, "round \(round): the failure was injected")
            // The next transaction commits, and the database holds exactly the committed ones.
            try pool.write { db in
                for _ in 0..<(large ? 60 : 1) { try db.execute(sql: "INSERT INTO t (data) VALUES (?)", arguments: [Data(repeating: 2, count: 2_000)]) }
            }
            rows += large ? 60 : 1
            bytes += large ? 120_000 : 2_000
            #expect(try PlainConnection(path).census() == (rows, bytes, "ok"), "round \(round)")
            #expect(try census(ofCopy: path) == (rows, bytes, "ok"), "round \(round)")
        }
        let count = try pool.read { db in try Int64.fetchOne(db, sql: "SELECT count(*) FROM t WHERE unicode(data) = 69") }
        #expect(count == 0)
    }

    /// Where SQLite pads a commit's frames to a sector boundary (the database file lacks powersafe
    /// overwrite: `psow=0`) and may write part of a frame after its sync, nothing is gathered; with it
    /// (the default), the same writes are.
    @Test(arguments: [false, true])
    func aWALIsGatheredOnlyWithPowersafeOverwrite(powersafe: Bool) throws {
        GatheringWAL.registerAsDefault()
        let path = try temporaryPath()
        defer { removeDirectory(of: path) }
        GatheringWAL.watch(path + "-wal")
        var opened: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI
        #expect(sqlite3_open_v2("file:\(path)?psow=\(powersafe ? 1 : 0)", &opened, flags, nil) == SQLITE_OK)
        let handle = try #require(opened)
        defer { sqlite3_close_v2(handle) }
        func execute(_ sql: String) {
            #expect(sqlite3_exec(handle, sql, nil, nil, nil) == SQLITE_OK, "\(sql): \(String(cString: sqlite3_errmsg(handle)))")
        }
        execute("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; CREATE TABLE t (id INTEGER PRIMARY KEY, data BLOB NOT NULL)")
        for _ in 0..<20 {
            execute(
                """
                BEGIN IMMEDIATE;
                WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5) INSERT INTO t (data) SELECT zeroblob(2000) FROM n;
                COMMIT
                """)
        }
        #expect((GatheringWAL.watched(path + "-wal").gatheredWrites > 0) == powersafe)
        #expect(try PlainConnection(path).census() == (100, 200_000, "ok"))
        #expect(try census(ofCopy: path) == (100, 200_000, "ok"))
    }

    /// Two processes write the same database through the VFS at NORMAL, spilling, committing and rolling
    /// back, and are killed with SIGKILL at random points, three times over. Every commit either printed is
    /// there whole, no rolled-back row is, and the database is whole.
    @Test func twoWritersKilledAtRandomPointsLoseNoCommit() async throws {
        let bench = try #require(EmbeddedLogTests.bench, "the revenue-relay-bench executable was not built next to the tests")
        let path = try temporaryPath()
        defer { removeDirectory(of: path) }
        // Made here, so the two children never both make it (and set its journal mode) at once.
        try PlainConnection(path, readOnly: false).execute(
            "PRAGMA journal_mode = WAL; CREATE TABLE t (id INTEGER PRIMARY KEY, tag TEXT NOT NULL, data BLOB NOT NULL)")
        var committed: [String: Int64] = [:]
        var rolledBack = Set<String>()
        for round in 0..<3 {
            let delays = (Int.random(in: 300...900), Int.random(in: 300...900))
            async let first = runChildProcess(
                bench, ["sqlite-crash-child", "--database", path, "--writer", "a\(round)", "--die-after-ms", "\(delays.0)"])
            async let second = runChildProcess(
                bench, ["sqlite-crash-child", "--database", path, "--writer", "b\(round)", "--die-after-ms", "\(delays.1)"])
            for result in try await [first, second] {
                #expect(result.status == 128 + SIGKILL, "round \(round) (killed after \(delays) ms) ended by SIGKILL: \(result.stderr)")
                for line in result.stdoutText.split(separator: "\n") {
                    let parts = line.split(separator: " ")
                    if parts.count == 3, parts[0] == "c", let count = Int64(parts[2]) { committed[String(parts[1])] = count }
                    if parts.count == 2, parts[0] == "r" { rolledBack.insert(String(parts[1])) }
                }
            }
        }
        #expect(committed.count > 20 && rolledBack.count > 2, "both writers committed and rolled back: \(committed.count), \(rolledBack.count)")
        let plain = try PlainConnection(path, readOnly: false)
        #expect(try plain.row("PRAGMA integrity_check").text == "ok")
        var counts: [String: Int64] = [:]
        var statement: OpaquePointer?
        #expect(sqlite3_prepare_v2(plain.handle, "SELECT tag, count(*) FROM t GROUP BY tag", -1, &statement, nil) == SQLITE_OK)
        while sqlite3_step(statement) == SQLITE_ROW {
            counts[String(cString: sqlite3_column_text(statement, 0))] = sqlite3_column_int64(statement, 1)
        }
        sqlite3_finalize(statement)
        let lost = committed.filter { counts[$0.key] != $0.value }
        #expect(lost.isEmpty, "\(lost.count) of \(committed.count) printed commits missing or partial, e.g. \(lost.prefix(3))")
        let revived = rolledBack.filter { counts[$0] != nil }
        #expect(revived.isEmpty, "rolled-back transactions present: \(revived.prefix(3))")
    }
}
