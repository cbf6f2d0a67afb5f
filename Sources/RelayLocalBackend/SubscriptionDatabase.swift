public import CoreMetrics
import Foundation
import GRDB
import Logging
import RelaySQLite
import Synchronization
public import RelayCore

/// The local backend's SQLite databases (GRDB, WAL): in `backend.database`, one row per subscription
/// holding its state as JSON with its version, the users each subscription belongs to, and the users'
/// aliases, attributes and redemption codes; beside it (`eventsPath(forBackend:)`), the events store and
/// the delivery log. Migrations run at open.
///
/// Two files, so two writers: the events recorder's batches (about 50 events and 50 attempts every
/// 50 ms at 500 notifications/s, 20–29 ms each on two busy cores) held the one writer the worker's state
/// writes wait for, and every webhook behind them waited as long (docs/benchmarks.md, *Where the p99 at
/// 0.03 V comes from*). A store created before the split has those tables moved into the new file at its
/// first open (`moveEvents`).
///
/// Durability: WAL with `synchronous=FULL`, so a write that returned survives `kill -9` and power loss.
/// Concurrent writes are group-committed (one transaction, one fsync, for every write waiting when the
/// writer gets to them), each still checked against its own `If-Match` version in order.
public final class SubscriptionDatabase: Sendable {
    /// The subscriptions, users, aliases, attributes and redemption codes.
    let pool: DatabasePool
    /// The events store (`EventStore`) and the delivery log (`DeliveryLog`): their writer is not the state's.
    let eventsPool: DatabasePool
    private let checkpointer: WALCheckpointer
    private let eventsCheckpointer: WALCheckpointer
    private let writes = Mutex(WriteQueue())
    private let writer = DispatchQueue(label: "backend-writer")

    private struct PendingWrite {
        var state: SubscriptionState
        var ifMatch: Int64
        var continuation: CheckedContinuation<WriteOutcome, any Error>
    }

    private struct WriteQueue {
        var pending: [PendingWrite] = []
        var draining = false
        /// When the last batch's commit started (`pacing`).
        var lastCommit: ContinuousClock.Instant?
    }

    /// The shortest time from one state commit's start to the next (`backend.commitInterval`).
    private let pacing: CommitPacing
    /// `relay_backend_state_commits_total` and `relay_backend_state_writes_total`: transactions of state writes,
    /// and the writes they carried (writes per commit shows the pacing).
    private let commits: Counter
    private let committedWrites: Counter

    /// Opens (creating if needed) the database at `path` and the events file beside it, and migrates them,
    /// moving a store's events tables from before the split into the events file (`moveEvents`).
    /// - Parameters:
    ///   - commitInterval: the shortest time from one commit of state writes to the next (`CommitPacing`).
    ///   - metrics: where `relay_backend_state_commits_total` and `relay_backend_state_writes_total` are counted.
    public init(path: String, commitInterval: Duration = CommitPacing.defaultInterval, metrics: any MetricsFactory = MetricsSystem.factory) throws {
        let directory = URL(fileURLWithPath: path).deletingLastPathComponent()
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let logger = Logger(label: "revenue-relay")
        // WAL with synced commits, checkpointed beside them (a write never waits for a checkpoint).
        let pool = try DurableSQLite.openPool(path: path, busyTimeout: 10)
        let checkpointer = try WALCheckpointer(path: path, logger: logger)
        let eventsPath = Self.eventsPath(forBackend: path)
        let events: (pool: DatabasePool, checkpointer: WALCheckpointer)
        do {
            // Until the move has run (a new database, or one from before it), the migrations stop short of it: the
            // events tables they create in `backend.database`, with or without rows, are copied into the events
            // file, and the last migration drops them. (Migrating up to a migration already passed is a fatal
            // error in GRDB, so this is asked first. One process opens the file: the tools use the routes.)
            let moved = try pool.read { db in try Self.migrator.appliedIdentifiers(db).contains(Self.eventsMovedMigration) }
            if !moved { try Self.migrator.migrate(pool, upTo: Self.lastMigrationWithEvents) }
            let eventsPool = try DurableSQLite.openPool(path: eventsPath, busyTimeout: 10)
            let eventsCheckpointer = try WALCheckpointer(path: eventsPath, logger: logger)
            do {
                try Self.eventsMigrator.migrate(eventsPool)
                if moved {
                    // An events file made anew after the move (lost, or moved aside) is never a move's target.
                    try eventsPool.writeWithoutTransaction { db in
                        if try Int.fetchOne(db, sql: "PRAGMA user_version") == 0 { try db.execute(sql: "PRAGMA user_version = 1") }
                    }
                } else {
                    try Self.moveEvents(from: path, into: eventsPool, logger: logger)
                }
                try Self.migrator.migrate(pool)
            } catch {
                eventsCheckpointer.stop()
                throw error
            }
            events = (eventsPool, eventsCheckpointer)
        } catch {
            checkpointer.stop()
            throw error
        }
        self.pool = pool
        self.pacing = CommitPacing(interval: commitInterval)
        commits = Counter(label: "relay_backend_state_commits_total", dimensions: [], factory: metrics)
        committedWrites = Counter(label: "relay_backend_state_writes_total", dimensions: [], factory: metrics)
        self.checkpointer = checkpointer
        eventsPool = events.pool
        eventsCheckpointer = events.checkpointer
    }

