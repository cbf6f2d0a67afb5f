import Foundation
public import Hummingbird
import RelayCore

extension LocalBackend {
    public static let deliveriesPath = "/subscriptions-api/internal/v1/deliveries"

    /// `GET /subscriptions-api/internal/v1/deliveries?[app=][&endpoint=][&eventId=][&appUserId=][&status=][&since=][&until=][&limit=][&cursor=]`:
    /// the delivery log, newest first, `{"deliveries": [attempts], "nextCursor"}` (docs/delivery.md). A read key
    /// reads its apps' attempts only.
    func addDeliveryRoutes(to router: Router<BackendRequestContext>) {
        let backend = self
        route(router, .get, Self.deliveriesPath) { request, _, principal in
            let parameters = request.uri.queryParameters
            var filter = DeliveryLog.Filter()
            let limit: Int
            let cursor: Int64?
            do {
                filter.app = parameters["app"].map(String.init)
                if let allowed = principal.apps {
                    if let app = filter.app, !allowed.contains(app) {
                        throw EventQueryParameters.Invalid(message: "app: this key reads the rows of its own apps only", forbidden: true)
                    }
                    filter.apps = allowed
                }
                filter.endpoint = parameters["endpoint"].map(String.init)
                filter.eventId = parameters["eventId"].map(String.init)
                filter.appUserId = try EventQueryParameters.userId(parameters)
                if let text = parameters["status"] {
                    guard let outcome = DeliveryAttempt.Outcome(rawValue: String(text)) else {
                        throw EventQueryParameters.Invalid(message: "status: use succeeded, retrying, throttled or dead")
                    }
                    filter.outcome = outcome
                }
                filter.since = try EventQueryParameters.time(parameters["since"].map(String.init), "since")
                filter.until = try EventQueryParameters.time(parameters["until"].map(String.init), "until")
                limit = try EventQueryParameters.limit(parameters)
                cursor = try EventQueryParameters.cursor(parameters)
            } catch let invalid as EventQueryParameters.Invalid {
                return invalid.response(events: backend)
            }
            let page = try await backend.deliveryLog.page(filter, before: cursor, limit: limit)
            return json(.ok, ["deliveries": .array(page.attempts), "nextCursor": page.next.map { .string(String($0)) } ?? .null])
        }
    }
}
