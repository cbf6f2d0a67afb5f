import ArgumentParser
import Foundation
import GRDB
import RelayCore
import RelaySQLite

/// For the gathering WAL's crash test (not a benchmark): writes transactions to a SQLite database through
/// the relay's VFS at `synchronous = NORMAL`, beside other writers in other processes, and kills itself with
/// SIGKILL after `--die-after-ms` milliseconds, wherever it is then.
///
/// Each transaction inserts rows tagged `<writer>-<n>`: one small row, or enough large ones to spill frames
/// into the WAL before the commit (the page cache is ten pages). It prints `c <tag> <rows>` once a commit
/// returned, and `r <tag>` once a transaction that spilled was rolled back. Afterwards every printed
/// commit must be in the database whole, and no rolled-back row.
struct SQLiteCrashChild: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "sqlite-crash-child", abstract: "Crash-test child of the gathering WAL.")

    @Option var database: String
    @Option(help: "This writer's name, in its rows' tags.") var writer: String
    @Option(help: "SIGKILL after this many milliseconds.") var dieAfterMs: Int

    struct Abandoned: Error {}

    func run() throws {
        let pool = try DurableSQLite.openPool(path: database, busyTimeout: 10)
        try pool.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL; PRAGMA cache_size = 10")
            try db.execute(sql: "CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, tag TEXT NOT NULL, data BLOB NOT NULL)")
        }
        let dieAfterMs = dieAfterMs
        startDedicatedThread(named: "killer") {
            Thread.sleep(forTimeInterval: Double(dieAfterMs) / 1000)
            kill(getpid(), SIGKILL)
        }
        let output = FileHandle.standardOutput
        var generator = SystemRandomNumberGenerator()
        for number in 0... {
            let tag = "\(writer)-\(number)"
            let rows = number % 3 == 0 ? 1 : Int.random(in: 20...80, using: &generator)
            let abandon = rows > 1 && number % 4 == 1
            do {
                try pool.write { db in
                    for _ in 0..<rows {
                        let size = rows == 1 ? 8 : Int.random(in: 1_000...6_000, using: &generator)
                        try db.execute(sql: "INSERT INTO t (tag, data) VALUES (?, ?)", arguments: [tag, Data(repeating: UInt8(number % 251), count: size)])
                    }
                    if abandon { throw Abandoned() }
                }
                output.write(Data("c \(tag) \(rows)\n".utf8))
            } catch is Abandoned {
                output.write(Data("r \(tag)\n".utf8))
            }
        }
    }
}