    deinit {
        checkpointer.stop()
        eventsCheckpointer.stop()
    }

    /// The events store's file for the backend database at `path`: `backend.sqlite` → `backend-events.sqlite`
    /// (any other name: `<path>-events`).
    public static func eventsPath(forBackend path: String) -> String {
        path.hasSuffix(".sqlite") ? String(path.dropLast(".sqlite".count)) + "-events.sqlite" : path + "-events"
    }

    /// The tables that moved into the events file: the two that grow, then the two small ones.
    static let eventsTables = ["event", "delivery_attempt", "endpoint_status", "delivery_resend"]
    static let lastMigrationWithEvents = "v9: endpoint health, status and resends"
    static let eventsMovedMigration = "v10: the events store and the delivery log in a file of their own"
    /// Rows of `event` or `delivery_attempt` per commit of the move.
    static let moveBatch = 20_000

    /// Why the events tables could not be moved into their own file; nothing was dropped.
    public struct EventsMoveError: Error, CustomStringConvertible {
        public var description: String
    }

    /// Copies the events tables' rows from the backend database at `path` into the events file (opened and
    /// migrated), unless a move already finished (its `user_version` is 1).
    ///
    /// `event` and `delivery_attempt` go in batches of `batch` rows, each its own commit, in the order of their
    /// numbers (`seq`, kept): a move cut short (a crash, a startup probe's kill) goes on after the last row it
    /// committed, once it has checked that every backend row below that one is in the file. The small tables,
    /// `event`'s AUTOINCREMENT counter (so a recorded event never reuses a number the events routes' cursors
    /// handed out) and the mark go in the last commit. Then migration v10 drops the tables from the backend
    /// database; a crash before that repeats no copy, only a check that the backend holds nothing the file
    /// lacks (one read of both tables, as the drop is).
    static func moveEvents(from path: String, into eventsPool: DatabasePool, logger: Logger, batch: Int = moveBatch) throws {
        try eventsPool.writeWithoutTransaction { db in
            try db.execute(sql: "ATTACH DATABASE ? AS backend", arguments: [path])
            defer { try? db.execute(sql: "DETACH DATABASE backend") }
            func marked() throws -> Bool { try Int.fetchOne(db, sql: "PRAGMA main.user_version") != 0 }
            func count(_ sql: String, _ arguments: StatementArguments = []) throws -> Int { try Int.fetchOne(db, sql: sql, arguments: arguments) ?? 0 }
            func columns(_ table: String) throws -> String {
                // By name: a table that grew by ALTER TABLE has its columns in the same order in both files (the same
                // statements made them), but the copy does not rely on it.
                try String.fetchAll(db, sql: "SELECT name FROM pragma_table_info(?, 'backend')", arguments: [table])
                    .map { "\"\($0)\"" }.joined(separator: ", ")
            }
            let eventsFile = eventsPath(forBackend: path)
            let aside = """
                move \(eventsFile) (and its -wal and -shm files) aside and start again: the backend's rows are copied anew, and what \
                the file set aside recorded is not merged back
                """
            if try marked() {
                // Moved already, and the backend's tables not yet dropped: a crash in between, unless an older version
                // (gone back to) has recorded in them since, which dropping them would lose. (An endpoint's status is
                // reported again by the deliverers; the rest is checked.)
                let lacking = try count("SELECT count(*) FROM backend.event WHERE id NOT IN (SELECT id FROM main.event)")
                    + count("SELECT count(*) FROM backend.delivery_attempt WHERE id NOT IN (SELECT id FROM main.delivery_attempt)")
                    + count(
                        """
                        SELECT count(*) FROM backend.delivery_resend r WHERE NOT EXISTS (SELECT 1 FROM main.delivery_resend m
                            WHERE m.failure_id = r.failure_id AND m.replayed_from = r.replayed_from)
                        """)
                guard lacking == 0 else {
                    throw EventsMoveError(
                        description: """
                            \(path) holds \(lacking) events, delivery attempts or resend marks that \(eventsFile) lacks, though a move into \
                            it finished (a version without that file recorded them since, or \(path) was restored alone); to keep them, \(aside)
                            """)
                }
                return
            }
            let total = try count("SELECT count(*) FROM backend.event") + count("SELECT count(*) FROM backend.delivery_attempt")
            if total > 0 { logger.info("moving the events store and the delivery log into their own file", metadata: ["rows": "\(total)"]) }
            for table in ["event", "delivery_attempt"] {
                let list = try columns(table)
                // Once a start, before going on: every row of the backend up to where an earlier start stopped must be in
                // the file, or going on would skip it (a file not of this store's move, or rows an older version added).
                let resumed = try Int64.fetchOne(db, sql: "SELECT max(seq) FROM main.\(table)") ?? 0
                if resumed > 0 {
                    let lacking = try count(
                        "SELECT count(*) FROM backend.\(table) WHERE seq <= ? AND id NOT IN (SELECT id FROM main.\(table))", [resumed])
                    guard lacking == 0 else {
                        throw EventsMoveError(
                            description: "\(eventsFile) lacks \(lacking) \(table) rows of \(path) below the ones it holds, so a move cannot go on: \(aside)")
                    }
                }
                while true {
                    var copied = 0
                    try db.inTransaction(.immediate) {
                        let after = try Int64.fetchOne(db, sql: "SELECT max(seq) FROM main.\(table)") ?? 0
                        try db.execute(
                            sql: "INSERT INTO main.\(table) (\(list)) SELECT \(list) FROM backend.\(table) WHERE seq > ? ORDER BY seq LIMIT ?",
                            arguments: [after, batch])
                        copied = db.changesCount
                        return .commit
                    }
                    guard copied > 0 else { break }
                }
            }
            try db.inTransaction(.immediate) {
                guard try !marked() else { return .commit }
                for table in ["endpoint_status", "delivery_resend"] {
                    let list = try columns(table)
                    try db.execute(sql: "INSERT INTO main.\(table) (\(list)) SELECT \(list) FROM backend.\(table)")
                }
                if let counter = try Int64.fetchOne(db, sql: "SELECT seq FROM backend.sqlite_sequence WHERE name = 'event'") {
                    try db.execute(sql: "UPDATE main.sqlite_sequence SET seq = max(seq, ?) WHERE name = 'event'", arguments: [counter])
                    if db.changesCount == 0 {
                        try db.execute(sql: "INSERT INTO main.sqlite_sequence (name, seq) VALUES ('event', ?)", arguments: [counter])
                    }
                }
                try db.execute(sql: "PRAGMA main.user_version = 1")
                return .commit
            }
            if total > 0 {
                // The WAL keeps the size the copy gave it (up to the backstop's 40 MiB and a batch) unless truncated.
                let busy = (try? Int.fetchOne(db, sql: "PRAGMA main.wal_checkpoint(TRUNCATE)")) ?? 1
                if busy != 0 { logger.info("the events file's WAL could not be truncated after the move; the checkpoints keep it bounded") }
                logger.info("moved the events store and the delivery log into their own file", metadata: ["rows": "\(total)"])
            }
        }
    }

