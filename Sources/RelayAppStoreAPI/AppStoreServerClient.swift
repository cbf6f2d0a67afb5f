public import Foundation
public import Logging
import RelayCore
public import RelayHTTPClient

/// The App Store Server API (https://developer.apple.com/documentation/appstoreserverapi) over
/// libcurl, for one app in one environment: transaction history, notification history, subscription
/// statuses and consumption answers. Signed data comes back as Apple's JWS strings, unverified; the
/// caller verifies them with the App Store chain rules.
///
/// Every request carries an ES256 token signed with the App Store Connect key (`AppStoreTokenSource`).
/// Connection errors, timeouts, 5xx, 429 and Apple's "retryable" 404s are tried again after
/// `RetryPolicy.delays`, or after the server's `Retry-After` when that is longer; a `Retry-After`
/// beyond `maximumRetryAfter` is not waited for but returned in the error, for the caller to schedule.
/// A 401 is `.keyRefused` at once (a newly signed token would carry the same key) and drops the
/// cached token, so a corrected clock takes effect on the next call.
public final class AppStoreServerClient: Sendable {
    /// How failed calls are retried.
    public struct RetryPolicy: Sendable {
        /// The waits before the second, third, … attempt; their count is the number of retries.
        public var delays: [Duration]
        /// The longest `Retry-After` waited for inside a call.
        public var maximumRetryAfter: Duration

        public init(delays: [Duration], maximumRetryAfter: Duration) {
            self.delays = delays
            self.maximumRetryAfter = maximumRetryAfter
        }

        /// Three retries, 0.5 s, 1 s and 2 s apart; `Retry-After` honoured up to 30 s.
        public static let standard = RetryPolicy(
            delays: Backoff(initial: .milliseconds(500), maximum: .seconds(2)).delays(3), maximumRetryAfter: .seconds(30))
    }

    public let environment: AppStoreServerEnvironment
    /// Where requests go: the environment's Apple URL unless overridden (tests, a proxy).
    public let baseURL: String
    public let tokens: AppStoreTokenSource
    private let http: HTTPClient
    private let retry: RetryPolicy
    private let logger: Logger
    private let now: @Sendable () -> Int64

