import Foundation
import Hummingbird
import Logging
import RelayConfig
public import RelayCore

/// What the app-transaction route needs from outside this module, wired by RelayApp: Apple's signature
/// checks (RelayVerification, which the backend does not import) and the record log.
public struct AppTransactionGrants: Sendable {
    /// Verifies a signed AppTransaction for an app key with the app's Apple rules; the decoded payload
    /// or why it is refused.
    public typealias Verify = @Sendable (_ app: String, _ signedAppTransaction: String) -> Result<JSON, Rejection>
    /// Appends a record to the log and returns once it is acknowledged.
    public typealias Append = @Sendable (_ record: OutgoingRecord) async throws -> Void

    let verify: Verify
    let append: Append
    /// `relay.notifications` (the configured name).
    let topic: String

    public init(topic: String, verify: @escaping Verify, append: @escaping Append) {
        self.topic = topic
        self.verify = verify
        self.append = append
    }
}

extension LocalBackend {
    /// `POST /subscriptions-api/public/v1/users/{appUserIdOrDeviceId}/app-transaction` with
    /// `{"signedAppTransaction": "<JWS>"}`: grandfathered access for a customer who bought the app before
    /// it moved to subscriptions (`apps[].apple.grandfathering`).
    ///
    /// The AppTransaction is verified with the app's Apple rules, then the app's rules are evaluated in
    /// order. When one matches, the grant goes through the normal pipeline: a raw notification record
    /// (`relay-source: app-transaction`) is appended to `relay.notifications`, and the worker verifies it
    /// again and writes the grant, so `subscription_status_did_change` and customer info come from the
    /// same machinery as purchases. 202 `{"granted": true, "entitlements"}` once the record is durable;
    /// 200 `{"granted": false}` when no rule matches; 400 with the reject reason for a refused JWS (the
    /// verifier takes only Production AppTransactions, or Sandbox ones for an app without Production, and
    /// never unsigned Xcode/LocalTesting ones); 403 `revoked` for a refunded app purchase.
    ///
    /// One AppTransaction grants one app user: a signed AppTransaction is a bearer artifact, so once its
    /// grant (`apple/app-transaction:<id>`) belongs to a user, another user gets 409 `already_granted`
    /// and nothing is appended (the worker, for a race of two first grants, adds nobody either).
    ///
    /// With a public key the app is the key's own (it needs an apple section); `?applicationId=` naming
    /// another application is 403 `forbidden`.
    func addAppTransactionRoutes(to router: Router<BackendRequestContext>) {
        let backend = self
        route(router, .post, Self.appTransactionPath) { request, context, principal in
            try await backend.grantAppTransaction(request, context, principal)
        }
    }

