import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import RelayCore

extension LocalBackend {
    public static let eventsPath = "/subscriptions-api/internal/v1/events"
    public static let revenuePath = "/subscriptions-api/internal/v1/revenue"
    public static let metricsPath = "/subscriptions-api/internal/v1/metrics"
    /// Events (or subscriptions) per page of a JSON answer unless `limit` says otherwise, and its largest `limit`.
    static let defaultPageSize = 100
    static let maximumPageSize = 1_000
    /// Rows read from the database at a time while streaming NDJSON: what an export holds in memory.
    static let exportBatchSize = 500

    /// `GET /subscriptions-api/internal/v1/events` (filtered, cursor-paginated JSON, or NDJSON with
    /// `Accept: application/x-ndjson`) and `GET /subscriptions-api/internal/v1/revenue`.
    ///
    /// A read key reads its apps' rows only: without `app` the query is narrowed to them, and an `app`
    /// outside them is 403 `forbidden`.
    func addEventRoutes(to router: Router<BackendRequestContext>) {
        let events = self.events
        let backend = self
        route(router, .get, Self.eventsPath) { request, _, principal in
            let filter: EventFilter
            let limit: Int
            let cursor: Int64?
            do {
                filter = try EventQueryParameters.filter(request.uri.queryParameters, readableBy: principal)
                limit = try EventQueryParameters.limit(request.uri.queryParameters)
                cursor = try EventQueryParameters.cursor(request.uri.queryParameters)
            } catch let invalid as EventQueryParameters.Invalid {
                return invalid.response(events: backend)
            }
            if request.headers[.accept]?.contains("application/x-ndjson") == true {
                return Self.export(events, filter: filter, after: cursor)
            }
            let page = try await events.page(filter, after: cursor, limit: limit)
            // The payloads are stored as delivered: the answer is assembled around them, not re-encoded.
            var body = ByteBuffer(string: "{\"events\":[")
            for (index, payload) in page.payloads.enumerated() {
                if index > 0 { body.writeString(",") }
                body.writeString(payload)
            }
            body.writeString("],\"nextCursor\":\(page.next.map { "\"\($0)\"" } ?? "null")}")
            return Response(status: .ok, headers: [.contentType: "application/json"], body: ResponseBody(byteBuffer: body))
        }
        route(router, .get, Self.revenuePath) { request, _, principal in
            let filter: EventFilter
            let groupBy: [RevenueGrouping]
            do {
                filter = try EventQueryParameters.filter(request.uri.queryParameters, defaultEnvironment: "PRODUCTION", readableBy: principal)
                groupBy = try EventQueryParameters.groupBy(request.uri.queryParameters)
            } catch let invalid as EventQueryParameters.Invalid {
                return invalid.response(events: backend)
            }
            let report = try await events.revenue(filter, groupBy: groupBy)
            return json(.ok, report.json)
        }
        // `GET .../metrics?since=&until=[&app=][&store=][&environment=]`: the overview's metrics, a row a UTC
        // day (docs/metrics.md). `since` and `until` are required; at most `EventStore.maximumMetricsDays` days.
        route(router, .get, Self.metricsPath) { request, _, principal in
            let filter: EventFilter
            do {
                filter = try EventQueryParameters.filter(request.uri.queryParameters, defaultEnvironment: "PRODUCTION", readableBy: principal)
            } catch let invalid as EventQueryParameters.Invalid {
                return invalid.response(events: backend)
            }
            guard let since = filter.since, let until = filter.until, since < until else {
                return errorResponse(.badRequest, "bad_request", "since and until are required, since before until (a date, an RFC 3339 time or Unix ms)")
            }
            guard until - EventStore.dayStart(since) <= EventStore.maximumMetricsDays * 86_400_000 else {
                return errorResponse(.badRequest, "bad_request", "at most \(EventStore.maximumMetricsDays) days at a time")
            }
            let days = try await events.metrics(filter, since: since, until: until, now: backend.clock())
            return json(.ok, ["days": .array(days.map(\.json))])
        }
    }

    /// Every matching event as one JSON line each, read `exportBatchSize` rows at a time and written as
    /// the client takes them: an export of any size holds one batch in memory.
    static func export(_ events: EventStore, filter: EventFilter, after cursor: Int64?) -> Response {
        Response(
            status: .ok, headers: [.contentType: "application/x-ndjson"],
            body: ResponseBody { writer in
                var next = cursor
                repeat {
                    let page = try await events.page(filter, after: next, limit: exportBatchSize)
                    var buffer = ByteBuffer()
                    for payload in page.payloads {
                        buffer.writeString(payload)
                        buffer.writeString("\n")
                    }
                    if buffer.readableBytes > 0 { try await writer.write(buffer) }
                    next = page.next
                } while next != nil
                try await writer.finish(nil)
            })
    }
}

/// The events and revenue routes' query parameters, checked; errors say which parameter and what it takes.
enum EventQueryParameters {
    struct Invalid: Error {
        var message: String
        /// A filter outside the key's rows: 403, not 400.
        var forbidden = false

        func response(events backend: LocalBackend) -> Response {
            forbidden ? backend.forbidden(message) : errorResponse(.badRequest, "bad_request", message)
        }
    }

    /// The `appUserId` filter, refused with a control character: it would name another user's rows
    /// (`AppUser.hasControlCharacters`).
    static func userId(_ parameters: Hummingbird.Parameters) throws(Invalid) -> String? {
        guard let text = parameters["appUserId"].map(String.init) else { return nil }
        guard !AppUser.hasControlCharacters(text) else { throw Invalid(message: "appUserId: an id has no control characters") }
        return text
    }

