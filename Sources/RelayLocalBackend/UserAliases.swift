import Foundation
import GRDB
import RelaySQLite
public import RelayConfig

/// The ids an app user is known by: Superwall's SDK knows a user by `appUserId` once identified, and
/// before that by an alias (`$SuperwallAlias:<UUID>`) and a device id (`$SuperwallDevice:<UUID>`).
/// Linking makes those ids the user from then on, per application: every public route answers for any of
/// them with the user's whole customer info, and what was bought under one counts for the user.
///
/// Each alias belongs to one user of an application (`user_alias`). A user is never itself an alias: an
/// id that had aliases of its own and is linked to another user brings them along.
extension SubscriptionDatabase {
    /// What linking aliases did.
    public enum LinkOutcome: Sendable, Equatable {
        /// The ids are the user's now; `user` is the user they were linked to (the one the request named,
        /// or the user that id is itself an alias of).
        case linked(user: String)
        /// An alias belongs to another user and the app's `transferPolicy` is `keep`: nothing changed.
        case ownedByAnotherUser
    }

    static func createAliasSchema(_ db: Database) throws {
        try db.execute(
            sql: """
                CREATE TABLE user_alias (
                    application_id INTEGER NOT NULL,
                    alias TEXT NOT NULL,
                    app_user_id TEXT NOT NULL,
                    linked_at INTEGER NOT NULL,
                    PRIMARY KEY (application_id, alias)
                ) WITHOUT ROWID;
                CREATE INDEX user_alias_by_user ON user_alias (app_user_id, application_id);
                CREATE INDEX user_alias_by_alias ON user_alias (alias);
                """)
    }

    /// Links `aliases` to `user` in one transaction, by `policy` when an alias belongs to another user.
    public func link(
        aliases: [String], to user: String, applicationId: Int, policy: RelayConfiguration.TransferPolicy, now: Int64
    ) async throws -> LinkOutcome {
        try await pool.write { db in
            let canonical = try Self.canonicalUser(db, of: user, applicationId: applicationId)
            var seen = Set<String>()
            let linking = aliases.filter { $0 != canonical && seen.insert($0).inserted }
            // Decided before anything is written: under `keep`, one id of another user (an alias of someone
            // else, or a user with aliases of its own) refuses them all.
            if policy == .keep {
                for alias in linking {
                    if let owner = try Self.owner(db, of: alias, applicationId: applicationId), owner != canonical { return .ownedByAnotherUser }
                    let hasAliases = try Bool.fetchOne(
                        db, sql: "SELECT EXISTS (SELECT 1 FROM user_alias WHERE application_id = ? AND app_user_id = ?)",
                        arguments: [applicationId, alias]) ?? false
                    if hasAliases { return .ownedByAnotherUser }
                }
            }
            for alias in linking {
                // An id that had aliases of its own brings them to the user.
                try db.execute(
                    sql: "UPDATE user_alias SET app_user_id = ?, linked_at = ? WHERE application_id = ? AND app_user_id = ?",
                    arguments: [canonical, now, applicationId, alias])
                try db.execute(
                    sql: """
                        INSERT INTO user_alias (application_id, alias, app_user_id, linked_at) VALUES (?, ?, ?, ?)
                        ON CONFLICT (application_id, alias) DO UPDATE SET app_user_id = excluded.app_user_id, linked_at = excluded.linked_at
                        WHERE user_alias.app_user_id != excluded.app_user_id
                        """, arguments: [applicationId, alias, canonical, now])
            }
            return .linked(user: canonical)
        }
    }

    /// The user `id` stands for in an application (itself when it is no alias), and every id of that user:
    /// the user first, then its aliases in the order they were linked.
    public func userIds(of id: String, applicationId: Int) async throws -> (user: String, ids: [String]) {
        try await pool.read { db in
            let user = try Self.canonicalUser(db, of: id, applicationId: applicationId)
            return (user, [user] + (try Self.aliases(db, of: user, applicationId: applicationId)))
        }
    }

    /// Every id `ids` stand for, in the given applications (nil: every one): each id, the user it is an
    /// alias of, and that user's aliases. One read, whatever the number of applications.
    public func allUserIds(of ids: [String], applicationIds: Set<Int>?) async throws -> [String] {
        try await pool.read { db in try Self.allUserIds(db, of: ids, applicationIds: applicationIds) }
    }

    static func allUserIds(_ db: Database, of ids: [String], applicationIds: Set<Int>?) throws -> [String] {
        var all: [String] = []
        func add(_ id: String) { if !all.contains(id) { all.append(id) } }
        // With SQLite's C calls (DirectRead): the worker asks this for each notification's user.
        let owners = DirectRead(try db.cachedStatement(sql: "SELECT application_id, app_user_id FROM user_alias WHERE alias = ?"))
        let aliases = DirectRead(try db.cachedStatement(sql: "SELECT application_id, alias FROM user_alias WHERE app_user_id = ?"))
        func inScope(_ columns: DirectRead.Columns) -> Bool { applicationIds?.contains(Int(columns.int64(0))) ?? true }
        for id in ids {
            add(id)
            var users = [id]
            try owners.forEach { $0.text(id) } row: { columns in
                guard inScope(columns), let user = columns.text(1) else { return }
                add(user)
                users.append(user)
            }
            for user in users {
                try aliases.forEach { $0.text(user) } row: { columns in
                    guard inScope(columns), let alias = columns.text(1) else { return }
                    add(alias)
                }
            }
        }
        return all
    }

    /// The aliases of `user` in an application, in the order they were linked. With SQLite's C calls
    /// (DirectRead): the worker reads them for each notification's user.
    static func aliases(_ db: Database, of user: String, applicationId: Int) throws -> [String] {
        var aliases: [String] = []
        try DirectRead(db.cachedStatement(sql: "SELECT alias FROM user_alias WHERE application_id = ? AND app_user_id = ? ORDER BY linked_at, alias"))
            .forEach { parameters in
                parameters.int64(Int64(applicationId))
                parameters.text(user)
            } row: { columns in
                if let alias = columns.text(0) { aliases.append(alias) }
            }
        return aliases
    }

    private static func owner(_ db: Database, of alias: String, applicationId: Int) throws -> String? {
        var owner: String?
        try DirectRead(db.cachedStatement(sql: "SELECT app_user_id FROM user_alias WHERE application_id = ? AND alias = ?")).forEach { parameters in
            parameters.int64(Int64(applicationId))
            parameters.text(alias)
        } row: { columns in
            if owner == nil { owner = columns.text(0) }
        }
        return owner
    }

    static func canonicalUser(_ db: Database, of id: String, applicationId: Int) throws -> String {
        try owner(db, of: id, applicationId: applicationId) ?? id
    }
}
