public import RelayCore
import RelayHTTPClient

/// The backend's read routes the command line uses (`events`, `revenue`, and the store history commands):
/// the events store and the subscriptions list, with the same key, retries and errors as every call.
extension BackendClient {
    /// `GET path?query` of a read route, as JSON. A 400 is `badRequest` with the backend's `detail`; a 404
    /// means the backend is older than the route.
    public func read(_ path: String, _ query: [(String, String)]) async throws(BackendError) -> JSON {
        let text = query.map { "\(PercentEncoding.encode($0.0))=\(PercentEncoding.encode($0.1))" }.joined(separator: "&")
        let response = try await send("GET", path + (text.isEmpty ? "" : "?" + text))
        switch response.status {
        case 200:
            guard let document = try? JSON.parse(response.body) else {
                throw BackendError(kind: .invalidResponse, message: "\(path) answered with a body that is not JSON")
            }
            return document
        case 400:
            throw BackendError(kind: .badRequest, message: (try? JSON.parse(response.body))?["detail"]?.stringValue ?? "the backend refused the request to \(path)")
        case 404:
            throw BackendError(kind: .notFound, message: "it has no \(path): it is older than this command; upgrade it")
        case 401, 403:
            throw Self.error(response, what: path)
        default:
            let detail = (try? JSON.parse(response.body))?["detail"]?.stringValue.map { ": \($0)" } ?? ""
            throw BackendError(kind: .invalidResponse, message: "it answered HTTP \(response.status) for \(path)\(detail)")
        }
    }

    /// Every recorded event that matches `filter` (the events route's query parameters), page by page
    /// (1,000 a page), oldest recorded first, each page handed to `body`.
    public func events(_ filter: [(String, String)], _ body: ([JSON]) -> Void) async throws(BackendError) {
        var cursor: String?
        repeat {
            var query = filter + [("limit", "1000")]
            if let cursor { query.append(("cursor", cursor)) }
            let page = try await read("/subscriptions-api/internal/v1/events", query)
            body(page["events"]?.arrayValue ?? [])
            cursor = page["nextCursor"]?.stringValue
        } while cursor != nil
    }

    /// The app user `id` stands for in an application (`GET .../internal/v1/users/{id}`): the user an app
    /// linked it to, else itself.
    public func appUser(_ id: String, applicationId: Int) async throws(BackendError) -> AppUser {
        let answer = try await read(
            "/subscriptions-api/internal/v1/users/\(PercentEncoding.pathSegment(id))", [("applicationId", String(applicationId))])
        guard let user = AppUser(json: answer) else {
            throw BackendError(kind: .invalidResponse, message: "the user route's answer has no appUserId")
        }
        return user
    }

    /// Links `aliases` to the app user `id` in an application (`POST .../public/v1/users/{id}/aliases` with the
    /// secret key): true when linked, false when an alias belongs to another user and the app keeps
    /// ownership (409 `owned_by_another_user`).
    public func linkAliases(_ aliases: [String], to id: String, applicationId: Int) async throws(BackendError) -> Bool {
        let path = "/subscriptions-api/public/v1/users/\(PercentEncoding.pathSegment(id))/aliases?applicationId=\(applicationId)"
        let body = JSON.object(["aliasIds": .array(aliases.map(JSON.string))]).serialized()
        let response = try await send("POST", path, headers: [("Content-Type", "application/json")], body: body)
        switch response.status {
        case 200: return true
        case 409: return false
        case 401, 403: throw Self.error(response, what: "the aliases route")
        default:
            let detail = (try? JSON.parse(response.body))?["detail"]?.stringValue.map { ": \($0)" } ?? ""
            throw BackendError(kind: .invalidResponse, message: "it answered HTTP \(response.status) for the aliases route\(detail)")
        }
    }

    /// Whether any event was recorded for this store notification id.
    public func hasEvents(notificationId: String) async throws(BackendError) -> Bool {
        let page = try await read("/subscriptions-api/internal/v1/events", [("notificationId", notificationId), ("environment", "ALL"), ("limit", "1")])
        return !(page["events"]?.arrayValue ?? []).isEmpty
    }

    /// One page (100) of the subscriptions of `store` in an application, optionally only those active or
    /// changed since `since` (Unix ms).
    public func subscriptions(store: Store, applicationId: Int, activeOrChangedSince since: Int64?, cursor: String?) async throws(BackendError)
        -> (states: [SubscriptionState], next: String?)
    {
        var query = [("store", store.rawValue), ("applicationId", String(applicationId)), ("limit", "100")]
        if let since { query.append(("activeOrChangedSince", String(since))) }
        if let cursor { query.append(("cursor", cursor)) }
        let page = try await read("/subscriptions-api/internal/v1/subscriptions", query)
        var states: [SubscriptionState] = []
        for item in page["subscriptions"]?.arrayValue ?? [] {
            do {
                states.append(try SubscriptionState(json: item))
            } catch {
                throw BackendError(kind: .invalidResponse, message: "it listed a subscription this version cannot read (\(error))")
            }
        }
        return (states, page["nextCursor"]?.stringValue)
    }
}
