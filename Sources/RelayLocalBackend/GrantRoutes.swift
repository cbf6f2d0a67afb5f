import Foundation
import GRDB
import Hummingbird
public import Logging
public import RelayConfig
public import RelayCore
public import ServiceLifecycle
import Synchronization

extension SubscriptionDatabase {
    /// The index the grants' schedule reads: active grants by their end.
    static func createGrantExpiryIndex(_ db: Database) throws {
        try db.execute(
            sql: """
                CREATE INDEX subscription_grant_expiry ON subscription (json_extract(state, '$.expiresAt'))
                WHERE store = 'promotional' AND json_extract(state, '$.status') = 'ACTIVE'
                """)
    }

    /// The active promotional grants whose end is at or before `now` (Unix ms), soonest first, at most `limit`.
    public func dueGrants(now: Int64, limit: Int = 1_000) async throws -> [SubscriptionState] {
        try await pool.read { db in
            let rows = try Row.fetchAll(
                db.cachedStatement(
                    sql: """
                        SELECT state FROM subscription
                        WHERE store = 'promotional' AND json_extract(state, '$.status') = 'ACTIVE'
                            AND json_extract(state, '$.expiresAt') <= ?
                        ORDER BY json_extract(state, '$.expiresAt') LIMIT ?
                        """),
                arguments: [now, limit])
            return try rows.map { row in try Self.decode(row[0]) }
        }
    }

    /// When the next active promotional grant ends (Unix ms); nil when none does.
    public func nextGrantExpiry() async throws -> Int64? {
        try await pool.read { db in
            try Int64.fetchOne(
                db,
                sql: """
                    SELECT MIN(json_extract(state, '$.expiresAt')) FROM subscription
                    WHERE store = 'promotional' AND json_extract(state, '$.status') = 'ACTIVE'
                    """)
        }
    }
}

extension LocalBackend {
    static let grantsPath = "/subscriptions-api/internal/v1/users/:appUserId/grants"
    static let grantPath = "/subscriptions-api/internal/v1/users/:appUserId/grants/:grantId"
    /// A reason is at most this many characters.
    static let maximumGrantReason = 500

    /// `POST /subscriptions-api/internal/v1/users/{appUserId}/grants` and `DELETE .../grants/{grantId}`
    /// (secret key): promotional entitlements (docs/identity.md, Grants).
    ///
    /// A grant goes through the pipeline like a purchase: a record (`relay-store: promotional`,
    /// `relay-source: grant`) on `relay.notifications`, which the worker applies to a subscription of store
    /// `promotional`, with `non_renewing_purchase` (price 0), the status change, and `expiration` when it is
    /// revoked or its time runs out (`GrantExpiry` appends that at its end). The routes wait for the worker
    /// up to a bound; 201 (or 200 for a revocation) once applied, 202 when the wait ran out (it will be).
    func addGrantRoutes(to router: Router<BackendRequestContext>) {
        let backend = self
        route(router, .post, Self.grantsPath) { request, context, _ in
            try await backend.grant(request, context)
        }
        route(router, .delete, Self.grantPath) { _, context, _ in
            try await backend.revokeGrant(context)
        }
    }

