import Foundation
import Hummingbird
import RelayConfig
import RelayCore

extension LocalBackend {
    /// At most this many ids in one link request, and this many bytes in one id.
    static let maximumAliasesPerRequest = 16
    static let maximumIdBytes = AppUser.maximumIdBytes

    /// An id a route may store: 1 to `maximumIdBytes` bytes without control characters.
    static func isValidId(_ id: String) -> Bool { AppUser.isStorableId(id) }

    /// The path's user id (`{appUserId}`, percent-decoded), or nil when the route refuses it (`badPathUserId`):
    /// empty, or holding a control character, since GRDB binds text up to its first NUL and `a%00b` would name
    /// the user `a`; and with `bounded` (the routes that store a user, and the customers route) over
    /// `maximumIdBytes`. The entitlements route and the internal user route take longer ids, as a store may
    /// carry them.
    static func pathUserId(_ context: BackendRequestContext, bounded: Bool) -> String? {
        guard let id = context.parameters.get("appUserId")?.removingPercentEncoding else { return nil }
        return (bounded ? isValidId(id) : !id.isEmpty && !AppUser.hasControlCharacters(id)) ? id : nil
    }

    /// The 400 for a path user id `pathUserId` refused.
    static func badPathUserId(bounded: Bool) -> Response {
        errorResponse(.badRequest, "bad_request", "the user id is required, \(bounded ? "at most \(maximumIdBytes) bytes " : "")without control characters")
    }

    /// `POST /subscriptions-api/public/v1/users/{appUserId}/aliases` with `{"aliasIds": ["$SuperwallAlias:…",
    /// "$SuperwallDevice:…"]}`: the ids are the user from now on, in the app (`UserAliases.swift`). Idempotent.
    ///
    /// - 200 with the entitlements route's body for the user: what was bought under any of the ids.
    /// - 409 `owned_by_another_user` when an id is another user's and the app's `transferPolicy` is `keep`
    ///   (nothing is linked, and the other user is not named); under `transfer` (the default) it moves.
    /// - 400 `bad_request` for a body that is not `{"aliasIds": [...]}` with 1 to 16 ids of at most 256 bytes.
    ///
    /// With a public key the app is the key's own; the secret key names it with `?applicationId=`.
    func addAliasRoutes(to router: Router<BackendRequestContext>) {
        let backend = self
        route(router, .post, Self.aliasesPath) { request, context, principal in
            try await backend.linkAliases(request, context, principal)
        }
        // `GET /subscriptions-api/internal/v1/users/{id}?applicationId=`: `{"appUserId", "aliases"}`, the user
        // `id` stands for (itself when no app linked it) and that user's other ids. For the worker.
        route(router, .get, Self.userPath) { request, context, principal in
            guard let id = Self.pathUserId(context, bounded: false) else { return Self.badPathUserId(bounded: false) }
            let app: RelayConfiguration.App
            switch backend.userApp(applicationId: request.uri.queryParameters.get("applicationId").map { String($0) }, principal: principal) {
            case .success(let found): app = found
            case .failure(let problem): return problem.response
            }
            return json(.ok, try await backend.database.appUser(id, applicationId: app.applicationId).json)
        }
        route(router, .put, Self.attributesPath) { request, context, principal in
            try await backend.setAttributes(request, context, principal)
        }
    }

