public import GRDB
import GRDBSQLite
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A prepared write (an INSERT or UPDATE) run with SQLite's C calls: its parameters bound in order from the
/// values as they are, then stepped to its end.
///
/// For the statements that write each record, event, attempt and state: GRDB's `execute(arguments:)` builds
/// a `StatementArguments` of existentials, checks it against the statement and converts each value, about
/// 2 µs a row beside SQLite's own work, which a profile of the whole pipeline put at several percent of
/// its CPU. What this leaves out of GRDB's execution is what those statements do not need: no transaction
/// observers are registered on the relay's databases, an INSERT or UPDATE does not change the schema, and
/// it runs only inside a transaction already open (checked: after a failed statement has rolled one back,
/// SQLite would otherwise run the next in a transaction of its own). GRDB's cancellation of an async
/// access is not checked between these statements.
///
/// Values are stored as GRDB stores them: text up to its first NUL (GRDB binds a C string), integers as
/// 64-bit, `nil` as NULL, and no bytes as an empty blob or text, not NULL. A statement run this way must not
/// also be run through GRDB (its SQL is the cache's key): GRDB would not know its bindings were cleared.
public struct DirectWrite {
    private let statement: Statement

    /// `statement` (from `db.cachedStatement(sql:)`) must be an INSERT or UPDATE without RETURNING.
    public init(_ statement: Statement) {
        self.statement = statement
    }

    /// Binds the parameters with `bind`, which must bind each of them once, in order, and runs the
    /// statement. Throws a `DatabaseError` with SQLite's result code and message, as GRDB does (without the
    /// arguments, which may be a notification's bytes).
    public func execute(_ bind: (inout Parameters) -> Void) throws {
        let raw = statement.sqliteStatement
        let connection = sqlite3_db_handle(raw)
        guard sqlite3_get_autocommit(connection) == 0 else {
            throw DatabaseError(resultCode: .SQLITE_MISUSE, message: "a direct write runs only inside an open transaction", sql: statement.sql)
        }
        guard sqlite3_column_count(raw) == 0 else {
            throw DatabaseError(resultCode: .SQLITE_MISUSE, message: "a direct write returns no rows", sql: statement.sql)
        }
        try run(statement, bind) {
            let code = sqlite3_step(raw)
            guard code == SQLITE_DONE else { throw stepFailure(statement, code) }
        }
    }

    /// The statement's parameters, bound one after another from the first. Text and blobs are copied by
    /// SQLite (`SQLITE_TRANSIENT`), so nothing bound must outlive the call.
    public struct Parameters {
        fileprivate let raw: SQLiteStatement
        fileprivate var next: Int32 = 1
        /// The first binding's failure (a value too large, say), reported when the statement would run.
        fileprivate var failure: Int32 = SQLITE_OK

        fileprivate init(raw: SQLiteStatement) {
            self.raw = raw
        }

        /// Throws unless every parameter was bound, each without failing.
        fileprivate func check(_ statement: Statement) throws {
            let count = sqlite3_bind_parameter_count(raw)
            guard next - 1 != count || failure != SQLITE_OK else { return }
            let message = failure == SQLITE_OK ? "\(next - 1) parameters bound of \(count)" : String(cString: sqlite3_errmsg(sqlite3_db_handle(raw)))
            throw DatabaseError(resultCode: ResultCode(rawValue: failure == SQLITE_OK ? SQLITE_MISUSE : failure), message: message, sql: statement.sql)
        }

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

