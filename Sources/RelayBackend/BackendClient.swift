public import CoreMetrics
import Foundation
public import Logging
public import RelayConfig
public import RelayCore
public import RelayHTTPClient
import Synchronization

/// The backend's base URL, known at once or once a local backend listens (dev binds port 0).
public typealias BackendAddress = Eventual<String>

/// The worker's client for the backend of docs/contracts.md, Backend API over libcurl: keep-alive connections,
/// bounded concurrency (the HTTP client's transfer threads), timeouts, `Authorization: Bearer`, and
/// retries with backoff on connection errors, timeouts, 5xx and 429.
public final class BackendClient: Sendable {
    /// How many times a retriable failure is tried again, and the first wait (doubling).
    public struct RetryPolicy: Sendable {
        public var retries: Int
        public var initialDelay: Duration
        public var maximumDelay: Duration

        public init(retries: Int = 3, initialDelay: Duration = .milliseconds(100), maximumDelay: Duration = .seconds(2)) {
            self.retries = retries
            self.initialDelay = initialDelay
            self.maximumDelay = maximumDelay
        }
    }

    public enum UpdateOutcome: Sendable, Equatable {
        /// The transform wanted no change.
        case unchanged(SubscriptionState?)
        /// Written: the state before (nil when there was none) and after.
        case updated(before: SubscriptionState?, after: SubscriptionState)
        /// The stored state is from a newer notification; nothing was written.
        case stale(current: SubscriptionState)
    }

    private struct CachedMapping {
        var mapping: ProductMapping
        var fetchedAt: ContinuousClock.Instant
    }

    private let address: BackendAddress
    private let apiKey: String?
    private let http: HTTPClient
    private let entitlementsTTL: Duration
    private let retry: RetryPolicy
    private let logger: Logger
    private let staleMappings: LabeledCounters
    private let writeConflicts: Counter
    private let retries: Counter
    private let errors: LabeledCounters
    private let mappings = Mutex<[Int: CachedMapping]>([:])
    /// Since when calls fail (no connection, timeout, 5xx, 429, or 401/403), and how; nil while they
    /// succeed. The worker cannot make progress meanwhile, and readiness says so.
    private let failing = Mutex<(since: ContinuousClock.Instant, unauthorized: Bool)?>(nil)
    /// How long calls must keep failing before readiness turns false: one failed call (a record the
    /// backend answers 500 for, a restart) does not make it flap.
    public static let readinessGrace: Duration = .seconds(5)

    public init(
        configuration: RelayConfiguration.Backend, address: BackendAddress? = nil,
        http: HTTPClient = HTTPClient(connectTimeout: .seconds(2), timeout: .seconds(10), maxConcurrentTransfers: 32),
        retry: RetryPolicy = RetryPolicy(), logger: Logger, metrics: any MetricsFactory
    ) {
        self.address = address ?? BackendAddress(configuration.url)
        self.apiKey = configuration.clientKey
        self.http = http
        self.entitlementsTTL = configuration.entitlementsTTL
        self.retry = retry
        self.logger = logger
        self.staleMappings = LabeledCounters(label: "relay_backend_stale_mappings_total", factory: metrics)
        self.writeConflicts = Counter(label: "relay_backend_write_conflicts_total", dimensions: [], factory: metrics)
        self.retries = Counter(label: "relay_backend_retries_total", dimensions: [], factory: metrics)
        self.errors = LabeledCounters(label: "relay_backend_errors_total", factory: metrics)
    }

    // MARK: Product mapping

    /// Product → entitlements of an application, cached for `backend.entitlementsTTL`. While the backend
    /// is unavailable an expired mapping keeps serving (counted in `relay_backend_stale_mappings_total`);
    /// a mapping that does not exist is `.notFound`, never an empty one.
    public func productMapping(applicationId: Int) async throws(BackendError) -> ProductMapping {
        let cached = mappings.withLock { $0[applicationId] }
        if let cached, ContinuousClock.now - cached.fetchedAt < entitlementsTTL { return cached.mapping }
        do throws(BackendError) {
            let response = try await send("GET", "/config-api/read/v1-application-id/\(applicationId)/entitlements/1")
            guard response.status == 200 else { throw Self.error(response, what: "application \(applicationId)'s product mapping") }
            guard let document = try? JSON.parse(response.body), let mapping = ProductMapping(json: document) else {
                throw BackendError(kind: .invalidResponse, message: "the product mapping of application \(applicationId) is not {\"products\": [...]}")
            }
            mappings.withLock { $0[applicationId] = CachedMapping(mapping: mapping, fetchedAt: .now) }
            return mapping
        } catch {
            guard error.isRetriable, let cached else { throw error }
            staleMappings.increment([("application", "\(applicationId)")])
            logger.warning(
                "backend unavailable; serving a stale product mapping",
                metadata: ["application": "\(applicationId)", LogKey.error: "\(error)"])
            return cached.mapping
        }
    }

