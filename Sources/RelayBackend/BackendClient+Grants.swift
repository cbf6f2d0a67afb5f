public import RelayCore
import RelayHTTPClient

/// The backend's grants routes (`revenue-relay grant` and `revoke`), with the secret key.
extension BackendClient {
    /// `POST /subscriptions-api/internal/v1/users/{appUserId}/grants` with `body`; the grant as answered
    /// (201 once applied, 202 while the worker has not applied it yet). A 400 is `badRequest` with the
    /// backend's detail. Sent once: each request that arrives makes a grant, so a lost answer is not
    /// followed by a second grant (the caller checks the user's customer info before granting again).
    public func grant(appUserId: String, _ body: JSON) async throws(BackendError) -> JSON {
        let path = "/subscriptions-api/internal/v1/users/\(Self.pathSegment(appUserId))/grants"
        let response = try await send("POST", path, headers: [("Content-Type", "application/json")], body: body.serialized(), retrying: false)
        return try Self.answer(response, path: path)
    }

    /// `DELETE /subscriptions-api/internal/v1/users/{appUserId}/grants/{grantId}`; the grant as answered. A
    /// grant this user does not have is `notFound`.
    public func revokeGrant(appUserId: String, grantId: String) async throws(BackendError) -> JSON {
        let path = "/subscriptions-api/internal/v1/users/\(Self.pathSegment(appUserId))/grants/\(Self.pathSegment(grantId))"
        return try Self.answer(try await send("DELETE", path), path: path)
    }

    /// `POST path?query` with no body (the delivery actions: resend, recover, enable); the answer. Sent once.
    public func act(_ path: String, query: [(String, String)] = []) async throws(BackendError) -> JSON {
        let text = query.map { "\(PercentEncoding.encode($0.0))=\(PercentEncoding.encode($0.1))" }.joined(separator: "&")
        let target = path + (text.isEmpty ? "" : "?" + text)
        let response = try await send("POST", target, headers: [], body: [], retrying: false)
        return try Self.answer(response, path: path)
    }

    private static func answer(_ response: HTTPClientResponse, path: String) throws(BackendError) -> JSON {
        let document = try? JSON.parse(response.body)
        let detail = document?["detail"]?.stringValue
        switch response.status {
        case 200..<300:
            guard let document else { throw BackendError(kind: .invalidResponse, message: "\(path) answered with a body that is not JSON") }
            return document
        case 400:
            throw BackendError(kind: .badRequest, message: detail ?? "the backend refused the request to \(path)")
        case 404:
            throw BackendError(kind: .notFound, message: detail ?? "it has no \(path): it is older than this command; upgrade it")
        case 401, 403:
            throw error(response, what: path)
        default:
            throw BackendError(kind: .invalidResponse, message: "it answered HTTP \(response.status) for \(path)\(detail.map { ": \($0)" } ?? "")")
        }
    }
}