        /// Up to the first NUL, as GRDB binds a String (so that a row written here is found by GRDB's reads
        /// and deletes, and the other way round).
        public mutating func text(_ value: String?) {
            guard var value else { return null() }
            let code = value.withUTF8 { utf8 in bindText(UnsafeRawBufferPointer(start: utf8.baseAddress, count: lengthBeforeNUL(utf8))) }
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

/// The bytes before the first NUL (all of them when there is none), found with `memchr`.
private func lengthBeforeNUL(_ bytes: UnsafeBufferPointer<UInt8>) -> Int {
    guard let start = bytes.baseAddress, let nul = memchr(start, 0, bytes.count) else { return bytes.count }
    return UnsafeRawPointer(nul) - UnsafeRawPointer(start)
}

/// What `DirectWrite` and `DirectRead` share: binds `statement`'s parameters with `bind`, checks that every
/// one was bound, runs `steps`, and leaves the statement reset with its bindings cleared, whatever happens.
///
/// A statement stepped by someone else (a cursor over the same SQL, or a direct statement run from inside
/// another's row) would be reset under them: refused instead. (GRDB's `Statement.sql` is made anew from
/// SQLite's text each time it is read, about 3 µs for these statements: it is read only for an error.)
private func run(_ statement: Statement, _ bind: (inout DirectWrite.Parameters) -> Void, _ steps: () throws -> Void) throws {
    let raw = statement.sqliteStatement
    guard sqlite3_stmt_busy(raw) == 0 else {
        throw DatabaseError(resultCode: .SQLITE_MISUSE, message: "the statement is already being stepped", sql: statement.sql)
    }
    sqlite3_reset(raw)
    var parameters = DirectWrite.Parameters(raw: raw)
    bind(&parameters)
    defer {
        sqlite3_reset(raw)
        sqlite3_clear_bindings(raw)
    }
    try parameters.check(statement)
    try steps()
}

/// The `DatabaseError` of a step that returned `code`, with SQLite's message.
private func stepFailure(_ statement: Statement, _ code: Int32) -> DatabaseError {
    DatabaseError(
        resultCode: ResultCode(rawValue: code), message: String(cString: sqlite3_errmsg(sqlite3_db_handle(statement.sqliteStatement))), sql: statement.sql)
}

/// A prepared query run with SQLite's C calls, for the reads made for every notification (the log's
/// records, a state, its users, their aliases and attributes): its parameters bound as `DirectWrite` binds them, each row's
/// columns read in place. GRDB's `Row.fetchAll` builds a row of `DatabaseValue`s per row, and its
/// arguments cost as they do for writes.
public struct DirectRead {
    private let statement: Statement

    /// `statement` from `db.cachedStatement(sql:)`, not also run through GRDB (as for `DirectWrite`).
    public init(_ statement: Statement) {
        self.statement = statement
    }

    /// Binds the parameters with `bind` (each once, in order) and calls `row` for each row, whose columns are
    /// valid only during the call. Throws the `DatabaseError` SQLite reports, or what `row` throws.
    public func forEach(_ bind: (inout DirectWrite.Parameters) -> Void, row: (Columns) throws -> Void) throws {
        let raw = statement.sqliteStatement
        try run(statement, bind) {
            let columns = Columns(raw: raw)
            while true {
                let code = sqlite3_step(raw)
                if code == SQLITE_DONE { return }
                guard code == SQLITE_ROW else { throw stepFailure(statement, code) }
                try row(columns)
            }
        }
    }

    /// The current row's columns, by index from 0.
    public struct Columns {
        fileprivate let raw: SQLiteStatement

        public func int64(_ index: Int32) -> Int64 { sqlite3_column_int64(raw, index) }

        /// The column as text (nil when NULL), up to its first NUL as GRDB reads it; bytes that are not UTF-8
        /// are repaired, as Swift's strings are.
        public func text(_ index: Int32) -> String? {
            guard let start = sqlite3_column_text(raw, index) else { return nil }
            let bytes = UnsafeBufferPointer(start: start, count: Int(sqlite3_column_bytes(raw, index)))
            return String(decoding: UnsafeBufferPointer(start: start, count: lengthBeforeNUL(bytes)), as: UTF8.self)
        }

        /// A blob's bytes (nil when the column is NULL).
        public func bytes(_ index: Int32) -> [UInt8]? {
            if sqlite3_column_type(raw, index) == SQLITE_NULL { return nil }
            // The pointer first, then the length (SQLite's documented order); an empty blob has no pointer.
            guard let pointer = sqlite3_column_blob(raw, index) else { return [] }
            return Array(UnsafeRawBufferPointer(start: pointer, count: Int(sqlite3_column_bytes(raw, index))))
        }

        /// The column's bytes as text, every one of them (nil when NULL): for JSON, which holds no NUL.
        public func textBytes(_ index: Int32) -> [UInt8]? {
            guard let start = sqlite3_column_text(raw, index) else { return nil }
            return Array(UnsafeBufferPointer(start: start, count: Int(sqlite3_column_bytes(raw, index))))
        }
    }
}
