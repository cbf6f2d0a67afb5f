import Foundation
import GRDB
import Logging
import RelaySQLite
import Synchronization
public import RelayCore

/// The local backend's SQLite database (GRDB, WAL): one row per subscription holding its state as
/// JSON with its version, and the users each subscription belongs to. Migrations run at open.
///
/// Durability: WAL with `synchronous=FULL`, so a write that returned survives `kill -9` and power loss.
/// Concurrent writes are group-committed (one transaction, one fsync, for every write waiting when the
/// writer gets to them), each still checked against its own `If-Match` version in order.
public final class SubscriptionDatabase: Sendable {
    /// Shared with the events store (`EventStore`): one database, one writer.
    let pool: DatabasePool
    private let checkpointer: WALCheckpointer
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
    }

    /// Opens (creating if needed) the database at `path` and migrates it.
    public init(path: String) throws {
        let directory = URL(fileURLWithPath: path).deletingLastPathComponent()
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        // WAL with synced commits, checkpointed beside them (a write never waits for a checkpoint).
        pool = try DurableSQLite.openPool(path: path, busyTimeout: 10)
        checkpointer = try WALCheckpointer(path: path, logger: Logger(label: "revenue-relay"))
        try Self.migrator.migrate(pool)
    }

    deinit {
        checkpointer.stop()
    }

    private static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1: subscriptions and their users") { db in
            try db.execute(
                sql: """
                    CREATE TABLE subscription (
                        store TEXT NOT NULL,
                        original_transaction_id TEXT NOT NULL,
                        version INTEGER NOT NULL,
                        source_timestamp INTEGER NOT NULL,
                        state TEXT NOT NULL,
                        updated_at INTEGER NOT NULL,
                        PRIMARY KEY (store, original_transaction_id)
                    );
                    CREATE TABLE subscription_user (
                        app_user_id TEXT NOT NULL,
                        store TEXT NOT NULL,
                        original_transaction_id TEXT NOT NULL,
                        PRIMARY KEY (app_user_id, store, original_transaction_id)
                    );
                    CREATE INDEX subscription_user_by_subscription ON subscription_user (store, original_transaction_id);
                    """)
        }
        migrator.registerMigration("v2: the events store") { db in
            try EventStore.createSchema(db)
        }
        migrator.registerMigration("v3: an app's events in recorded order") { db in
            // Pages filtered by app alone sorted every event of the app for each page without it.
            try db.execute(sql: "CREATE INDEX event_by_app ON event (app, seq)")
        }
        migrator.registerMigration("v4: user aliases") { db in
            try createAliasSchema(db)
        }
        migrator.registerMigration("v5: user attributes") { db in
            try createAttributeSchema(db)
        }
        migrator.registerMigration("v6: promotional grants by their end") { db in
            try createGrantExpiryIndex(db)
        }
        migrator.registerMigration("v7: redemption codes") { db in
            try createRedemptionSchema(db)
        }
        migrator.registerMigration("v8: the delivery log") { db in
            try DeliveryLog.createSchema(db)
        }
        migrator.registerMigration("v9: endpoint health, status and resends") { db in
            try DeliveryLog.createHealthSchema(db)
        }
        return migrator
    }

    public func subscription(store: Store, originalTransactionId: String) async throws -> SubscriptionState? {
        try await pool.read { db in try Self.fetch(db, store: store.rawValue, id: originalTransactionId) }
    }

    /// Whether the writer's commits are fsynced (`synchronous` is FULL).
    public func commitsAreSynced() throws -> Bool {
        try DurableSQLite.synchronousLevel(pool) == 2
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

    /// Commits what is waiting, batch after batch, until nothing is (on the writer queue, off Swift's pool).
    private func drainWrites() {
        while true {
            let batch = writes.withLock { queue -> [PendingWrite] in
                defer { queue.pending = [] }
                if queue.pending.isEmpty { queue.draining = false }
                return queue.pending
            }
            guard !batch.isEmpty else { return }
            do {
                let outcomes = try pool.write { db in
                    // Each write in its own savepoint: one that fails (refused, and the stored row it must name
                    // no longer decodes) is rolled back and answered alone, and the others still commit.
                    batch.map { write -> Result<WriteOutcome, any Error> in
                        var outcome: WriteOutcome?
                        do {
                            try db.inSavepoint {
                                outcome = try Self.apply(write.state, ifMatch: write.ifMatch, in: db)
                                return .commit
                            }
                            return .success(outcome!)
                        } catch {
                            return .failure(error)
                        }
                    }
                }
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
        let stored = try Row.fetchOne(
            db.cachedStatement(sql: "SELECT version, source_timestamp FROM subscription WHERE store = ? AND original_transaction_id = ?"),
            arguments: [store, id])
        let storedVersion: Int64 = stored?["version"] ?? 0
        guard storedVersion == ifMatch else { return .versionMismatch(current: try fetch(db, store: store, id: id)) }
        if let stored, state.sourceTimestamp < stored["source_timestamp"] as Int64 {
            guard let current = try fetch(db, store: store, id: id) else { throw DatabaseError(message: "subscription \(store)/\(id) vanished mid-transaction") }
            return .stale(current: current)
        }
        var next = state
        next.version = ifMatch + 1
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        // Cached statements: this runs for every notification, and preparing SQL costs more than running it.
        try db.cachedStatement(
            sql: """
                INSERT INTO subscription (store, original_transaction_id, version, source_timestamp, state, updated_at)
                VALUES (?, ?, ?, ?, ?, ?)
                ON CONFLICT (store, original_transaction_id) DO UPDATE SET
                    version = excluded.version, source_timestamp = excluded.source_timestamp,
                    state = excluded.state, updated_at = excluded.updated_at
                """
        ).execute(arguments: [store, id, next.version, next.sourceTimestamp, String(decoding: next.serialized(), as: UTF8.self), now])
        // The users it entitles, rewritten only when they change (a renewal keeps them): every row of
        // subscription_user and its index is a page of the WAL, and their keys are random.
        let users = next.entitlementUserIds
        let previous = stored == nil
            ? []
            : try String.fetchAll(
                db.cachedStatement(sql: "SELECT app_user_id FROM subscription_user WHERE store = ? AND original_transaction_id = ?"),
                arguments: [store, id])
        // Compared as bytes, as SQLite compares them (Swift's == equates canonically equivalent strings).
        if Set(previous.map { Array($0.utf8) }) != Set(users.map { Array($0.utf8) }) {
            try db.cachedStatement(sql: "DELETE FROM subscription_user WHERE store = ? AND original_transaction_id = ?").execute(arguments: [store, id])
            for user in users {
                try db.cachedStatement(sql: "INSERT OR IGNORE INTO subscription_user (app_user_id, store, original_transaction_id) VALUES (?, ?, ?)")
                    .execute(arguments: [user, store, id])
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
        let rows = try Row.fetchAll(
            db.cachedStatement(
                sql: """
                    SELECT s.state FROM subscription_user u
                    JOIN subscription s ON s.store = u.store AND s.original_transaction_id = u.original_transaction_id
                    WHERE u.app_user_id = ? AND NOT (s.store = ? AND s.original_transaction_id = ?)
                    ORDER BY s.store, s.original_transaction_id
                    """),
            arguments: [appUserId, excluding?.store.rawValue ?? "", excluding?.originalTransactionId ?? ""])
        return try rows.map { row in try decode(row[0]) }
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
        guard let row = try Row.fetchOne(
            db.cachedStatement(sql: "SELECT state FROM subscription WHERE store = ? AND original_transaction_id = ?"), arguments: [store, id])
        else { return nil }
        return try decode(row["state"])
    }

    /// A stored state; its remembered contexts stay bytes until read (`SubscriptionState(serialized:)`).
    static func decode(_ text: String) throws -> SubscriptionState {
        try SubscriptionState(serialized: Array(text.utf8))
    }
}
