import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import RelayConfig
import RelayCore
import Synchronization

/// `POST /v1/notifications/{store}/{app}`: writes the request durably to the log and answers 200 only
/// once the log acknowledged it (docs/contracts.md (ingest and the raw record)). Nothing is verified
/// here: that is the worker's job, so a store's retry never depends on our verification state.
///
/// The route is on the internet, so before anything is written (docs/operations.md, "The ingest on
/// the internet"): the client's address (`ingest.trustedProxies`) must be in the store's `allowedSources`
/// (403), within its request rate (429) and its bytes not yet processed (429), and the request must
/// have its store's shape (`NotificationShape`, 400). A full log budget answers 503. Every refusal
/// carries a reason, is counted by `relay_ingest_refused_total{store,reason}`, and is never written.
struct NotificationIngest: Sendable {
    private let apps: [String: RelayConfiguration.App]
    private let maxBodyBytes: Int
    private let topic: String
    private let producer: any RecordProducer
    private let health: HealthState
    private let metrics: IngestMetrics
    private let logger: Logger
    private let resolver: ClientAddressResolver
    private let allowedSources: [Store: [AddressRange]]
    private let requests: ClientRateLimiter
    private let unverified: UnverifiedBytes?
    /// Set once a request from an untrusted private address carried `X-Forwarded-For` (logged once).
    private let untrustedProxySeen = OnceFlag()

    static let forwardedFor = HTTPField.Name("X-Forwarded-For")!
    /// Seconds a store is asked to wait when the log's budget is full (the stores retry on their own schedules).
    static let fullRetryAfterSeconds = 30
    /// Seconds a client over its bound of unprocessed bytes is asked to wait.
    static let unverifiedRetryAfterSeconds = 10

    init(routes: RelayHTTPServer.IngestRoutes, health: HealthState, metrics: IngestMetrics, logger: Logger) {
        apps = RelayConfiguration.appsByKey(routes.apps)
        maxBodyBytes = routes.ingest.maxBodyBytes
        topic = routes.topic
        producer = routes.producer
        self.health = health
        self.metrics = metrics
        self.logger = logger
        resolver = ClientAddressResolver(trustedProxies: routes.ingest.trustedProxies)
        allowedSources = routes.ingest.allowedSources
        let limit = routes.ingest.clientLimit
        requests = ClientRateLimiter(ratePerSecond: limit.requestsPerSecond, burst: limit.burst, now: routes.clock)
        unverified = routes.processedOffsets.flatMap { offsets in
            limit.unverifiedBytes > 0 ? UnverifiedBytes(limit: limit.unverifiedBytes, logger: logger, processedOffsets: offsets) : nil
        }
    }

    func addRoutes(to router: Router<RelayRequestContext>) {
        for store in Store.notificationStores {
            router.post("/v1/notifications/\(store.rawValue)/:app") { request, context in
                try await receive(store: store, request: request, context: context)
            }
        }
    }

    func receive(store: Store, request: Request, context: RelayRequestContext) async throws -> Response {
        let response = await handle(store: store, request: request, context: context)
        metrics.request(store: store, status: Int(response.status.code))
        return response
    }

