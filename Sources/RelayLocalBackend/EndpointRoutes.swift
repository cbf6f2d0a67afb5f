import Foundation
public import Hummingbird
import RelayConfig
public import RelayCore

/// What the delivery actions need from outside this module: the log's producer and the deliveries topic
/// (RelayApp wires it). Without it the action routes answer 503.
public struct DeliveryActions: Sendable {
    /// Appends records and returns once the log acknowledged every one.
    public typealias Append = @Sendable (_ records: [OutgoingRecord]) async throws -> Void

    let topic: String
    let partitions: @Sendable () async throws -> Int
    let append: Append

    /// - Parameters:
    ///   - topic: `relay.deliveries` (the configured name).
    ///   - partitions: how many partitions it has now (a control record goes to each).
    public init(topic: String, partitions: @escaping @Sendable () async throws -> Int, append: @escaping Append) {
        self.topic = topic
        self.partitions = partitions
        self.append = append
    }
}

extension LocalBackend {
    public static let endpointsPath = "/subscriptions-api/internal/v1/endpoints"
    public static let endpointEnablePath = "/subscriptions-api/internal/v1/endpoints/:endpointId/enable"
    public static let endpointRecoverPath = "/subscriptions-api/internal/v1/endpoints/:endpointId/recover"
    public static let deliveryResendPath = "/subscriptions-api/internal/v1/deliveries/:deliveryId/resend"
    /// The most failures one recover re-sends; `more` says to call again for the rest.
    static let recoverBatch = 5_000

    /// - `GET /endpoints[?app=][&endpoint=]`: each configured endpoint's health (read keys: their apps').
    /// - `POST /endpoints/{id}/enable`: enables an endpoint a 410 disabled, in every deliverer.
    /// - `POST /endpoints/{id}/recover` with `since` (and `until`, default now): re-sends, once, each event
    ///   whose attempt failed or died in the range and has not succeeded since.
    /// - `POST /deliveries/{id}/resend`: sends the event of one recorded attempt to its endpoint again.
    ///
    /// The actions are the secret key's (docs/delivery.md, "Acting on the delivery log").
    func addEndpointRoutes(to router: Router<BackendRequestContext>) {
        let backend = self
        route(router, .get, Self.endpointsPath) { request, _, principal in
            let parameters = request.uri.queryParameters
            let app = parameters["app"].map(String.init)
            if let app, let allowed = principal.apps, !allowed.contains(app) {
                return backend.forbidden("app: this key reads the endpoints of its own apps only")
            }
            let only = parameters["endpoint"].map(String.init)
            let now = backend.clock()
            var answers: [JSON] = []
            for endpoint in backend.configuration.endpoints {
                if let allowed = principal.apps, !allowed.contains(endpoint.app) { continue }
                if let app, endpoint.app != app { continue }
                if let only, endpoint.id != only { continue }
                let health = try await backend.deliveryLog.health(endpoint: endpoint.id, now: now)
                answers.append(Self.endpointJSON(endpoint, health, now: now))
            }
            if let only, answers.isEmpty { return errorResponse(.notFound, "not_found", "no endpoint \(only) is configured for this key's apps") }
            return json(.ok, ["endpoints": .array(answers), "at": .integer(now)])
        }

        route(router, .post, Self.endpointEnablePath) { _, context, _ in
            let result = try await backend.enable(endpoint: context.parameters.get("endpointId")?.removingPercentEncoding)
            return json(result.status, result.body)
        }

        route(router, .post, Self.endpointRecoverPath) { request, context, _ in
            let body = try? JSON.parse(Array(try await request.body.collect(upTo: 16 * 1024).readableBytesView))
            let parameters = request.uri.queryParameters
            func text(_ name: String) -> String? {
                if let value = parameters.get(name) { return value }
                return body?[name]?.stringValue ?? body?[name]?.int64Value.map { String($0) }
            }
            let result = try await backend.recover(
                endpoint: context.parameters.get("endpointId")?.removingPercentEncoding, since: text("since"), until: text("until"))
            return json(result.status, result.body)
        }

        route(router, .post, Self.deliveryResendPath) { _, context, _ in
            let result = try await backend.resend(attemptId: context.parameters.get("deliveryId")?.removingPercentEncoding)
            return json(result.status, result.body)
        }
    }