    /// `PUT /subscriptions-api/public/v1/users/{id}/attributes` with `{"attributes": {"name": value}}`: strings
    /// (at most 500 characters), numbers and bools are stored for the user `id` stands for, `null` deletes;
    /// at most 64 names in a request and 64 a user (400 `bad_request` naming the problem, nothing stored).
    /// 200 `{"attributes": {...}}` with all of the user's. The user's later webhooks carry them.
    private func setAttributes(_ request: Request, _ context: BackendRequestContext, _ principal: BackendPrincipal) async throws -> Response {
        let (id, app, document): (String, RelayConfiguration.App, JSON?)
        switch try await userRequest(request, context, principal) {
        case .success(let found): (id, app, document) = found
        case .failure(let problem): return problem.response
        }
        guard let updates = document?["attributes"]?.objectValue else {
            return errorResponse(.badRequest, "bad_request", #"the body must be {"attributes": {"name": value}}"#)
        }
        guard updates.count <= SubscriptionDatabase.maximumAttributes else {
            return errorResponse(.badRequest, "bad_request", "at most \(SubscriptionDatabase.maximumAttributes) attributes a request")
        }
        if let name = updates.keys.first(where: { name in
            name.isEmpty || name.utf8.count > SubscriptionDatabase.maximumAttributeNameBytes
                || name.unicodeScalars.contains { $0.properties.generalCategory == .control }
        }) {
            return errorResponse(
                .badRequest, "bad_request",
                "attribute names are 1 to \(SubscriptionDatabase.maximumAttributeNameBytes) bytes without control characters (\(name.prefix(64).debugDescription))")
        }
        do {
            switch try await database.setAttributes(updates, of: id, applicationId: app.applicationId, now: clock()) {
            case .success(let all): return json(.ok, ["attributes": .object(all)])
            case .failure(let problem): return errorResponse(.badRequest, "bad_request", problem.detail)
            }
        } catch is SubscriptionDatabase.AttributeLimit {
            return errorResponse(.badRequest, "bad_request", "a user has at most \(SubscriptionDatabase.maximumAttributes) attributes; delete some with null")
        }
    }

    private func linkAliases(_ request: Request, _ context: BackendRequestContext, _ principal: BackendPrincipal) async throws -> Response {
        let (user, app, document): (String, RelayConfiguration.App, JSON?)
        switch try await userRequest(request, context, principal) {
        case .success(let found): (user, app, document) = found
        case .failure(let problem): return problem.response
        }
        guard let list = document?["aliasIds"]?.arrayValue else {
            return errorResponse(.badRequest, "bad_request", #"the body must be {"aliasIds": ["<id>", ...]}"#)
        }
        let ids = list.compactMap(\.stringValue)
        guard ids.count == list.count, (1...Self.maximumAliasesPerRequest).contains(ids.count) else {
            return errorResponse(.badRequest, "bad_request", "aliasIds must hold 1 to \(Self.maximumAliasesPerRequest) strings")
        }
        guard ids.allSatisfy(Self.isValidId) else {
            return errorResponse(.badRequest, "bad_request", "each alias id is 1 to \(Self.maximumIdBytes) bytes without control characters")
        }
        switch try await database.link(aliases: ids, to: user, applicationId: app.applicationId, policy: app.transferPolicy, now: clock()) {
        case .ownedByAnotherUser:
            return errorResponse(
                .conflict, "owned_by_another_user", "an id belongs to another user of this app, and the app's transferPolicy is keep; nothing was linked")
        case .linked(let linked):
            let (_, all) = try await database.userIds(of: linked, applicationId: app.applicationId)
            var subscriptions = try await database.subscriptions(ofUsers: all)
            subscriptions.removeAll { $0.applicationId != app.applicationId }
            return json(.ok, entitlements(of: subscriptions).json)
        }
    }

    /// What a user route with a JSON body starts from: the path's user id (`pathUserId`), the app it acts
    /// in (`userApp`), and the body parsed (nil when it is not JSON).
    func userRequest(_ request: Request, _ context: BackendRequestContext, _ principal: BackendPrincipal) async throws
        -> Result<(String, RelayConfiguration.App, JSON?), RouteProblem>
    {
        guard let id = Self.pathUserId(context, bounded: true) else { return .failure(RouteProblem(response: Self.badPathUserId(bounded: true))) }
        switch userApp(applicationId: request.uri.queryParameters.get("applicationId").map { String($0) }, principal: principal) {
        case .success(let app):
            let body = try await request.body.collect(upTo: 64 * 1024)
            return .success((id, app, try? JSON.parse(Array(body.readableBytesView))))
        case .failure(let problem):
            return .failure(problem)
        }
    }

    /// The app a user route acts in: a public key's own (`?applicationId=` naming another is 403); with
    /// another key, the one `?applicationId=` names, or the only configured app.
    func userApp(applicationId: String?, principal: BackendPrincipal) -> Result<RelayConfiguration.App, RouteProblem> {
        if case .publicApp(let key, let ownApplicationId) = principal {
            if let applicationId, applicationId != String(ownApplicationId) {
                return .failure(RouteProblem(response: self.forbidden("this key acts for its own app's users only")))
            }
            guard let app = configuration.apps.first(where: { $0.key == key }) else {
                return .failure(RouteProblem(response: errorResponse(.notFound, "not_found", "this key's app is not configured")))
            }
            return .success(app)
        }
        if let applicationId {
            guard let id = Int(applicationId), let app = configuration.apps.first(where: { $0.applicationId == id }) else {
                return .failure(RouteProblem(response: errorResponse(.notFound, "not_found", "no application \(applicationId)")))
            }
            return .success(app)
        }
        guard configuration.apps.count == 1 else {
            return .failure(
                RouteProblem(
                    response: errorResponse(
                        .badRequest, "bad_request",
                        "several apps are configured; pass ?applicationId= (one of \(configuration.apps.map { String($0.applicationId) }.joined(separator: ", ")))")))
        }
        return .success(configuration.apps[0])
    }

    /// Every id the request's ids stand for, in each app the key reaches (aliases belong to an application).
    func allUserIds(_ ids: [String], applicationIds: Set<Int>?) async throws -> [String] {
        try await database.allUserIds(of: ids, applicationIds: applicationIds)
    }
}
