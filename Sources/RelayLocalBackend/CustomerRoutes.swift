import Foundation
public import Hummingbird
import RelayConfig
import RelayCore

extension LocalBackend {
    static let customerPath = "/subscriptions-api/internal/v1/customers/:appUserId"
    /// The most events a customer's answer carries (newest first).
    static let customerEventLimit = 500

    /// `GET /subscriptions-api/internal/v1/customers/{id}?applicationId=`: one customer, looked up by any of
    /// their ids (an app user id, an alias, a device id): the user the id stands for, their other ids and
    /// attributes, their customer info as the SDK gets it, their subscriptions' stored states, and the
    /// standardized events of those subscriptions, newest first (at most `customerEventLimit`): the
    /// subscription timeline of the console's customer page.
    ///
    /// A read key reads the customers of its apps: `applicationId` may be left out when the key (or the
    /// backend) has one app; another app's is 403.
    func addCustomerRoutes(to router: Router<BackendRequestContext>) {
        let backend = self
        route(router, .get, Self.customerPath) { request, context, principal in
            guard let id = Self.pathUserId(context, bounded: true) else { return Self.badPathUserId(bounded: true) }
            let app: RelayConfiguration.App
            switch backend.readableApp(applicationId: request.uri.queryParameters.get("applicationId").map { String($0) }, principal: principal) {
            case .success(let found): app = found
            case .failure(let problem): return problem.response
            }
            return json(.ok, try await backend.customer(id, app: app))
        }
    }

    /// The customer route's answer: the user `id` stands for in `app`, their ids and attributes, customer
    /// info, subscriptions and those subscriptions' events (newest first).
    func customer(_ id: String, app: RelayConfiguration.App) async throws -> JSON {
        let user = try await database.appUser(id, applicationId: app.applicationId)
        let (_, ids) = try await database.userIds(of: user.appUserId, applicationId: app.applicationId)
        let subscriptions = try await database.subscriptions(ofUsers: ids).filter { $0.applicationId == app.applicationId }
        var events: [JSON] = []
        for subscription in subscriptions {
            var filter = EventFilter(app: app.key, originalTransactionId: subscription.originalTransactionId, environment: nil)
            filter.store = subscription.store
            events += try await self.events.latest(filter, limit: Self.customerEventLimit).compactMap { try? JSON.parse(Array($0.utf8)) }
        }
        events.sort { ($0["data"]?["ts"]?.int64Value ?? 0) > ($1["data"]?["ts"]?.int64Value ?? 0) }
        var answer = user.json.objectValue ?? [:]
        for (key, value) in entitlements(of: subscriptions).json.objectValue ?? [:] { answer[key] = value }
        answer["subscriptions"] = .array(subscriptions.map(\.json))
        answer["events"] = .array(Array(events.prefix(Self.customerEventLimit)))
        return .object(answer)
    }

    /// The app a read route about one app's users acts in: the `applicationId` given (one of the key's apps),
    /// else the key's only app, else the backend's only app.
    func readableApp(applicationId: String?, principal: BackendPrincipal) -> Result<RelayConfiguration.App, RouteProblem> {
        guard let allowed = principal.apps else { return userApp(applicationId: applicationId, principal: principal) }
        let candidates = configuration.apps.filter { allowed.contains($0.key) }
        if let applicationId {
            guard let app = configuration.apps.first(where: { String($0.applicationId) == applicationId }) else {
                return .failure(RouteProblem(response: errorResponse(.notFound, "not_found", "no application \(applicationId)")))
            }
            guard allowed.contains(app.key) else { return .failure(RouteProblem(response: forbidden("this key reads the rows of its own apps only"))) }
            return .success(app)
        }
        guard candidates.count == 1, let only = candidates.first else {
            return .failure(
                RouteProblem(
                    response: errorResponse(
                        .badRequest, "bad_request",
                        "this key reads several apps; pass ?applicationId= (one of \(candidates.map { String($0.applicationId) }.joined(separator: ", ")))")))
        }
        return .success(only)
    }
}