    private func handle(store: Store, request: Request, context: RelayRequestContext) async -> Response {
        let receivedAt = Int64((Date().timeIntervalSince1970 * 1000).rounded(.down))
        let started = ContinuousClock.now
        var logger = self.logger
        logger[metadataKey: LogKey.notificationStore] = "\(store.rawValue)"

        // Who sent it, before anything else is read: the source ranges and the per-client limits count by it.
        let forwardedFor = request.headers[values: Self.forwardedFor]
        let address = resolver.client(peer: context.peerAddress, forwardedFor: forwardedFor)
        let client = address?.clientKey ?? "unknown"
        if !forwardedFor.isEmpty { warnOfUntrustedProxy(peer: context.peerAddress) }
        // A source the operator listed for this store is the store itself: no per-client limit applies to it.
        var listedSource = false
        if let ranges = allowedSources[store] {
            guard let address, ranges.contains(where: { $0.contains(address) }) else {
                return refuse(
                    store, .sourceNotAllowed,
                    jsonResponse(.forbidden, ["error": "source_not_allowed", "detail": .string("this address is not in ingest.allowedSources.\(store.rawValue)")]))
            }
            listedSource = true
        }
        if !listedSource, case .limited(let seconds) = requests.take(client) {
            return refuse(
                store, .rateLimited,
                retryAfter(seconds, jsonResponse(
                    .tooManyRequests, ["error": "rate_limited", "detail": .string("too many requests from this address; retry in \(seconds) s (ingest.clientLimit)")])))
        }

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
            return refuse(store, .notJSON, jsonResponse(.badRequest, ["error": "not_json", "detail": "the body is not JSON"]))
        }
        // Not what the store sends: no store resends it, so refusing loses nothing (a plausible notification
        // that fails verification is written and goes to the rejected topic, to be replayed after a fix).
        if let mismatch = NotificationShape.mismatch(store: store, document: document, header: { name in
            HTTPField.Name(name).flatMap { request.headers[$0] }
        }) {
            return refuse(
                store, .notANotification,
                jsonResponse(.badRequest, ["error": "not_a_notification", "detail": .string("not shaped like a notification of the \(store.rawValue) route: \(mismatch.detail)")]))
        }
        if let unverified, !listedSource, !unverified.admits(client) {
            return refuse(
                store, .unverifiedBytes,
                retryAfter(Self.unverifiedRetryAfterSeconds, jsonResponse(
                    .tooManyRequests,
                    ["error": "too_much_unverified", "detail": .string(
                        "this address has \(unverified.limit) bytes written that the worker has not processed yet; retry once it has (ingest.clientLimit.unverifiedBytes)")])))
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
        let position: RecordPosition
        do {
            position = try await producer.produce(record)
        } catch where error.code == .full {
            // Logged once by the log when its budget fills; not per request.
            return refuse(
                store, .logFull,
                retryAfter(Self.fullRetryAfterSeconds, jsonResponse(
                    .serviceUnavailable,
                    ["error": "log_full", "detail": "the log holds as many unprocessed notifications as log.retentionBytes allows; retry later"])))
        } catch {
            logger.warning("notification not acknowledged by the log", metadata: [LogKey.error: "\(error)"])
            return jsonResponse(.serviceUnavailable, ["error": "not_stored", "detail": "the notification could not be stored; retry"])
        }
        if !listedSource { unverified?.charge(client, at: position, bytes: Int64(record.value.count)) }
        metrics.acknowledged(store: store, after: ContinuousClock.now - started)
        return jsonResponse(.ok, ["status": "accepted"])
    }

    /// A peer on a private address that sends `X-Forwarded-For` but is not in `ingest.trustedProxies` is most
    /// likely the operator's own load balancer: then every store shares its one per-client limit. Said once.
    private func warnOfUntrustedProxy(peer: String?) {
        guard let peer = peer.flatMap(IPAddress.init), !resolver.trustedProxies.contains(where: { $0.contains(peer) }),
            AddressRange.privateRanges.contains(where: { $0.contains(peer) }),
            untrustedProxySeen.setFirstTime()
        else { return }
        logger.warning(
            "a private address sends X-Forwarded-For but is not in ingest.trustedProxies: requests through it count as one client for ingest.clientLimit; list your load balancer there",
            metadata: ["peer": "\(peer)"])
    }

    private func refuse(_ store: Store, _ reason: IngestMetrics.Refusal, _ response: Response) -> Response {
        metrics.refused(store: store, reason: reason)
        return response
    }

    private func retryAfter(_ seconds: Int, _ response: Response) -> Response {
        var response = response
        response.headers[.retryAfter] = String(seconds)
        return response
    }

    private func tooLarge(_ limit: Int) -> Response {
        jsonResponse(.contentTooLarge, ["error": "too_large", "detail": "the body is larger than \(limit) bytes"])
    }
}

/// True the first time it is set, false after.
final class OnceFlag: Sendable {
    private let value = Atomic<Bool>(false)
    func setFirstTime() -> Bool { !value.exchange(true, ordering: .relaxed) }
}
