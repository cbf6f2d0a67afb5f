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
    func addSubscriptionListRoutes(to router: Router<BasicRequestContext>) {
        let database = self.database
        let clock = self.clock
        router.get(RouterPath(Self.internalPrefix)) { request, _ in
            let parameters = request.uri.queryParameters
            guard let storeText = parameters["store"], let store = Store(rawValue: String(storeText)) else {
                return errorResponse(.badRequest, "bad_request", "store: use apple, google, stripe or paddle")
            }
            guard let applicationText = parameters["applicationId"], let applicationId = Int(String(applicationText)) else {
                return errorResponse(.badRequest, "bad_request", "applicationId: the application's integer id (apps[].applicationId) is required")
            }
            let since: Int64?
            let cursor: Int64?
            let limit: Int
            do {
                since = try EventQueryParameters.time(parameters["activeOrChangedSince"].map(String.init), "activeOrChangedSince")
                cursor = try EventQueryParameters.cursor(parameters)
                limit = try EventQueryParameters.limit(parameters)
            } catch let invalid as EventQueryParameters.Invalid {
                return errorResponse(.badRequest, "bad_request", invalid.message)
            }
            let page = try await database.subscriptions(
                store: store, applicationId: applicationId, activeOrChangedSince: since, now: clock(), after: cursor, limit: limit)
            return json(
                .ok,
                ["subscriptions": .array(page.states.map(\.json)), "nextCursor": page.next.map { .string(String($0)) } ?? .null])
        }
    }
}