    private func grant(_ request: Request, _ context: BackendRequestContext) async throws -> Response {
        guard let intake = appPurchases else {
            return errorResponse(.notFound, "not_found", "this backend process does not take grants (it has no record log)")
        }
        guard let user = Self.pathUserId(context, bounded: true) else { return Self.badPathUserId(bounded: true) }
        let body = try await request.body.collect(upTo: 64 * 1024)
        guard let document = try? JSON.parse(Array(body.readableBytesView)), case .object = document else {
            return errorResponse(
                .badRequest, "bad_request", #"the body must be {"app", "entitlement", and one of "expiresAt" (ms), "duration" ("P1M") or "lifetime": true}"#)
        }
        let now = clock()
        let request: GrantRequest
        switch GrantRequest.parse(document, now: now, apps: configuration.apps) {
        case .success(let parsed): request = parsed
        case .failure(let problem): return errorResponse(.badRequest, "bad_request", problem.detail)
        }
        let record = PromotionalGrant.Record(
            action: .grant, grantId: Self.newGrantId(), appUserId: user, entitlement: request.entitlement, expiresAt: request.expiresAt,
            reason: request.reason, at: now)
        guard try await append(record, app: request.app, intake: intake, context: context) else {
            return errorResponse(.serviceUnavailable, "not_stored", "the grant could not be stored; try again")
        }
        let applied = try await waitForApplied(record.notificationId, store: .promotional, subject: record.grantId, within: intake.wait)
        return json(applied == nil ? .accepted : .created, Self.grantJSON(record, app: request.app.key, state: applied))
    }

    private func revokeGrant(_ context: BackendRequestContext) async throws -> Response {
        guard let intake = appPurchases else {
            return errorResponse(.notFound, "not_found", "this backend process does not take grants (it has no record log)")
        }
        guard let user = Self.pathUserId(context, bounded: true),
            let grantId = context.parameters.get("grantId")?.removingPercentEncoding, Self.isValidId(grantId)
        else {
            return errorResponse(
                .badRequest, "bad_request", "the user id and grant id are required, each at most \(Self.maximumIdBytes) bytes without control characters")
        }
        // A grant of another user is not found: the route does not say whose it is.
        guard let state = try await database.subscription(store: .promotional, originalTransactionId: grantId),
            let owner = state.originalAppUserId, try await sameUser(owner, user, applicationId: state.applicationId),
            let app = configuration.apps.first(where: { $0.applicationId == state.applicationId }),
            let entitlement = PromotionalGrant.entitlement(ofProductId: state.productId)
        else {
            return errorResponse(.notFound, "not_found", "no grant \(grantId.prefix(64)) for this user")
        }
        let record = PromotionalGrant.Record(
            action: .revoke, grantId: grantId, appUserId: owner, entitlement: entitlement, expiresAt: state.expiresAt, reason: nil, at: clock())
        // Ended already (revoked, or its time ran out: the schedule ends it, as UNKNOWN): nothing to do.
        guard state.status == .active, state.expiresAt.map({ $0 > record.at }) ?? true else {
            return json(.ok, Self.grantJSON(record, app: app.key, state: state))
        }
        guard try await append(record, app: app, intake: intake, context: context) else {
            return errorResponse(.serviceUnavailable, "not_stored", "the revocation could not be stored; try again")
        }
        let applied = try await waitForApplied(record.notificationId, store: .promotional, subject: grantId, within: intake.wait)
        return json(applied == nil ? .accepted : .ok, Self.grantJSON(record, app: app.key, state: applied ?? state))
    }

    /// Appends a grant's record; false (logged) when the log refused it.
    func append(_ record: PromotionalGrant.Record, app: RelayConfiguration.App, intake: AppPurchases, context: BackendRequestContext?) async throws
        -> Bool
    {
        let notification = RawNotification(
            store: .promotional, app: app.key, receivedAtMilliseconds: clock(), body: record.json.serialized(), requestHeaders: [:],
            source: PromotionalGrant.source)
        do {
            try await intake.append(notification.record(topic: intake.topic, subject: record.grantId))
            return true
        } catch {
            (context?.logger ?? Logger(label: "revenue-relay")).error(
                "appending a grant's record failed",
                metadata: [LogKey.notificationApp: "\(app.key)", LogKey.notificationId: "\(record.notificationId)", LogKey.error: "\(error)"])
            return false
        }
    }

    /// `{"grantId", "appUserId", "app", "entitlement", "expiresAt", "reason", "store", "status"}`: the status
    /// as stored (`ACTIVE`, `EXPIRED`, `REVOKED`), `PENDING` while the worker has not applied it.
    static func grantJSON(_ record: PromotionalGrant.Record, app: String, state: SubscriptionState?) -> JSON {
        [
            "grantId": .string(record.grantId), "appUserId": .string(record.appUserId), "app": .string(app),
            "entitlement": .string(record.entitlement), "expiresAt": record.expiresAt.map(JSON.integer) ?? .null,
            "lifetime": .bool(record.expiresAt == nil), "reason": record.reason.map(JSON.string) ?? .null, "store": "PROMOTIONAL",
            "status": .string(state?.status.rawValue ?? "PENDING"),
        ]
    }

    /// `grant_` and 32 hex digits of randomness.
    static func newGrantId() -> String {
        var generator = SystemRandomNumberGenerator()
        return "grant_" + (0..<16).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &generator)) }.joined()
    }

    /// The state once the worker applied the notification `id` to it; nil when `wait` passed first.
    func waitForApplied(_ id: String, store: Store, subject: String, within wait: Duration) async throws -> SubscriptionState? {
        let deadline = ContinuousClock.now + wait
        while true {
            if let state = try await database.subscription(store: store, originalTransactionId: subject),
                state.recentNotifications.contains(where: { $0.id == id })
            {
                return state
            }
            guard ContinuousClock.now < deadline else { return nil }
            try await Task.sleep(for: .milliseconds(20))
        }
    }
}