    /// What an action answered: the routes send it as JSON, the console as a notice.
    struct ActionResult: Sendable {
        var status: HTTPResponse.Status
        var body: JSON
        var message: String { body["detail"]?.stringValue ?? body.text }
        var succeeded: Bool { (200..<300).contains(status.code) }

        static func refusal(_ status: HTTPResponse.Status, _ code: String, _ detail: String) -> ActionResult {
            ActionResult(status: status, body: ["error": .string(code), "detail": .string(detail)])
        }
    }

    private static let actionsUnavailable = ActionResult.refusal(
        .serviceUnavailable, "unavailable", "this backend does not run next to the log, so it cannot act on deliveries")
    private static let unknownEndpoint = ActionResult.refusal(.notFound, "not_found", "no endpoint with this id is configured")

    /// Enables the endpoint in every deliverer (`POST .../endpoints/{id}/enable`).
    /// The ids the actions take are decoded (the routes decode their path segments).
    func enable(endpoint id: String?) async throws -> ActionResult {
        guard let actions = deliveryActions else { return Self.actionsUnavailable }
        guard let endpoint = endpoint(id) else { return Self.unknownEndpoint }
        let partitions: Int
        do {
            partitions = try await actions.partitions()
            try await actions.append(DeliveryControl.enable.records(topic: actions.topic, endpoint: endpoint.id, partitions: partitions))
        } catch {
            return .refusal(.serviceUnavailable, "not_stored", "the log did not take the request; try again (\(error))")
        }
        return ActionResult(status: .accepted, body: ["endpoint": .string(endpoint.id), "enable": "requested", "partitions": .integer(Int64(partitions))])
    }

    /// Re-sends, once, the failures of a time range (`POST .../endpoints/{id}/recover`).
    func recover(endpoint id: String?, since sinceText: String?, until untilText: String?) async throws -> ActionResult {
        guard let actions = deliveryActions else { return Self.actionsUnavailable }
        guard let endpoint = endpoint(id) else { return Self.unknownEndpoint }
        let now = clock()
        let since: Int64
        let until: Int64
        do {
            guard let start = try EventQueryParameters.time(sinceText, "since") else {
                throw EventQueryParameters.Invalid(message: "since: required (the start of the range whose failures to re-send)")
            }
            since = start
            until = try EventQueryParameters.time(untilText.flatMap { $0.isEmpty ? nil : $0 }, "until") ?? now
            guard since < until else { throw EventQueryParameters.Invalid(message: "until: must be after since") }
        } catch let invalid as EventQueryParameters.Invalid {
            return .refusal(.badRequest, "bad_request", invalid.message)
        }
        let claim = try await deliveryLog.claimFailures(
            endpoint: endpoint.id, since: since, until: until, limit: Self.recoverBatch, now: now)
        var records: [OutgoingRecord] = []
        var unavailable: [String] = []
        for failure in claim.claimed {
            if let record = try await resendRecord(failure, topic: actions.topic, replayedFrom: DeliveryLog.recoverMark(failure)) {
                records.append(record)
            } else {
                unavailable.append(failure.attempt.eventId)
            }
        }
        do {
            if !records.isEmpty { try await actions.append(records) }
        } catch {
            // Not appended: forgotten, so the next recover tries them again.
            try? await deliveryLog.forgetResends(replayedFrom: claim.claimed.map(DeliveryLog.recoverMark))
            return .refusal(.serviceUnavailable, "not_stored", "the log did not take the deliveries; nothing was re-sent; try again (\(error))")
        }
        return ActionResult(
            status: .accepted,
            body: [
                "endpoint": .string(endpoint.id), "since": .integer(since), "until": .integer(until), "resent": .integer(Int64(records.count)),
                "alreadyResent": .integer(Int64(claim.alreadyResent)), "more": .bool(claim.more), "eventsNotRecorded": .array(unavailable.map(JSON.string)),
            ])
    }

