import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import RelayConfig
import RelayCore

/// `POST /v1/notifications/{store}/{app}`: writes the request durably to Kafka and answers 200 only
/// once the broker acknowledged it (docs/contracts.md (ingest and the raw record)). Nothing is verified here: that is the
/// worker's job, so a store's retry never depends on our verification state.
struct NotificationIngest: Sendable {
    private let apps: [String: RelayConfiguration.App]
    private let maxBodyBytes: Int
    private let topic: String
    private let producer: any RecordProducer
    private let health: HealthState
    private let metrics: IngestMetrics
    private let logger: Logger

    init(routes: RelayHTTPServer.IngestRoutes, health: HealthState, metrics: IngestMetrics, logger: Logger) {
        apps = RelayConfiguration.appsByKey(routes.apps)
        maxBodyBytes = routes.ingest.maxBodyBytes
        topic = routes.topic
        producer = routes.producer
        self.health = health
        self.metrics = metrics
        self.logger = logger
    }

    func addRoutes(to router: Router<BasicRequestContext>) {
        for store in Store.allCases {
            router.post("/v1/notifications/\(store.rawValue)/:app") { request, context in
                try await receive(store: store, request: request, context: context)
            }
        }
    }

    func receive(store: Store, request: Request, context: BasicRequestContext) async throws -> Response {
        let response = await handle(store: store, request: request, context: context)
        metrics.request(store: store, status: Int(response.status.code))
        return response
    }

    private func handle(store: Store, request: Request, context: BasicRequestContext) async -> Response {
        let receivedAt = Int64((Date().timeIntervalSince1970 * 1000).rounded(.down))
        let started = ContinuousClock.now
        var logger = self.logger
        logger[metadataKey: LogKey.notificationStore] = "\(store.rawValue)"

        guard let appKey = context.parameters.get("app"), let app = apps[appKey], app.accepts(store) else {
            return jsonResponse(.notFound, ["error": "unknown_app", "detail": "no app with this key receives \(store.rawValue) notifications"])
        }
        logger[metadataKey: LogKey.notificationApp] = "\(app.key)"

        // A body the server cannot decode (Transfer-Encoding other than chunked, e.g. gzip) would be stored
        // as compressed bytes and judged malformed: 501 says so, and the store may send it plainly.
        let codings = request.headers[values: .transferEncoding].flatMap { $0.split(separator: ",") }
            .map { $0.trimmingCharacters(in: .whitespaces).lowercased() }.filter { !$0.isEmpty }
        if let unsupported = codings.first(where: { $0 != "chunked" && $0 != "identity" }) {
            return jsonResponse(
                .notImplemented, ["error": "unsupported_transfer_encoding", "detail": .string("Transfer-Encoding \(unsupported) is not supported; send the body plainly or chunked")])
        }

        let limit = maxBodyBytes
        if let length = request.headers[.contentLength].flatMap(Int.init), length > limit {
            return tooLarge(limit)
        }
        let body: [UInt8]
        do {
            let buffer = try await request.body.collect(upTo: limit)
            body = Array(buffer.readableBytesView)
        } catch is NIOTooManyBytesError {
            return tooLarge(limit)
        } catch {
            return jsonResponse(.badRequest, ["error": "unreadable_body", "detail": "the request body could not be read"])
        }
        // Any valid JSON is taken (the worker judges the content), huge numbers too: a 400 here makes the
        // store resend the same body for days.
        guard let document = try? JSON.parse(body, clampingNumbers: true) else {
            return jsonResponse(.badRequest, ["error": "not_json", "detail": "the body is not JSON"])
        }
        guard !health.isShuttingDown else {
            return jsonResponse(.serviceUnavailable, ["error": "shutting_down", "detail": "this instance is shutting down; retry"])
        }

        var copied: [String: String] = [:]
        for name in RelayHeaderName.copiedRequestHeaders {
            if let fieldName = HTTPField.Name(name), let value = request.headers[fieldName] { copied[name] = value }
        }
        let notification = RawNotification(store: store, app: app.key, receivedAtMilliseconds: receivedAt, body: body, requestHeaders: copied)
        let record = notification.record(
            topic: topic, subject: NotificationSubject.extract(store: store, document: document))
        do {
            _ = try await producer.produce(record)
        } catch {
            logger.warning("notification not acknowledged by the log", metadata: [LogKey.error: "\(error)"])
            return jsonResponse(.serviceUnavailable, ["error": "not_stored", "detail": "the notification could not be stored; retry"])
        }
        metrics.acknowledged(store: store, after: ContinuousClock.now - started)
        return jsonResponse(.ok, ["status": "accepted"])
    }

    private func tooLarge(_ limit: Int) -> Response {
        jsonResponse(.contentTooLarge, ["error": "too_large", "detail": "the body is larger than \(limit) bytes"])
    }
}
