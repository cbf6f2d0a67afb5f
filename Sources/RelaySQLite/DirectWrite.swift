public import GRDB
import GRDBSQLite

/// A prepared write (an INSERT or UPDATE) run with SQLite's C calls: its parameters bound in order from the
/// values as they are, then stepped to its end.
///
/// For the statements that write each record, event and attempt: GRDB's `execute(arguments:)` builds a
/// `StatementArguments` of existentials, checks it against the statement and converts each value, about
/// 2 µs a row beside SQLite's own work, which a profile of the whole pipeline put at several percent of
/// its CPU. What this leaves out of GRDB's execution is what those statements do not need: no transaction
/// observers are registered on the relay's databases, an INSERT or UPDATE does not change the schema, and
/// it runs only inside a transaction already open (checked: after a failed statement has rolled one back,
/// SQLite would otherwise run the next in a transaction of its own).
public struct DirectWrite {
    private let statement: Statement

    /// `statement` (from `db.cachedStatement(sql:)`) must be an INSERT or UPDATE without RETURNING.
    public init(_ statement: Statement) {
        self.statement = statement
    }

    /// Binds the parameters with `bind`, which must bind each of them once, in order, and runs the
    /// statement. Throws the `DatabaseError` SQLite reports, as GRDB would.
    public func execute(_ bind: (inout Parameters) -> Void) throws {
        let raw = statement.sqliteStatement
        let connection = sqlite3_db_handle(raw)
        guard sqlite3_get_autocommit(connection) == 0 else {
            throw DatabaseError(resultCode: .SQLITE_MISUSE, message: "a direct write runs only inside an open transaction", sql: statement.sql)
        }
        // A step GRDB left unfinished, or the bindings of its last run, must not carry over.
        sqlite3_reset(raw)
        var parameters = Parameters(raw: raw)
        bind(&parameters)
        defer {
            sqlite3_reset(raw)
            sqlite3_clear_bindings(raw)
        }
        guard parameters.next - 1 == sqlite3_bind_parameter_count(raw), parameters.failure == SQLITE_OK else {
            let message =
                parameters.failure == SQLITE_OK
                ? "\(parameters.next - 1) parameters bound of \(sqlite3_bind_parameter_count(raw))" : String(cString: sqlite3_errmsg(connection))
            throw DatabaseError(
                resultCode: ResultCode(rawValue: parameters.failure == SQLITE_OK ? SQLITE_MISUSE : parameters.failure), message: message, sql: statement.sql)
        }
        let code = sqlite3_step(raw)
        guard code == SQLITE_DONE else {
            throw DatabaseError(resultCode: ResultCode(rawValue: code), message: String(cString: sqlite3_errmsg(connection)), sql: statement.sql)
        }
    }

    /// The statement's parameters, bound one after another from the first. Text and blobs are copied by
    /// SQLite (`SQLITE_TRANSIENT`), so nothing bound must outlive the call.
    public struct Parameters {
        fileprivate let raw: SQLiteStatement
        fileprivate var next: Int32 = 1
        /// The first binding's failure (a value too large, say), reported when the statement would run.
        fileprivate var failure: Int32 = SQLITE_OK

        private mutating func record(_ code: Int32) {
            if failure == SQLITE_OK, code != SQLITE_OK { failure = code }
            next += 1
        }

        public mutating func int64(_ value: Int64) {
            record(sqlite3_bind_int64(raw, next, value))
        }

        public mutating func int64(_ value: Int64?) {
            guard let value else { return null() }
            int64(value)
        }

        public mutating func double(_ value: Double?) {
            guard let value else { return null() }
            record(sqlite3_bind_double(raw, next, value))
        }

        public mutating func text(_ value: String?) {
            guard var value else { return null() }
            let code = value.withUTF8 { utf8 in bindText(UnsafeRawBufferPointer(utf8)) }
            record(code)
        }

        /// Bytes as TEXT (they must be UTF-8): a JSON body kept as text without making a String of it first.
        public mutating func text(utf8 value: [UInt8]) {
            let code = value.withUnsafeBytes { bytes in bindText(bytes) }
            record(code)
        }

        private func bindText(_ bytes: UnsafeRawBufferPointer) -> Int32 {
            // SQLite takes a null pointer as NULL: no bytes are an empty text.
            guard let start = bytes.baseAddress, !bytes.isEmpty else {
                return sqlite3_bind_text(raw, next, UnsafeRawPointer(("" as StaticString).utf8Start).assumingMemoryBound(to: CChar.self), 0, transient)
            }
            return sqlite3_bind_text(raw, next, start.assumingMemoryBound(to: CChar.self), Int32(bytes.count), transient)
        }

        public mutating func blob(_ value: [UInt8]?) {
            guard let value else { return null() }
            let code = value.withUnsafeBytes { bytes in
                // SQLite takes a null pointer as NULL: no bytes are a zero-length blob.
                guard let start = bytes.baseAddress, !bytes.isEmpty else { return sqlite3_bind_zeroblob(raw, next, 0) }
                return sqlite3_bind_blob(raw, next, start, Int32(bytes.count), transient)
            }
            record(code)
        }

        public mutating func null() {
            record(sqlite3_bind_null(raw, next))
        }
    }
}

/// SQLite copies the value before the call returns.
private let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