    /// Sends one recorded attempt's event to its endpoint again (`POST .../deliveries/{id}/resend`).
    func resend(attemptId: String?) async throws -> ActionResult {
        guard let actions = deliveryActions else { return Self.actionsUnavailable }
        guard let id = attemptId, !id.isEmpty, let recorded = try await deliveryLog.attempt(id: id) else {
            return .refusal(.notFound, "not_found", "no attempt with this id is kept in the delivery log (GET .../deliveries lists them)")
        }
        guard configuration.endpoints.contains(where: { $0.id == recorded.attempt.endpoint }) else {
            return .refusal(.conflict, "endpoint_unknown", "endpoint \(recorded.attempt.endpoint) is no longer configured")
        }
        let mark = "resend:\(recorded.seq):\(clock())"
        guard let record = try await resendRecord(recorded, topic: actions.topic, replayedFrom: mark) else {
            return .refusal(.conflict, "event_not_recorded", "the event \(recorded.attempt.eventId) is not in the events store; it cannot be re-sent")
        }
        // In the ledger first, so a recover running meanwhile does not send it too; forgotten if not appended.
        try await deliveryLog.recordResend(recorded, now: clock(), replayedFrom: mark)
        do {
            try await actions.append([record])
        } catch {
            try? await deliveryLog.forgetResends(replayedFrom: [mark])
            return .refusal(.serviceUnavailable, "not_stored", "the log did not take the delivery; try again (\(error))")
        }
        return ActionResult(
            status: .accepted, body: ["endpoint": .string(recorded.attempt.endpoint), "eventId": .string(recorded.attempt.eventId), "replayedFrom": .string(mark)])
    }

    /// The configured endpoint with this (decoded) id.
    func endpoint(_ id: String?) -> RelayConfiguration.Endpoint? {
        guard let id else { return nil }
        return configuration.endpoints.first { $0.id == id }
    }

    /// The delivery that sends `failure`'s event to its endpoint again: the event's payload as recorded, keyed
    /// like the fan-out's (so it goes in order behind the subscription's other deliveries), marked
    /// `relay-replayed-from` (so it passes an open breaker and a 410, as a replay does). Nil when the event is
    /// not in the events store.
    func resendRecord(_ failure: DeliveryLog.Recorded, topic: String, replayedFrom: String) async throws -> OutgoingRecord? {
        let attempt = failure.attempt
        guard let payload = try await events.payload(id: attempt.eventId) else { return nil }
        var record = DeliveryRecord.fresh(
            topic: topic, endpoint: attempt.endpoint, subject: attempt.subject ?? attempt.eventId, body: Array(payload.utf8), eventID: attempt.eventId,
            eventType: attempt.eventType, app: attempt.app)
        record.headers.append(RecordHeader(name: DeliveryHeaderName.replayedFrom, value: replayedFrom))
        return record
    }

    static func endpointJSON(_ endpoint: RelayConfiguration.Endpoint, _ health: DeliveryLog.Health, now: Int64) -> JSON {
        let status = health.status
        return [
            "id": .string(endpoint.id), "app": .string(endpoint.app),
            // The host only: an endpoint's URL may carry a token in its path or query.
            "host": URL(string: endpoint.url)?.host.map(JSON.string) ?? .null,
            "rateLimit": endpoint.ratePerSecond.map(JSON.number) ?? .null,
            "circuit": .string(status?.circuitOpen == true ? "open" : "closed"), "disabled": .bool(status?.disabled ?? false),
            "pausedUntil": status?.pausedUntil.flatMap { $0 > now ? JSON.integer($0) : nil } ?? .null,
            "statusReportedAt": status.map { .integer($0.at) } ?? .null,
            "lastHour": health.lastHour.json, "lastDay": health.lastDay.json, "lastFailure": health.lastFailure ?? .null,
            "backlog": ["retrying": .integer(Int64(health.retrying)), "throttled": .integer(Int64(health.throttled)), "dead": .integer(Int64(health.dead))],
        ]
    }
}