    public func subscription(store: Store, originalTransactionId: String) async throws -> SubscriptionState? {
        try await pool.read { db in try Self.fetch(db, store: store.rawValue, id: originalTransactionId) }
    }

    /// Whether both writers' commits are fsynced (`synchronous` is FULL).
    public func commitsAreSynced() throws -> Bool {
        try DurableSQLite.synchronousLevel(pool) == 2 && DurableSQLite.synchronousLevel(eventsPool) == 2
    }

    public enum WriteOutcome: Sendable, Equatable {
        /// Stored with the next version.
        case written(SubscriptionState)
        /// `ifMatch` is not the stored version (someone else wrote first); the current state, if any.
        case versionMismatch(current: SubscriptionState?)
        /// The state is older (by `sourceTimestamp`) than the stored one, which stays.
        case stale(current: SubscriptionState)
    }

    /// Writes `state` if the stored version is `ifMatch` (0: none stored yet) and it does not go back in
    /// source time. Checked and written in one transaction, so concurrent writers never lose an update;
    /// returns once the transaction is durable.
    public func write(_ state: SubscriptionState, ifMatch: Int64) async throws -> WriteOutcome {
        try await withCheckedThrowingContinuation { continuation in
            let start = writes.withLock { queue -> Bool in
                queue.pending.append(PendingWrite(state: state, ifMatch: ifMatch, continuation: continuation))
                defer { queue.draining = true }
                return !queue.draining
            }
            if start { writer.async { [self] in drainWrites() } }
        }
    }

