import GRDB
import RelayCore
import RelayCrypto

/// A redemption code as stored: its SHA-256 (never the code), the checkout it pays for, and who redeemed it.
struct RedemptionCode: Equatable {
    var applicationId: Int
    var checkoutSessionId: String
    var expiresAt: Int64
    var redeemedBy: String?
}

extension SubscriptionDatabase {
    static func createRedemptionSchema(_ db: Database) throws {
        try db.execute(
            sql: """
                CREATE TABLE redemption_code (
                    code_hash TEXT PRIMARY KEY,
                    application_id INTEGER NOT NULL,
                    checkout_session_id TEXT NOT NULL UNIQUE,
                    created_at INTEGER NOT NULL,
                    expires_at INTEGER NOT NULL,
                    redeemed_by TEXT,
                    redeemed_at INTEGER
                ) WITHOUT ROWID;
                """)
    }

    static func codeHash(_ code: String) -> String { Digest.hex(Digest.sha256(Array(code.utf8))) }

    func storeCode(_ code: String, applicationId: Int, checkoutSessionId: String, createdAt: Int64, expiresAt: Int64) async throws {
        try await pool.write { db in
            try db.execute(
                sql: """
                    INSERT INTO redemption_code (code_hash, application_id, checkout_session_id, created_at, expires_at) VALUES (?, ?, ?, ?, ?)
                    """, arguments: [Self.codeHash(code), applicationId, checkoutSessionId, createdAt, expiresAt])
        }
    }

    func code(_ code: String) async throws -> RedemptionCode? {
        try await pool.read { db in
            guard let row = try Row.fetchOne(
                db, sql: "SELECT application_id, checkout_session_id, expires_at, redeemed_by FROM redemption_code WHERE code_hash = ?",
                arguments: [Self.codeHash(code)])
            else { return nil }
            return RedemptionCode(applicationId: row[0], checkoutSessionId: row[1], expiresAt: row[2], redeemedBy: row[3])
        }
    }

    /// Claims the code for `user` if nobody redeemed it yet, in one statement (two redeemers at once: one
    /// wins). Returns who has it now.
    func claim(_ code: String, by user: String, at time: Int64) async throws -> String? {
        try await pool.write { db in
            try db.execute(
                sql: "UPDATE redemption_code SET redeemed_by = ?, redeemed_at = ? WHERE code_hash = ? AND redeemed_by IS NULL",
                arguments: [user, time, Self.codeHash(code)])
            return try String.fetchOne(db, sql: "SELECT redeemed_by FROM redemption_code WHERE code_hash = ?", arguments: [Self.codeHash(code)])
        }
    }

    /// Forgets codes nobody redeemed that expired more than `keep` ago (redeemed ones stay: their user may
    /// redeem them again).
    func pruneCodes(before time: Int64) async throws {
        try await pool.write { db in
            try db.execute(sql: "DELETE FROM redemption_code WHERE redeemed_by IS NULL AND expires_at < ?", arguments: [time])
        }
    }
}
