import Dispatch
public import GRDB
public import Logging
import RelayCore
import Synchronization

/// How the relay's SQLite databases (the embedded log, the local backend) are opened and checkpointed.
public enum DurableSQLite {
    /// Pages the WAL may grow to before a commit checkpoints it itself: a backstop, used only when the
    /// checkpointer falls behind (about 40 MiB).
    public static let backstopCheckpointPages = 10_000

    /// A WAL pool whose writer fsyncs every commit (`synchronous = FULL`, set after GRDB's WAL setup,
    /// which leaves NORMAL): a commit that returned survives `kill -9` and power loss. Commits do not
    /// checkpoint (copy the WAL into the database file and fsync it) unless the WAL passes the backstop:
    /// a `WALCheckpointer` does it beside them, so a commit never waits for a checkpoint. WALs are written
    /// through `GatheringWAL`, a few large writes per commit instead of two per page.
    public static func openPool(path: String, busyTimeout: Double) throws -> DatabasePool {
        GatheringWAL.registerAsDefault()
        var configuration = Configuration()
        configuration.busyMode = .timeout(busyTimeout)
        let pool = try DatabasePool(path: path, configuration: configuration)
        try pool.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA synchronous = FULL; PRAGMA wal_autocheckpoint = \(backstopCheckpointPages)")
        }
        return pool
    }

    /// The writer's `synchronous` level (2: FULL).
    public static func synchronousLevel(_ pool: DatabasePool) throws -> Int {
        try pool.writeWithoutTransaction { db in try Int.fetchOne(db, sql: "PRAGMA synchronous") ?? -1 }
    }
}

extension DatabaseWriter {
    /// `body` in one read transaction on the writer's connection, between its commits.
    ///
    /// For the hot path's small reads of what was just written (a log consumer that is caught up, the worker's
    /// state reads): a reader connection drops its whole page cache whenever another connection has
    /// committed, which under load is before nearly every read, and reads the pages it needs again from the
    /// WAL or the database file, while the writer's cache holds them. The read waits for a commit in
    /// progress and the writes wait for it, so large reads, and reads that answer people (the routes), stay
    /// on the readers (`read`).
    public func readBetweenCommits<T>(_ body: (Database) throws -> T) throws -> T {
        try writeWithoutTransaction { db in try inReadTransaction(db, body) }
    }

    /// `readBetweenCommits` from async code (it does not block a thread of Swift's pool).
    public func readBetweenCommits<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await writeWithoutTransaction { db in try inReadTransaction(db, body) }
    }
}

/// A deferred transaction, so that what `body` reads is one state of the database, whoever else writes it
/// (a tool in another process may append to the log).
private func inReadTransaction<T>(_ db: Database, _ body: (Database) throws -> T) throws -> T {
    try CachedTransactions.deferred(db, body)
}

/// Transactions and savepoints whose SQL comes from the connection's statement cache.
///
/// GRDB's `inTransaction` and `inSavepoint` prepare `BEGIN`, `COMMIT`, `SAVEPOINT` and `RELEASE` anew each
/// time: about 1% of the relay's CPU at saturation, for the log consumers' passes, the worker's reads and
/// the state writes' savepoints, each a few statements of real work. The statements run through GRDB as
/// any other (its observers see them). What GRDB's blocks add is done here too: a transaction SQLite rolled
/// back by itself (a full disk, an I/O error, an interrupt) is reported as aborted, never as committed (what
/// a body went on to run after it ran in autocommit: the hot path's read bodies only read); a savepoint that
/// cannot be rolled back to takes the whole transaction with it.
public enum CachedTransactions {
    /// `body` in a deferred transaction, committed when it returns; rolled back when it or the commit throws.
    public static func deferred<T>(_ db: Database, _ body: (Database) throws -> T) throws -> T {
        try db.cachedStatement(sql: "BEGIN DEFERRED TRANSACTION").execute()
        do {
            let result = try body(db)
            // Rolled back under the body (whose error it may have caught): what it read is not one state.
            guard db.isInsideTransaction else { throw aborted }
            try db.cachedStatement(sql: "COMMIT TRANSACTION").execute()
            return result
        } catch {
            try? db.rollback()
            throw error
        }
    }