    /// The filter the parameters ask for, narrowed to the rows `principal` may read.
    static func filter(
        _ parameters: Hummingbird.Parameters, defaultEnvironment: String? = nil, readableBy principal: BackendPrincipal = .secret
    ) throws(Invalid) -> EventFilter {
        var filter = EventFilter()
        filter.app = parameters["app"].map(String.init)
        if let allowed = principal.apps {
            if let app = filter.app {
                guard allowed.contains(app) else { throw Invalid(message: "app: this key reads the rows of its own apps only", forbidden: true) }
            } else if allowed.count == 1 {
                filter.app = allowed.first
            } else {
                filter.apps = allowed.sorted()
            }
        }
        filter.appUserId = try userId(parameters)
        filter.originalTransactionId = parameters["originalTransactionId"].map(String.init)
        filter.notificationId = parameters["notificationId"].map(String.init)
        if let text = parameters["type"] {
            for name in text.split(separator: ",") {
                guard let type = EventType(rawValue: String(name)) else {
                    throw Invalid(message: "type: \(name) is not an event type; use \(EventType.allCases.map(\.rawValue).joined(separator: ", "))")
                }
                filter.types.append(type)
            }
        }
        if let text = parameters["store"] {
            let name = String(text)
            guard let store = Store(rawValue: name) ?? Store.allCases.first(where: { ProductMapping.storeName($0) == name }) else {
                throw Invalid(message: "store: use apple, google, stripe or paddle (or APP_STORE, PLAY_STORE, STRIPE, PADDLE)")
            }
            filter.store = store
        }
        if let text = parameters["environment"] {
            guard ["PRODUCTION", "SANDBOX", "ALL"].contains(text.uppercased()) else { throw Invalid(message: "environment: use PRODUCTION, SANDBOX or ALL") }
            filter.environment = text.uppercased() == "ALL" ? nil : text.uppercased()
        } else {
            filter.environment = defaultEnvironment
        }
        filter.since = try time(parameters["since"].map(String.init), "since")
        filter.until = try time(parameters["until"].map(String.init), "until")
        if let text = parameters["historical"] {
            guard let flag = Bool(String(text)) else { throw Invalid(message: "historical: use true or false") }
            filter.historical = flag
        }
        return filter
    }

    /// Unix milliseconds, an RFC 3339 time, or a date (its midnight UTC).
    static func time(_ text: String?, _ name: String) throws(Invalid) -> Int64? {
        guard let text else { return nil }
        if let milliseconds = Timestamp.milliseconds(dateOrTime: text, unixMilliseconds: true) { return milliseconds }
        throw Invalid(message: "\(name): use Unix milliseconds, an RFC 3339 time (2026-11-24T08:00:00Z) or a date (2026-11-24)")
    }

    static func limit(_ parameters: Hummingbird.Parameters) throws(Invalid) -> Int {
        guard let text = parameters["limit"] else { return LocalBackend.defaultPageSize }
        guard let limit = Int(String(text)), (1...LocalBackend.maximumPageSize).contains(limit) else {
            throw Invalid(message: "limit: use a number from 1 to \(LocalBackend.maximumPageSize)")
        }
        return limit
    }

    static func cursor(_ parameters: Hummingbird.Parameters) throws(Invalid) -> Int64? {
        guard let text = parameters["cursor"] else { return nil }
        guard let cursor = Int64(String(text)), cursor >= 0 else { throw Invalid(message: "cursor: pass a previous answer's nextCursor unchanged") }
        return cursor
    }

    static func groupBy(_ parameters: Hummingbird.Parameters) throws(Invalid) -> [RevenueGrouping] {
        guard let text = parameters["groupBy"], !text.isEmpty else { return [] }
        var groupings: [RevenueGrouping] = []
        for name in text.split(separator: ",") {
            guard let grouping = RevenueGrouping(rawValue: String(name)) else {
                throw Invalid(message: "groupBy: \(name) is not a grouping; use \(RevenueGrouping.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            if !groupings.contains(grouping) { groupings.append(grouping) }
        }
        return groupings
    }
}

extension RevenueReport {
    /// `{"currency": "USD", "groupBy": [...], "rows": [{"day": ..., "gross", "refunds", "net", "proceeds", "purchases", "refundCount"}], "total": {...}, "eventsWithoutRate": n}`.
    var json: JSON {
        func sums(_ gross: Double, _ refunds: Double, _ net: Double, _ proceeds: Double, _ purchases: Int, _ refundCount: Int) -> [String: JSON] {
            [
                "gross": .number(gross), "refunds": .number(refunds), "net": .number(net), "proceeds": .number(proceeds),
                "purchases": .integer(Int64(purchases)), "refundCount": .integer(Int64(refundCount)),
            ]
        }
        let total = sums(
            Self.cents(rows.map(\.gross)), Self.cents(rows.map(\.refunds)), Self.cents(rows.map(\.net)), Self.cents(rows.map(\.proceeds)),
            rows.map(\.purchases).reduce(0, +), rows.map(\.refundCount).reduce(0, +))
        return [
            "currency": "USD", "groupBy": .array(groupBy.map { .string($0.rawValue) }),
            "rows": .array(rows.map { row in
                var object = sums(row.gross, row.refunds, row.net, row.proceeds, row.purchases, row.refundCount)
                for (key, value) in row.group { object[key] = value.map(JSON.string) ?? .null }
                return .object(object)
            }),
            "total": .object(total), "eventsWithoutRate": .integer(Int64(eventsWithoutRate)),
        ]
    }

    /// The groups' sums added, to the cent (each group's sum is already rounded by SQL).
    private static func cents(_ values: [Double]) -> Double {
        (values.reduce(0, +) * 100).rounded() / 100
    }
}