/// A grant request's body, checked.
struct GrantRequest {
    var app: RelayConfiguration.App
    var entitlement: String
    /// Unix ms; nil for a lifetime grant.
    var expiresAt: Int64?
    var reason: String?

    struct Problem: Error {
        var detail: String
    }

    static func parse(_ document: JSON, now: Int64, apps: [RelayConfiguration.App]) -> Result<GrantRequest, Problem> {
        guard let key = document["app"]?.stringValue, let app = apps.first(where: { $0.key == key }) else {
            return .failure(Problem(detail: "app must name a configured app (one of \(apps.map(\.key).joined(separator: ", ")))"))
        }
        guard let entitlement = document["entitlement"]?.stringValue, LocalBackend.isValidId(entitlement) else {
            return .failure(Problem(detail: "entitlement must be 1 to \(LocalBackend.maximumIdBytes) bytes without control characters"))
        }
        let reason = document["reason"]?.stringValue
        if let reason, reason.count > LocalBackend.maximumGrantReason {
            return .failure(Problem(detail: "reason is at most \(LocalBackend.maximumGrantReason) characters"))
        }
        let lifetimeDuration = document["duration"]?.stringValue == "lifetime"
        let lifetime = document["lifetime"]?.boolValue == true || lifetimeDuration
        let given = [
            document["expiresAt"] != nil, document["duration"] != nil && !lifetimeDuration, document["lifetime"]?.boolValue == true || lifetimeDuration,
        ].filter { $0 }.count
        guard given == 1 else {
            return .failure(Problem(detail: #"give exactly one of "expiresAt" (Unix ms), "duration" (ISO 8601, "P1M", "P7D", "PT12H") or "lifetime": true"#))
        }
        var expiresAt: Int64?
        if let value = document["expiresAt"] {
            guard let time = value.int64Value else { return .failure(Problem(detail: "expiresAt must be Unix milliseconds")) }
            expiresAt = time
        } else if !lifetime {
            guard let text = document["duration"]?.stringValue, let end = ISODuration(text)?.added(to: now) else {
                return .failure(Problem(detail: #"duration must be an ISO 8601 duration such as "P1M", "P1Y", "P7D" or "PT12H""#))
            }
            expiresAt = end
        }
        if let expiresAt, expiresAt <= now {
            return .failure(Problem(detail: "the grant would end before it starts (expiresAt \(expiresAt) is not after now, \(now))"))
        }
        return .success(GrantRequest(app: app, entitlement: entitlement, expiresAt: expiresAt, reason: reason))
    }
}

/// An ISO 8601 duration (`P1Y2M10DT2H30M`, `P2W`), added in UTC calendar terms: a month from January 31
/// ends on the last day of February.
struct ISODuration: Equatable {
    var components = DateComponents()

    init?(_ text: String) {
        var rest = Substring(text.uppercased())
        guard rest.hasPrefix("P"), rest.count > 1 else { return nil }
        rest = rest.dropFirst()
        var inTime = false
        var number = ""
        var any = false
        for character in rest {
            if character == "T" {
                guard !inTime, number.isEmpty else { return nil }
                inTime = true
            } else if character.isASCII, character.isNumber {
                number.append(character)
            } else {
                guard let value = Int(number), value <= 100_000 else { return nil }
                number = ""
                any = true
                switch (character, inTime) {
                case ("Y", false): components.year = value
                case ("M", false): components.month = value
                case ("W", false): components.day = (components.day ?? 0) + 7 * value
                case ("D", false): components.day = (components.day ?? 0) + value
                case ("H", true): components.hour = value
                case ("M", true): components.minute = value
                case ("S", true): components.second = value
                default: return nil
                }
            }
        }
        guard any, number.isEmpty else { return nil }
    }

    /// `start` (Unix ms) plus this duration; nil when out of range.
    func added(to start: Int64) -> Int64? {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        let date = Date(timeIntervalSince1970: Double(start) / 1000)
        guard let end = calendar.date(byAdding: components, to: date) else { return nil }
        return Int64((end.timeIntervalSince1970 * 1000).rounded())
    }
}

/// Ends promotional grants on time: appends each due grant's `expire` record, whether or not anything
/// else happens (the backend role runs it when it has the record log). It looks at the grants' next
/// end, at least once a second; a due grant whose record the worker has not applied yet is appended
/// again after `retryAfter` (the record is recognized by its id, so a repeat changes nothing).
public struct GrantExpiry: Service {
    let backend: LocalBackend
    let logger: Logger
    /// How long it sleeps at most between looks.
    let tick: Duration
    let retryAfter: Int64

    public init(backend: LocalBackend, logger: Logger, tick: Duration = .seconds(1), retryAfterMilliseconds: Int64 = 60_000) {
        self.backend = backend
        self.logger = logger
        self.tick = tick
        self.retryAfter = retryAfterMilliseconds
    }

    public func run() async throws {
        let appended = Mutex<[String: Int64]>([:])
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                let wait: Duration
                do {
                    wait = try await expireDue(appended)
                } catch {
                    logger.warning("reading the grants that end failed; trying again", metadata: [LogKey.error: "\(error)"])
                    wait = tick
                }
                try await Task.sleep(for: wait)
            }
        }
    }

    /// Appends the due grants' records; returns how long to sleep before the next look.
    func expireDue(_ appended: borrowing Mutex<[String: Int64]>) async throws -> Duration {
        guard let intake = backend.appPurchases else { return tick }
        let now = backend.clock()
        for state in try await backend.database.dueGrants(now: now) {
            let id = state.originalTransactionId
            if let last = appended.withLock({ $0[id] }), now - last < retryAfter { continue }
            guard let owner = state.originalAppUserId, let entitlement = PromotionalGrant.entitlement(ofProductId: state.productId),
                let app = backend.configuration.apps.first(where: { $0.applicationId == state.applicationId })
            else { continue }
            let record = PromotionalGrant.Record(
                action: .expire, grantId: id, appUserId: owner, entitlement: entitlement, expiresAt: state.expiresAt, reason: nil,
                at: state.expiresAt ?? now)
            if try await backend.append(record, app: app, intake: intake, context: nil) {
                appended.withLock { $0[id] = now }
            }
        }
        appended.withLock { memory in memory = memory.filter { now - $0.value < retryAfter * 2 } }
        // Due ones were just appended (or will be tried again): the next look is for the ones to come.
        guard let next = try await backend.database.nextGrantExpiry(), next > now else { return tick }
        return min(.milliseconds(next - now), tick)
    }
}