    /// - Parameters:
    ///   - baseURL: overrides `environment.baseURL`; `http://` or `https://`, without a path.
    ///   - http: the transport. Default: 5 s to connect, 30 s per request (history pages can be slow), 8 at once.
    ///   - now: seconds since 1970, for the tokens' `iat`/`exp` and HTTP-date `Retry-After`. Default: the system clock.
    public init(
        key: AppStoreConnectKey, environment: AppStoreServerEnvironment, baseURL: String? = nil,
        http: HTTPClient = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(30), maxConcurrentTransfers: 8),
        retry: RetryPolicy = .standard, logger: Logger, now: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970) }
    ) throws(AppStoreAPIError) {
        var url = baseURL ?? environment.baseURL
        while url.hasSuffix("/") { url.removeLast() }
        let lowered = url.lowercased()
        guard lowered.hasPrefix("https://") || lowered.hasPrefix("http://"), url.split(separator: "/").count >= 2 else {
            throw AppStoreAPIError(.configuration, "the App Store Server API base URL \"\(url)\" is not an http(s) URL")
        }
        self.environment = environment
        self.baseURL = url
        self.tokens = AppStoreTokenSource(key: key, now: now)
        self.http = http
        self.retry = retry
        self.logger = logger
        self.now = now
    }

    /// The key the client signs with.
    public var key: AppStoreConnectKey { tokens.key }

    // MARK: Get Transaction History

    /// One page (up to 20 transactions) of Get Transaction History v2.
    ///
    /// `GET /inApps/v2/history/{transactionId}?revision=…&<query>`
    ///
    /// - Parameters:
    ///   - transactionId: any transaction id of the customer (an original one works).
    ///   - revision: the previous page's `revision`; nil for the first page.
    public func transactionHistoryPage(
        transactionId: String, query: TransactionHistoryQuery = TransactionHistoryQuery(), revision: String? = nil
    ) async throws(AppStoreAPIError) -> TransactionHistoryPage {
        var parameters = query.parameters
        if let revision { parameters.insert(("revision", revision), at: 0) }
        let page: TransactionHistoryPage = try decoded(
            try await call(
                "GET", ["inApps", "v2", "history", try id(transactionId)], parameters,
                what: "the transaction history of transaction \(transactionId)"),
            what: "the transaction history of transaction \(transactionId)")
        if page.hasMore, page.revision.isEmpty {
            throw AppStoreAPIError(.invalidResponse, "Apple's transaction history of \(transactionId) says hasMore without a revision to continue from")
        }
        return page
    }

    /// Every page of the transaction history, fetched as the loop asks (same filters on each page,
    /// as Apple requires).
    ///
    /// - Parameter revision: a stored `revision` to resume from; nil starts at the beginning.
    public func transactionHistory(
        transactionId: String, query: TransactionHistoryQuery = TransactionHistoryQuery(), startingAt revision: String? = nil
    ) -> AppStorePages<TransactionHistoryPage> {
        AppStorePages(startingAt: revision) { [self] (token: String?) async throws(AppStoreAPIError) -> (page: TransactionHistoryPage, next: String?) in
            let page = try await transactionHistoryPage(transactionId: transactionId, query: query, revision: token)
            return (page, page.hasMore ? page.revision : nil)
        }
    }

    // MARK: Get Notification History

    /// One page (up to 20 notifications) of Get Notification History.
    ///
    /// `POST /inApps/v1/notifications/history?paginationToken=…` with the request as its JSON body.
    ///
    /// - Parameter paginationToken: the previous page's `paginationToken`; nil for the first page.
    public func notificationHistoryPage(
        _ request: NotificationHistoryRequest, paginationToken: String? = nil
    ) async throws(AppStoreAPIError) -> NotificationHistoryPage {
        let what = "the notification history from \(request.startDate) to \(request.endDate)"
        let page: NotificationHistoryPage = try decoded(
            try await call(
                "POST", ["inApps", "v1", "notifications", "history"], paginationToken.map { [("paginationToken", $0)] } ?? [],
                body: try encoded(request, what: "the notification history request"), what: what),
            what: what)
        if page.hasMore, page.paginationToken?.isEmpty ?? true {
            throw AppStoreAPIError(.invalidResponse, "Apple's \(what) says hasMore without a paginationToken to continue from")
        }
        return page
    }

    /// Every page of the notification history, fetched as the loop asks.
    ///
    /// - Parameter paginationToken: a stored token to resume from (Apple lets them expire); nil starts at the beginning.
    public func notificationHistory(
        _ request: NotificationHistoryRequest, startingAt paginationToken: String? = nil
    ) -> AppStorePages<NotificationHistoryPage> {
        AppStorePages(startingAt: paginationToken) { [self] (token: String?) async throws(AppStoreAPIError) -> (page: NotificationHistoryPage, next: String?) in
            let page = try await notificationHistoryPage(request, paginationToken: token)
            return (page, page.hasMore ? page.paginationToken : nil)
        }
    }

    // MARK: Get All Subscription Statuses

    /// The statuses of all the customer's auto-renewable subscriptions in the app.
    ///
    /// `GET /inApps/v1/subscriptions/{transactionId}?status=…`
    ///
    /// - Parameter statuses: only subscriptions in these statuses; empty for all.
    public func subscriptionStatuses(
        transactionId: String, statuses: [SubscriptionStatus] = []
    ) async throws(AppStoreAPIError) -> SubscriptionStatusesResponse {
        let what = "the subscription statuses of transaction \(transactionId)"
        return try decoded(
            try await call("GET", ["inApps", "v1", "subscriptions", try id(transactionId)], statuses.map { ("status", String($0.rawValue)) }, what: what),
            what: what)
    }

    // MARK: Send Consumption Information

    /// Answers a `CONSUMPTION_REQUEST` notification: Apple takes the information into its refund
    /// decision. Succeeds on HTTP 202.
    ///
    /// `PUT /inApps/v2/transactions/consumption/{transactionId}`
    public func sendConsumptionInformation(transactionId: String, _ request: ConsumptionRequest) async throws(AppStoreAPIError) {
        _ = try await call(
            "PUT", ["inApps", "v2", "transactions", "consumption", try id(transactionId)], [],
            body: try encoded(request, what: "the consumption information"), what: "the consumption information of transaction \(transactionId)")
    }

    // MARK: Transport

    private func id(_ transactionId: String) throws(AppStoreAPIError) -> String {
        guard !transactionId.isEmpty else { throw AppStoreAPIError(.rejected, "the transaction id is empty") }
        return transactionId
    }

    private func encoded(_ value: some Encodable, what: String) throws(AppStoreAPIError) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        do {
            return Array(try encoder.encode(value))
        } catch {
            throw AppStoreAPIError(.rejected, "\(what) cannot be encoded as JSON (\(error))")
        }
    }

    private func decoded<Value: Decodable>(_ response: HTTPClientResponse, what: String) throws(AppStoreAPIError) -> Value {
        do {
            return try JSONDecoder().decode(Value.self, from: Data(response.body))
        } catch {
            throw AppStoreAPIError(
                .invalidResponse, "Apple answered HTTP \(response.status) for \(what) with a body that is not the documented JSON (\(Self.summary(error)))",
                status: response.status)
        }
    }

    /// One API call with the retries of `.unavailable` failures; returns the 2xx response.
    private func call(
        _ method: String, _ segments: [String], _ parameters: [(String, String)], body: [UInt8]? = nil, what: String
    ) async throws(AppStoreAPIError) -> HTTPClientResponse {
        var url = baseURL + "/" + segments.map(PercentEncoding.pathSegment).joined(separator: "/")
        if !parameters.isEmpty {
            url += "?" + parameters.map { PercentEncoding.encode($0.0) + "=" + PercentEncoding.encode($0.1) }.joined(separator: "&")
        }
        let retry = self.retry
        return try await withRetries(
            delays: retry.delays,
            isRetriable: { error in error.isRetriable && (error.retryAfter.map { $0 <= retry.maximumRetryAfter } ?? true) },
            onRetry: { error, attempt in
                logger.debug(
                    "App Store Server API call failed; retrying",
                    metadata: [
                        AppStoreLogKey.environment: "\(environment.rawValue)", AppStoreLogKey.attempt: "\(attempt)", LogKey.error: "\(error)",
                    ])
            },
            wait: { error, scheduled in max(scheduled, error.retryAfter ?? .zero) }
        ) { () async throws(AppStoreAPIError) in
            try await attempt(method, url, body: body, what: what)
        }
    }

    /// One request: a token, the request, and the status's meaning.
    private func attempt(_ method: String, _ url: String, body: [UInt8]?, what: String) async throws(AppStoreAPIError) -> HTTPClientResponse {
        let token = try tokens.token()
        var headers = [("Authorization", "Bearer \(token.value)"), ("Accept", "application/json")]
        if body != nil { headers.append(("Content-Type", "application/json")) }
        let response: HTTPClientResponse
        do {
            response = try await http.send(method, url, headers: headers, body: body)
        } catch {
            switch error.kind {
            case .invalidRequest:
                throw AppStoreAPIError(.configuration, "the App Store Server API at \(baseURL) cannot be requested (\(error.message)); check its base URL")
            case .setup, .connect, .timeout, .transfer, .addressRefused, .aborted:
                throw AppStoreAPIError(.unavailable, "the App Store Server API at \(baseURL) could not be reached for \(what) (\(error))")
            }
        }
        if response.status == 401 { tokens.invalidate(token) }
        try check(response, what: what)
        return response
    }

    /// Throws the error a non-2xx status means.
    private func check(_ response: HTTPClientResponse, what: String) throws(AppStoreAPIError) {
        let status = response.status
        if (200..<300).contains(status) { return }
        let apple = try? JSONDecoder().decode(AppStoreErrorBody.self, from: Data(response.body))
        let code = apple?.errorCode
        var detail = "HTTP \(status)"
        if let code { detail += ", errorCode \(code)" }
        if let message = apple?.errorMessage, !message.isEmpty { detail += " \"\(AppStoreAPIError.excerpt(message))\"" }
        let place = "Apple's \(environment.rawValue.lowercased()) environment"
        switch status {
        case 401:
            throw AppStoreAPIError(
                .keyRefused,
                "\(place) refused the bearer token of \(key) for \(what) (\(detail)); check that the key is an In-App Purchase key"
                    + " that is not revoked, that its key id and issuer id are the ones App Store Connect shows,"
                    + " that the bundle id is this app's, and that this machine's clock is right",
                status: status, errorCode: code)
        case 404 where code.map(AppStoreAPIError.retryableNotFoundCodes.contains) ?? false:
            throw AppStoreAPIError(.unavailable, "\(place) does not have \(what) yet (\(detail))", status: status, errorCode: code)
        case 404:
            throw AppStoreAPIError(
                .notFound,
                "\(place) does not know \(what) (\(detail)); check the transaction id, that it belongs to \(key.bundleId),"
                    + " and the environment (a sandbox purchase is unknown in production and the other way round)",
                status: status, errorCode: code)
        case 429, 500...:
            let milliseconds = RetryAfter.milliseconds(response.header("retry-after"), now: now() * 1000)
            let retryAfter = milliseconds.map { Duration.milliseconds($0) }
            let wait = milliseconds.map { "; it asked to wait \($0) ms (Retry-After)" } ?? ""
            let rateLimited = status == 429 ? " (rate limit exceeded for \(key))" : ""
            throw AppStoreAPIError(
                .unavailable, "\(place) answered \(detail) for \(what)\(rateLimited)\(wait)", status: status, errorCode: code, retryAfter: retryAfter)
        case 400..<500:
            throw AppStoreAPIError(
                .rejected,
                "\(place) refused the request for \(what) (\(detail)); errorCode names the field or parameter it found wrong"
                    + " (https://developer.apple.com/documentation/appstoreserverapi/error-codes)",
                status: status, errorCode: code)
        default:
            throw AppStoreAPIError(.invalidResponse, "\(place) answered an unexpected HTTP \(status) for \(what)", status: status, errorCode: code)
        }
    }

    /// A decoding failure in one line: where, and what was wrong (never the value itself).
    private static func summary(_ error: any Error) -> String {
        guard let error = error as? DecodingError else { return "not JSON" }
        func path(_ context: DecodingError.Context) -> String {
            let keys = context.codingPath.map { $0.intValue.map { "[\($0)]" } ?? "." + $0.stringValue }.joined()
            return keys.isEmpty ? "the top level" : String(keys.drop { $0 == "." })
        }
        switch error {
        case .keyNotFound(let key, let context): return "\(path(context)) lacks \"\(key.stringValue)\""
        case .typeMismatch(_, let context), .valueNotFound(_, let context): return "\(path(context)) has the wrong type"
        case .dataCorrupted(let context): return context.codingPath.isEmpty ? "not JSON" : "\(path(context)) is malformed"
        @unknown default: return "undecodable"
        }
    }
}

/// Log metadata keys of this module (the shared ones are `LogKey`).
enum AppStoreLogKey {
    static let environment = "appstore.environment"
    static let attempt = "attempt"
}
