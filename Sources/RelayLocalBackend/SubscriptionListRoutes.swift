import Foundation
import Hummingbird
import NIOCore
import RelayCore

extension LocalBackend {
    /// `GET /subscriptions-api/internal/v1/subscriptions?store=apple&applicationId=N&activeOrChangedSince=T&cursor=..&limit=..`:
    /// the stored states of one application's subscriptions in one store that are active (ACTIVE,
    /// IN_GRACE_PERIOD, IN_BILLING_RETRY, PAUSED, or an expiry still ahead) or were written at or after
    /// `activeOrChangedSince` (optional; Unix ms, RFC 3339 or a date). Answers
    /// `{"subscriptions": [state, ...], "nextCursor": "…" | null}`; pass `nextCursor` back as `cursor`.
    /// `revenue-relay reconcile` walks it.
    ///
    /// A read key lists its apps' subscriptions only: another `applicationId` is 403 `forbidden`.
    func addSubscriptionListRoutes(to router: Router<BackendRequestContext>) {
        let database = self.database
        let clock = self.clock
        let backend = self
        route(router, .get, Self.internalPrefix) { request, _, principal in
            let parameters = request.uri.queryParameters
            guard let storeText = parameters["store"], let store = Store(rawValue: String(storeText)) else {
                return errorResponse(.badRequest, "bad_request", "store: use apple, google, stripe or paddle")
            }
            guard let applicationText = parameters["applicationId"], let applicationId = Int(String(applicationText)) else {
                return errorResponse(.badRequest, "bad_request", "applicationId: the application's integer id (apps[].applicationId) is required")
            }
            if let allowed = principal.applicationIds, !allowed.contains(applicationId) {
                return backend.forbidden("applicationId: this key reads the subscriptions of its own apps only")
            }
            let since: Int64?
            let cursor: Int64?
            let limit: Int
            do {
                since = try EventQueryParameters.time(parameters["activeOrChangedSince"].map(String.init), "activeOrChangedSince")
                cursor = try EventQueryParameters.cursor(parameters)
                limit = try EventQueryParameters.limit(parameters)
            } catch let invalid as EventQueryParameters.Invalid {
                return invalid.response(events: backend)
            }
            let page = try await database.subscriptions(
                store: store, applicationId: applicationId, activeOrChangedSince: since, now: clock(), after: cursor, limit: limit)
            // Each state as stored: its remembered contexts go out without being parsed (reconcile walks every page).
            let body = JSON.serializedObject(["nextCursor": page.next.map { .string(String($0)) } ?? .null], splicing: "subscriptions") { output in
                JSON.writeArray(page.states, to: &output) { state, output in output.append(contentsOf: state.serialized()) }
            }
            return json(.ok, serialized: body)
        }
    }
}