    /// Commits what is waiting, batch after batch, until nothing is (on the writer queue, off Swift's pool). A
    /// batch that comes sooner than `pacing` allows after the last commit is taken when the interval is over,
    /// with what came meanwhile: the queue is free until then, and still draining (writes only join the batch).
    private func drainWrites() {
        while true {
            let now = ContinuousClock.now
            let (batch, wait) = writes.withLock { queue -> ([PendingWrite], Duration?) in
                if queue.pending.isEmpty {
                    queue.draining = false
                    return ([], nil)
                }
                if let wait = pacing.wait(after: queue.lastCommit, now: now) { return ([], wait) }
                queue.lastCommit = now
                defer { queue.pending = [] }
                return (queue.pending, nil)
            }
            if let wait {
                writer.asyncAfter(deadline: .now() + .nanoseconds(Int(wait.wholeNanoseconds))) { [self] in drainWrites() }
                return
            }
            guard !batch.isEmpty else { return }
            do {
                let outcomes = try pool.write { db in
                    // Each write in its own savepoint: one that fails (refused, and the stored row it must name
                    // no longer decodes) is rolled back and answered alone, and the others still commit.
                    batch.map { write -> Result<WriteOutcome, any Error> in
                        Result { try CachedTransactions.savepoint(db) { try Self.apply(write.state, ifMatch: write.ifMatch, in: db) } }
                    }
                }
                commits.increment()
                committedWrites.increment(by: batch.count)
                for (write, outcome) in zip(batch, outcomes) { write.continuation.resume(with: outcome) }
            } catch {
                // The transaction itself failed (the disk): none of them was written.
                for write in batch { write.continuation.resume(throwing: error) }
            }
        }
    }