    // MARK: Subscription state

    /// The stored state, or nil when there is none yet (404).
    public func subscription(store: Store, originalTransactionId: String) async throws(BackendError) -> SubscriptionState? {
        let response = try await send("GET", Self.subscriptionPath(store, originalTransactionId))
        switch response.status {
        case 200: return try Self.state(response)
        case 404: return nil
        default: throw Self.error(response, what: "subscription \(store.rawValue)/\(originalTransactionId)")
        }
    }

    /// Writes `state` if the stored version is still `ifMatch` (0 when none existed).
    public func write(_ state: SubscriptionState, ifMatch: Int64) async throws(BackendError) -> StateWriteResult {
        let response = try await send(
            "PUT", Self.subscriptionPath(state.store, state.originalTransactionId),
            headers: [("If-Match", "\(ifMatch)"), ("Content-Type", "application/json")], body: state.serialized())
        switch response.status {
        case 200: return .written(try Self.state(response))
        case 412: return .versionMismatch
        case 409:
            guard let current = try? JSON.parse(response.body)["current"].map({ try SubscriptionState(json: $0) }) ?? nil else {
                throw BackendError(kind: .invalidResponse, message: "409 without the current state")
            }
            return .stale(current: current)
        default: throw Self.error(response, what: "subscription \(state.store.rawValue)/\(state.originalTransactionId)")
        }
    }

    /// Read, apply, write with If-Match; on 412 read again and re-apply (at most `attempts` times).
    /// `transform` gets the current state (nil when none) and returns the new one, or nil for no change.
    /// A state older than the stored one by `sourceTimestamp` is never written (`.stale`).
    public func update(
        store: Store, originalTransactionId: String, attempts: Int = 10,
        _ transform: (SubscriptionState?) -> SubscriptionState?
    ) async throws(BackendError) -> UpdateOutcome {
        for _ in 0..<max(1, attempts) {
            let current = try await subscription(store: store, originalTransactionId: originalTransactionId)
            guard var next = transform(current) else { return .unchanged(current) }
            if let current, next.sourceTimestamp < current.sourceTimestamp { return .stale(current: current) }
            next.version = current?.version ?? 0
            switch try await write(next, ifMatch: current?.version ?? 0) {
            case .written(let stored): return .updated(before: current, after: stored)
            case .stale(let newer): return .stale(current: newer)
            case .versionMismatch:
                writeConflicts.increment()
                continue
            }
        }
        throw BackendError(kind: .unavailable, message: "subscription \(store.rawValue)/\(originalTransactionId) kept changing under \(attempts) attempts")
    }

    /// The user's entitlements document (`{"entitlements": [...], "customerInfo": {...}}`), or nil (404).
    /// With `deviceId`, the SDK's query: the user's and the device's subscriptions together.
    public func entitlements(appUserId: String, deviceId: String? = nil) async throws(BackendError) -> JSON? {
        let query = deviceId.map { "?deviceId=\(PercentEncoding.encode($0))" } ?? ""
        let response = try await send("GET", "/subscriptions-api/public/v1/users/\(Self.pathSegment(appUserId))/entitlements\(query)")
        switch response.status {
        case 200:
            guard let document = try? JSON.parse(response.body), document["entitlements"]?.arrayValue != nil else {
                throw BackendError(kind: .invalidResponse, message: "the entitlements response has no entitlements array")
            }
            return document
        case 404: return nil
        default: throw Self.error(response, what: "the entitlements of a user")
        }
    }

