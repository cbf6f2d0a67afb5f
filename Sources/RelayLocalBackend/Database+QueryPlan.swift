import GRDB

extension Database {
    /// SQLite's plan for `sql`, one line a step (`EXPLAIN QUERY PLAN`'s details): what the plan tests hold the
    /// routes' queries to.
    func queryPlan(_ sql: String, arguments: StatementArguments) throws -> [String] {
        try Row.fetchAll(self, sql: "EXPLAIN QUERY PLAN " + sql, arguments: arguments).map { $0["detail"] }
    }
}