    private static func apply(_ state: SubscriptionState, ifMatch: Int64, in db: Database) throws -> WriteOutcome {
        let store = state.store.rawValue, id = state.originalTransactionId
        // The stored version and source time are columns: the state itself (kilobytes of JSON) is decoded only
        // to answer a refused write, never on the single writer's path of a write that goes through.
        // Read and written with SQLite's C calls (DirectRead, DirectWrite): this runs for every notification.
        var stored: (version: Int64, sourceTimestamp: Int64)?
        try DirectRead(db.cachedStatement(sql: "SELECT version, source_timestamp FROM subscription WHERE store = ? AND original_transaction_id = ?"))
            .forEach { parameters in
                parameters.text(store)
                parameters.text(id)
            } row: { columns in
                stored = (columns.int64(0), columns.int64(1))
            }
        let storedVersion = stored?.version ?? 0
        guard storedVersion == ifMatch else { return .versionMismatch(current: try fetch(db, store: store, id: id)) }
        if let stored, state.sourceTimestamp < stored.sourceTimestamp {
            guard let current = try fetch(db, store: store, id: id) else { throw DatabaseError(message: "subscription \(store)/\(id) vanished mid-transaction") }
            return .stale(current: current)
        }
        var next = state
        next.version = ifMatch + 1
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        // Cached statements: this runs for every notification, and preparing SQL costs more than running it. Run
        // with SQLite's C calls (DirectWrite), the state's JSON bound as the serializer wrote it (UTF-8).
        let serialized = next.serialized()
        try DirectWrite(
            db.cachedStatement(
                sql: """
                    INSERT INTO subscription (store, original_transaction_id, version, source_timestamp, state, updated_at)
                    VALUES (?, ?, ?, ?, ?, ?)
                    ON CONFLICT (store, original_transaction_id) DO UPDATE SET
                        version = excluded.version, source_timestamp = excluded.source_timestamp,
                        state = excluded.state, updated_at = excluded.updated_at
                    """)
        ).execute { parameters in
            parameters.text(store)
            parameters.text(id)
            parameters.int64(next.version)
            parameters.int64(next.sourceTimestamp)
            parameters.text(utf8: serialized)
            parameters.int64(now)
        }
        // The users it entitles, rewritten only when they change (a renewal keeps them): every row of
        // subscription_user and its index is a page of the WAL, and their keys are random.
        let users = next.entitlementUserIds
        var previous: [String] = []
        if stored != nil {
            try DirectRead(db.cachedStatement(sql: "SELECT app_user_id FROM subscription_user WHERE store = ? AND original_transaction_id = ?"))
                .forEach { parameters in
                    parameters.text(store)
                    parameters.text(id)
                } row: { columns in
                    if let user = columns.text(0) { previous.append(user) }
                }
        }
        // Compared as bytes, as SQLite compares them (Swift's == equates canonically equivalent strings).
        if Set(previous.map { Array($0.utf8) }) != Set(users.map { Array($0.utf8) }) {
            try db.cachedStatement(sql: "DELETE FROM subscription_user WHERE store = ? AND original_transaction_id = ?").execute(arguments: [store, id])
            let insert = DirectWrite(
                try db.cachedStatement(sql: "INSERT OR IGNORE INTO subscription_user (app_user_id, store, original_transaction_id) VALUES (?, ?, ?)"))
            for user in users {
                try insert.execute { parameters in
                    parameters.text(user)
                    parameters.text(store)
                    parameters.text(id)
                }
            }
        }
        return .written(next)
    }

    /// Every subscription of one user, but the one `excluding` names (not even decoded).
    public func subscriptions(ofUser appUserId: String, excluding: (store: Store, originalTransactionId: String)? = nil) async throws
        -> [SubscriptionState]
    {
        try await pool.read { db in try Self.subscriptions(db, ofUser: appUserId, excluding: excluding) }
    }

    static func subscriptions(_ db: Database, ofUser appUserId: String, excluding: (store: Store, originalTransactionId: String)?) throws
        -> [SubscriptionState]
    {
        // With SQLite's C calls (DirectRead): the worker reads a user's other subscriptions for each notification.
        var states: [SubscriptionState] = []
        try DirectRead(
            db.cachedStatement(
                sql: """
                    SELECT s.state FROM subscription_user u
                    JOIN subscription s ON s.store = u.store AND s.original_transaction_id = u.original_transaction_id
                    WHERE u.app_user_id = ? AND NOT (s.store = ? AND s.original_transaction_id = ?)
                    ORDER BY s.store, s.original_transaction_id
                    """)
        ).forEach { parameters in
            parameters.text(appUserId)
            parameters.text(excluding?.store.rawValue ?? "")
            parameters.text(excluding?.originalTransactionId ?? "")
        } row: { columns in
            states.append(try decode(columns.textBytes(0) ?? []))
        }
        return states
    }