    /// `body` in a savepoint inside the transaction in progress, released when it returns; rolled back to
    /// and released when it throws, leaving the rest of the transaction as it was. Throws SQLITE_ABORT when
    /// there is no transaction: one that SQLite rolled back by itself under an earlier savepoint's error
    /// fails every write after it, and its commit.
    public static func savepoint<T>(_ db: Database, _ body: () throws -> T) throws -> T {
        guard db.isInsideTransaction else { throw aborted }
        try db.cachedStatement(sql: "SAVEPOINT relay").execute()
        do {
            let result = try body()
            try db.cachedStatement(sql: "RELEASE SAVEPOINT relay").execute()
            return result
        } catch {
            if db.isInsideTransaction {
                do {
                    try db.cachedStatement(sql: "ROLLBACK TRANSACTION TO SAVEPOINT relay").execute()
                    try db.cachedStatement(sql: "RELEASE SAVEPOINT relay").execute()
                } catch {
                    // The failed write's changes cannot be taken back alone: take back the whole transaction,
                    // so that none of them is committed with the others. A transaction that cannot be rolled back
                    // either would commit them with the next writes: stop, as GRDB does with a transaction left
                    // open (a restart redelivers what was not committed).
                    try? db.rollback()
                    if db.isInsideTransaction { fatalError("a failed write's savepoint and its transaction could not be rolled back") }
                }
            }
            throw error
        }
    }

    private static var aborted: DatabaseError { DatabaseError(resultCode: .SQLITE_ABORT, message: "Transaction was aborted") }
}

/// Checkpoints a WAL database every `interval` on its own connection and thread (`PRAGMA
/// wal_checkpoint(PASSIVE)`: it copies what no reader still needs, and writers go on committing meanwhile).
///
/// Why: SQLite's automatic checkpoint runs inside the commit that crosses the threshold, so that commit
/// (and every append or state write queued behind it) waited for 4 MiB to be copied and the database
/// file fsynced. The end-to-end benchmark showed it as 100 ms – 1 s latency spikes in a third of its runs.
public final class WALCheckpointer: Sendable {
    private let stopped = Atomic(false)
    private let wake = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)

    public init(path: String, interval: Duration = .milliseconds(500), logger: Logger) throws {
        var configuration = Configuration()
        configuration.busyMode = .timeout(5)
        let connection = try DatabaseQueue(path: path, configuration: configuration)
        let milliseconds = Int(interval.components.seconds * 1000 + interval.components.attoseconds / 1_000_000_000_000_000)
        startDedicatedThread(named: "wal-checkpoint") { [self] in
            while !stopped.load(ordering: .acquiring) {
                _ = wake.wait(timeout: .now() + .milliseconds(max(1, milliseconds)))
                if stopped.load(ordering: .acquiring) { break }
                do {
                    try connection.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA wal_checkpoint(PASSIVE)") }
                } catch {
                    // The next round tries again; the commits' backstop bounds the WAL meanwhile.
                    logger.warning("checkpointing the SQLite WAL failed; trying again", metadata: [LogKey.error: "\(error)", "path": "\(path)"])
                }
            }
            finished.signal()
        }
    }

    /// Stops the thread after the checkpoint in progress, if any (blocking: for `deinit`).
    public func stop() {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        wake.signal()
        finished.wait()
    }

    /// Stops the thread after the checkpoint in progress, waiting off Swift's cooperative pool.
    public func stop() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            startDedicatedThread(named: "wal-stop") { [self] in
                stop()
                continuation.resume()
            }
        }
    }
}