    /// Whether calls have succeeded lately: false once they have failed for `readinessGrace` with no
    /// success since (true before the first call).
    public var isReachable: Bool { failure(unauthorized: false) == nil }
    /// Whether the backend has refused the API key (401/403) for `readinessGrace` with no success since.
    public var isAuthorized: Bool { failure(unauthorized: true) == nil }

    private func failure(unauthorized: Bool) -> ContinuousClock.Instant? {
        guard let failing = failing.withLock({ $0 }), failing.unauthorized == unauthorized,
            ContinuousClock.now - failing.since >= Self.readinessGrace
        else { return nil }
        return failing.since
    }

    private func recordOutcome(failed: Bool, unauthorized: Bool = false) {
        failing.withLock { failing in
            if !failed {
                failing = nil
            } else if failing == nil || failing?.unauthorized != unauthorized {
                failing = (ContinuousClock.now, unauthorized)
            }
        }
    }

    // MARK: Transport

    /// One request with the API key, retried with backoff while the failure is retriable, unless it may not
    /// be sent twice (`retrying` false: a request that creates something each time it arrives).
    func send(_ method: String, _ path: String, headers: [(String, String)] = [], body: [UInt8]? = nil, retrying: Bool = true)
        async throws(BackendError) -> HTTPClientResponse
    {
        let url = await address.value() + path
        var allHeaders = headers + [("Accept", "application/json")]
        if let apiKey { allHeaders.append(("Authorization", "Bearer \(apiKey)")) }
        let delays = retrying ? Backoff(initial: retry.initialDelay, maximum: retry.maximumDelay).delays(retry.retries) : []
        return try await withRetries(
            delays: delays, isRetriable: \.isRetriable,
            onRetry: { failure, attempt in
                retries.increment()
                logger.debug("backend call failed; retrying", metadata: [LogKey.error: "\(failure)", "attempt": "\(attempt)"])
            },
            // A 429 or 503 with Retry-After waits as asked, up to 30 s.
            wait: { failure, scheduled in max(scheduled, min(failure.retryAfter ?? .zero, .seconds(30))) }
        ) { () async throws(BackendError) -> HTTPClientResponse in
            let failure: BackendError
            do throws(HTTPClientError) {
                let response = try await http.send(method, url, headers: allHeaders, body: body)
                guard response.status >= 500 || response.status == 429 else {
                    let refused = response.status == 401 || response.status == 403
                    recordOutcome(failed: refused, unauthorized: refused)
                    return response
                }
                var unavailable = BackendError(kind: .unavailable, message: "\(method) \(path) answered HTTP \(response.status)")
                unavailable.retryAfter = RetryAfter.milliseconds(response.header("retry-after"), now: wallClockMilliseconds()).map { .milliseconds($0) }
                failure = unavailable
            } catch {
                guard error.isRetriable else { throw BackendError(kind: .badRequest, message: "\(method) \(path): \(error)") }
                failure = BackendError(kind: .unavailable, message: "\(method) \(path): \(error)")
            }
            recordOutcome(failed: true)
            errors.increment([("kind", failure.kind.rawValue)])
            throw failure
        }
    }

    private static func subscriptionPath(_ store: Store, _ id: String) -> String {
        "/subscriptions-api/internal/v1/subscriptions/\(store.rawValue)/\(pathSegment(id))"
    }

    /// Percent-encodes everything but unreserved ASCII, so ids never change the path (`.` and `..` too).
    static func pathSegment(_ text: String) -> String {
        PercentEncoding.pathSegment(text)
    }

    private static func state(_ response: HTTPClientResponse) throws(BackendError) -> SubscriptionState {
        do {
            // Its remembered contexts stay bytes until read: most of a state, and read only for a repeated notification.
            return try SubscriptionState(serialized: response.body)
        } catch {
            throw BackendError(kind: .invalidResponse, message: "the subscription state is not valid: \(error)")
        }
    }

    static func error(_ response: HTTPClientResponse, what: String) -> BackendError {
        switch response.status {
        case 401, 403: BackendError(kind: .unauthorized, message: "the backend refused the API key (HTTP \(response.status)); check backend.apiKey")
        case 404: BackendError(kind: .notFound, message: "\(what) does not exist")
        case 400..<500: BackendError(kind: .badRequest, message: "\(what): HTTP \(response.status)")
        default: BackendError(kind: .invalidResponse, message: "\(what): unexpected HTTP \(response.status)")
        }
    }
}