    /// Every subscription of any of these users, each once (one that several of them own too), in one read.
    public func subscriptions(ofUsers appUserIds: [String]) async throws -> [SubscriptionState] {
        guard !appUserIds.isEmpty else { return [] }
        return try await pool.read { db in try Self.subscriptions(db, ofUsers: appUserIds) }
    }

    static func subscriptions(_ db: Database, ofUsers appUserIds: [String]) throws -> [SubscriptionState] {
        guard !appUserIds.isEmpty else { return [] }
        let rows = try Row.fetchAll(
            db.cachedStatement(
                sql: """
                    SELECT DISTINCT s.store, s.original_transaction_id, s.state FROM subscription_user u
                    JOIN subscription s ON s.store = u.store AND s.original_transaction_id = u.original_transaction_id
                    WHERE u.app_user_id IN (\(Array(repeating: "?", count: appUserIds.count).joined(separator: ", ")))
                    ORDER BY s.store, s.original_transaction_id
                    """),
            arguments: StatementArguments(appUserIds))
        return try rows.map { row in try decode(row[2]) }
    }

    /// One page of a store's subscriptions of one application that are active (a status that still
    /// grants or may regain access, or an expiry after `now`) or were written at or after `changedSince`
    /// (Unix ms; nil: active ones only), in storage order after `cursor` (a previous page's `next`): at
    /// most `limit` states and the cursor of the next page, nil at the end. One-time purchases (no auto
    /// renewal and no expiry: ACTIVE forever, and the store lists no subscription status for them) are
    /// never listed. Reads every row of the store (the application id is inside the state): meant for
    /// `reconcile`, not for a request per notification.
    public func subscriptions(
        store: Store, applicationId: Int, activeOrChangedSince changedSince: Int64?, now: Int64, after cursor: Int64?, limit: Int
    ) async throws -> (states: [SubscriptionState], next: Int64?) {
        try await pool.read { db in
            let rows = try Row.fetchAll(
                db,
                sql: """
                    SELECT rowid, state FROM subscription
                    WHERE store = ? AND rowid > ? AND json_extract(state, '$.applicationId') = ?
                      AND NOT (IFNULL(json_extract(state, '$.autoRenew'), 1) = 0 AND json_extract(state, '$.expiresAt') IS NULL)
                      AND (json_extract(state, '$.status') IN ('ACTIVE', 'IN_GRACE_PERIOD', 'IN_BILLING_RETRY', 'PAUSED')
                           OR json_extract(state, '$.expiresAt') > ? OR updated_at >= ?)
                    ORDER BY rowid LIMIT ?
                    """,
                arguments: [store.rawValue, cursor ?? 0, applicationId, now, changedSince ?? Int64.max, limit + 1])
            let page = rows.prefix(limit)
            let next: Int64? = rows.count > limit ? page.last?["rowid"] : nil
            return (try page.map { row in try Self.decode(row["state"]) }, next)
        }
    }

    static func fetch(_ db: Database, store: String, id: String) throws -> SubscriptionState? {
        // With SQLite's C calls (DirectRead): the worker's read of the state each notification changes.
        var state: SubscriptionState?
        try DirectRead(db.cachedStatement(sql: "SELECT state FROM subscription WHERE store = ? AND original_transaction_id = ?")).forEach {
            parameters in
            parameters.text(store)
            parameters.text(id)
        } row: { columns in
            state = try decode(columns.textBytes(0) ?? [])
        }
        return state
    }

    /// A stored state; its remembered contexts stay bytes until read (`SubscriptionState(serialized:)`).
    static func decode(_ text: String) throws -> SubscriptionState { try decode(Array(text.utf8)) }
    static func decode(_ bytes: [UInt8]) throws -> SubscriptionState { try SubscriptionState(serialized: bytes) }
}
