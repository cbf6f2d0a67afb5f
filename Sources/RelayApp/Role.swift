/// A part of the pipeline one process can run (docs/contracts.md, Command line, `run --role`).
public enum Role: String, Sendable, CaseIterable, Hashable {
    case ingest, worker, deliverer, backend

    /// The roles `run` starts when `--role` is not given.
    public static let defaultRoles: [Role] = [.ingest, .worker, .deliverer]

    /// Parses `ingest,worker`. Unknown names are errors that list the known ones.
    public static func parse(_ text: String) throws(RoleError) -> [Role] {
        var roles: [Role] = []
        for name in text.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !name.isEmpty {
            guard let role = Role(rawValue: name) else { throw RoleError(message: "unknown role \(name); roles are \(allCases.map(\.rawValue).joined(separator: ", "))") }
            if !roles.contains(role) { roles.append(role) }
        }
        guard !roles.isEmpty else { throw RoleError(message: "--role needs at least one role") }
        return roles
    }
}

public struct RoleError: Error, Sendable, CustomStringConvertible {
    public var message: String
    public var description: String { message }
}
