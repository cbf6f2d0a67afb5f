import Foundation
import GRDB
import RelaySQLite
public import RelayCore

/// A user's attributes (`PUT .../users/{id}/attributes`), per application, kept under the user an id
/// stands for: names to strings, numbers or bools. The user's later webhooks carry them
/// (`data.userAttributes`, Superwall's Webhooks V2 field).
extension SubscriptionDatabase {
    /// At most this many attributes a user, and this many characters in a string value or bytes in a name.
    public static let maximumAttributes = 64
    public static let maximumAttributeValueCharacters = 500
    public static let maximumAttributeNameBytes = 64

    /// Why an attribute update was refused (nothing is stored then).
    public struct AttributeProblem: Error, Sendable, Equatable {
        public var detail: String
    }

    static func createAttributeSchema(_ db: Database) throws {
        try db.execute(
            sql: """
                CREATE TABLE user_attribute (
                    application_id INTEGER NOT NULL,
                    app_user_id TEXT NOT NULL,
                    name TEXT NOT NULL,
                    value TEXT NOT NULL,
                    updated_at INTEGER NOT NULL,
                    PRIMARY KEY (application_id, app_user_id, name)
                ) WITHOUT ROWID;
                """)
    }

    /// Sets (or, for `null`, deletes) the user's attributes in one transaction, and returns them all. Refused
    /// with a reason when a value is not a string, number, bool or null, a string is too long, or the user
    /// would have more than `maximumAttributes`.
    public func setAttributes(_ updates: [String: JSON], of id: String, applicationId: Int, now: Int64) async throws -> Result<[String: JSON], AttributeProblem> {
        for (name, value) in updates {
            switch value {
            case .string(let text) where text.count > Self.maximumAttributeValueCharacters:
                return .failure(AttributeProblem(detail: "attribute \(name.prefix(64)) is longer than \(Self.maximumAttributeValueCharacters) characters"))
            case .string, .integer, .number, .bool, .null:
                continue
            default:
                return .failure(AttributeProblem(detail: "attribute \(name.prefix(64)) must be a string, a number, a bool, or null to delete it"))
            }
        }
        return try await pool.write { db in
            let user = try Self.canonicalUser(db, of: id, applicationId: applicationId)
            for (name, value) in updates {
                if value.isNull {
                    try db.execute(
                        sql: "DELETE FROM user_attribute WHERE application_id = ? AND app_user_id = ? AND name = ?", arguments: [applicationId, user, name])
                } else {
                    try db.execute(
                        sql: """
                            INSERT INTO user_attribute (application_id, app_user_id, name, value, updated_at) VALUES (?, ?, ?, ?, ?)
                            ON CONFLICT (application_id, app_user_id, name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at
                            """, arguments: [applicationId, user, name, value.text, now])
                }
            }
            let all = try Self.attributes(db, of: user, applicationId: applicationId)
            guard all.count <= Self.maximumAttributes else {
                // Rolled back with the transaction: nothing of the update stays.
                throw AttributeLimit()
            }
            return .success(all)
        }
    }

    /// The app user `id` stands for, with its other ids and its attributes.
    public func appUser(_ id: String, applicationId: Int) async throws -> AppUser {
        try await pool.read { db in try Self.appUser(db, id, applicationId: applicationId) }
    }

    static func appUser(_ db: Database, _ id: String, applicationId: Int) throws -> AppUser {
        let user = try canonicalUser(db, of: id, applicationId: applicationId)
        return AppUser(
            appUserId: user, aliases: try aliases(db, of: user, applicationId: applicationId), attributes: try attributes(db, of: user, applicationId: applicationId))
    }

    static func attributes(_ db: Database, of user: String, applicationId: Int) throws -> [String: JSON] {
        var attributes: [String: JSON] = [:]
        try DirectRead(db.cachedStatement(sql: "SELECT name, value FROM user_attribute WHERE application_id = ? AND app_user_id = ?")).forEach {
            parameters in
            parameters.int64(Int64(applicationId))
            parameters.text(user)
        } row: { columns in
            guard let name = columns.text(0), let value = columns.textBytes(1) else { return }
            attributes[name] = try? JSON.parse(value)
        }
        return attributes
    }

    /// The update would leave the user with more than `maximumAttributes` (the transaction rolls back).
    struct AttributeLimit: Error {}
}