    private func grantAppTransaction(_ request: Request, _ context: BackendRequestContext, _ principal: BackendPrincipal) async throws -> Response {
        guard let grants = appTransactions else {
            return errorResponse(.notFound, "not_found", "this backend process does not take AppTransactions (it has no record log)")
        }
        guard let user = Self.pathUserId(context, bounded: true) else { return Self.badPathUserId(bounded: true) }
        let app: RelayConfiguration.App
        switch grandfatheringApp(applicationId: request.uri.queryParameters.get("applicationId").map { String($0) }, principal: principal) {
        case .success(let found): app = found
        case .failure(let problem): return problem.response
        }
        let body = try await request.body.collect(upTo: 64 * 1024)
        guard let document = try? JSON.parse(Array(body.readableBytesView)), let signed = document["signedAppTransaction"]?.stringValue, !signed.isEmpty
        else {
            return errorResponse(.badRequest, "bad_request", #"the body must be {"signedAppTransaction": "<JWS>"} (AppTransaction.shared's jwsRepresentation)"#)
        }
        let appTransaction: JSON
        switch grants.verify(app.key, signed) {
        case .success(let payload): appTransaction = payload
        case .failure(let rejection):
            return json(
                .badRequest,
                ["error": "invalid_app_transaction", "reason": .string(rejection.reason.rawValue), "detail": .string(rejection.detail)])
        }
        if let revoked = AppTransactionGrant.revocation(of: appTransaction) {
            return errorResponse(
                .forbidden, "revoked", "the app purchase this AppTransaction records was refunded or revoked (\(revoked)); it grants nothing")
        }
        let rules = app.apple?.grandfathering ?? []
        guard let index = RelayConfiguration.GrandfatheringRule.firstMatch(rules, appTransaction) else {
            return json(.ok, ["granted": false])
        }
        let granted: JSON = ["granted": true, "entitlements": .array(rules[index].entitlements.map(JSON.string))]
        guard let subject = AppTransactionGrant.subject(of: appTransaction) else {
            return errorResponse(.badRequest, "bad_request", "the AppTransaction has neither appTransactionId nor originalPurchaseDate")
        }
        if let stored = try await database.subscription(store: .apple, originalTransactionId: subject) {
            // One user per AppTransaction. The detail does not name the user it belongs to.
            guard AppTransactionGrant.belongs(stored, to: user) else {
                return errorResponse(
                    .conflict, "already_granted", "this AppTransaction's grandfathered access already belongs to another app user; one AppTransaction grants one user")
            }
            // Already granted to this user by this rule: nothing to append (a repeat would change nothing anyway).
            if stored.status == .active, stored.productId == AppTransactionGrant.productId(rule: index) {
                return json(.accepted, granted)
            }
        }
        let notification = RawNotification(
            store: .apple, app: app.key, receivedAtMilliseconds: clock(),
            body: AppTransactionGrant.body(signedAppTransaction: signed, appUserId: user, rule: index), requestHeaders: [:],
            source: AppTransactionGrant.source)
        do {
            try await grants.append(notification.record(topic: grants.topic, subject: subject))
        } catch {
            // The log's error names broker internals: logged, not answered.
            context.logger.error(
                "appending an AppTransaction grant failed",
                metadata: [
                    LogKey.notificationStore: "apple", LogKey.notificationApp: "\(app.key)", LogKey.notificationId: "\(subject)", LogKey.error: "\(error)",
                ])
            return errorResponse(.serviceUnavailable, "not_stored", "the grant could not be stored; try again")
        }
        return json(.accepted, granted)
    }

    struct RouteProblem: Error {
        var response: Response
    }

    /// The app whose rules apply: `?applicationId=` (an app of it with an apple section, preferring one
    /// with rules), else the one app that has grandfathering rules.
    private func grandfatheringApp(applicationId: String?, principal: BackendPrincipal) -> Result<RelayConfiguration.App, RouteProblem> {
        if case .publicApp(let key, let ownApplicationId) = principal {
            if let applicationId, applicationId != String(ownApplicationId) {
                return .failure(RouteProblem(response: self.forbidden("this key grants AppTransactions of its own app only")))
            }
            guard let app = configuration.apps.first(where: { $0.key == key }), app.apple != nil else {
                return .failure(RouteProblem(response: errorResponse(.notFound, "not_found", "this key's app has no apple section")))
            }
            return .success(app)
        }
        if let applicationId {
            guard let id = Int(applicationId) else {
                return .failure(RouteProblem(response: errorResponse(.badRequest, "bad_request", "applicationId must be an integer")))
            }
            let apple = configuration.apps.filter { $0.applicationId == id && $0.apple != nil }
            guard let app = apple.first(where: { !($0.apple?.grandfathering.isEmpty ?? true) }) ?? apple.first else {
                return .failure(RouteProblem(response: errorResponse(.notFound, "not_found", "no application \(id) with an apple section")))
            }
            return .success(app)
        }
        let withRules = configuration.apps.filter { !($0.apple?.grandfathering.isEmpty ?? true) }
        guard withRules.count == 1 else {
            let detail = withRules.isEmpty
                ? "no app has apple.grandfathering rules"
                : "several apps have grandfathering rules; pass ?applicationId= (one of \(withRules.map { String($0.applicationId) }.joined(separator: ", ")))"
            return .failure(RouteProblem(response: errorResponse(.badRequest, "bad_request", detail)))
        }
        return .success(withRules[0])
    }
}
