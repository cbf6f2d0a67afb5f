public import Foundation
public import Logging
public import RelayConfig
public import RelayCore
public import RelayHTTPClient

/// The Google Play Developer API (androidpublisher v3) over libcurl, authenticated as a service account:
/// the real state of a subscription (`purchases.subscriptionsv2.get`) or a one-time product
/// (`purchases.products.get`) behind a Real-time Developer Notification.
///
/// Access tokens come from the service-account JWT bearer grant and are cached until 60 s before they
/// expire; concurrent callers share one token request. A 401 from the API discards the cached token
/// and tries once more with a fresh one. Connection errors, timeouts, 5xx and 429 (from the API or
/// the token endpoint) are tried up to three times in all, 100 ms and then 200 ms apart (or after the
/// answer's `Retry-After` when longer, up to `StoreAPIError.maximumRetryAfter`), before they surface as
/// `.unavailable`.
public final class GooglePlayClient: Sendable {
    /// Waits before the second and third attempt of an `.unavailable` failure.
    static let retryDelays: [Duration] = [.milliseconds(100), .milliseconds(200)]

    private let baseURL: String
    private let tokens: AccessTokenSource
    private let http: HTTPClient
    private let logger: Logger

    /// Reads and validates the service-account key file now, so a missing or broken key is a startup
    /// error (`.configuration`, naming the file and the field); no request is made until the first call.
    ///
    /// - Parameters:
    ///   - configuration: `baseUrl`, `tokenUrl` and `serviceAccountKey` (an absolute path to the JSON key).
    ///   - http: the transport. Default: 5 s to connect, 15 s per request, 8 concurrent transfers.
    ///   - now: seconds since 1970, for the assertion's `iat`/`exp` and the token cache. Default: the system clock.
    public init(
        configuration: RelayConfiguration.PlayAPI,
        http: HTTPClient = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(15), maxConcurrentTransfers: 8),
        logger: Logger,
        now: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970) }
    ) throws(StoreAPIError) {
        guard let keyPath = configuration.serviceAccountKey else {
            throw StoreAPIError(
                .play, kind: .configuration,
                message: "playApi.serviceAccountKey is not set; the Play Developer API needs a service account's JSON key file")
        }
        let key = try ServiceAccountKey.load(path: keyPath)
        var baseURL = configuration.baseUrl
        while baseURL.hasSuffix("/") { baseURL.removeLast() }
        self.baseURL = baseURL
        self.http = http
        self.logger = logger
        self.tokens = AccessTokenSource(key: key, tokenURL: configuration.tokenUrl, http: http, logger: logger, now: now)
    }

    /// The service account the client authenticates as (`client_email` of the key file).
    public var serviceAccount: String { tokens.key.clientEmail }

    /// `purchases.subscriptionsv2.get`: the SubscriptionPurchaseV2 object for a purchase token.
    ///
    /// `GET {baseUrl}/androidpublisher/v3/applications/{packageName}/purchases/subscriptionsv2/tokens/{purchaseToken}`
    public func subscription(packageName: String, purchaseToken: String) async throws(StoreAPIError) -> JSON {
        try await get(
            ["applications", packageName, "purchases", "subscriptionsv2", "tokens", purchaseToken],
            what: "the subscription purchase", packageName: packageName, purchaseToken: purchaseToken)
    }

    /// `purchases.products.get`: the ProductPurchase object for a one-time product's purchase token.
    ///
    /// `GET {baseUrl}/androidpublisher/v3/applications/{packageName}/purchases/products/{productId}/tokens/{purchaseToken}`
    public func product(packageName: String, productId: String, purchaseToken: String) async throws(StoreAPIError) -> JSON {
        guard !productId.isEmpty else { throw StoreAPIError(.play, kind: .rejected, message: "the product id is empty") }
        return try await get(
            ["applications", packageName, "purchases", "products", productId, "tokens", purchaseToken],
            what: "the purchase of product \(productId)", packageName: packageName, purchaseToken: purchaseToken)
    }

    /// `purchases.voidedpurchases.list`: one page of the purchases refunded, charged back or revoked in
    /// [`startTime`, `endTime`] (Unix ms; Google keeps 30 days), subscriptions included (`type=1`).
    ///
    /// `GET {baseUrl}/androidpublisher/v3/applications/{packageName}/purchases/voidedpurchases?startTime=&endTime=&maxResults=1000&type=1[&token=]`
    public func voidedPurchases(packageName: String, startTime: Int64, endTime: Int64, pageToken: String?) async throws(StoreAPIError) -> JSON {
        guard !packageName.isEmpty else { throw StoreAPIError(.play, kind: .rejected, message: "the package name is empty") }
        var query = [("startTime", String(startTime)), ("endTime", String(endTime)), ("maxResults", "1000"), ("type", "1")]
        if let pageToken { query.append(("token", pageToken)) }
        let url = baseURL + "/androidpublisher/v3/applications/" + PercentEncoding.pathSegment(packageName) + "/purchases/voidedpurchases?"
            + query.map { "\($0.0)=\(PercentEncoding.encode($0.1))" }.joined(separator: "&")
        return try await withStoreRetries(delays: Self.retryDelays) { error, retry in
            logger.debug(
                "Play Developer API call failed; retrying",
                metadata: [PlayLogKey.packageName: "\(packageName)", PlayLogKey.attempt: "\(retry)", LogKey.error: "\(error)"])
        } _: { () async throws(StoreAPIError) in
            try await authorized(url, what: "the voided purchases", packageName: packageName)
        }
    }

    /// Acknowledges a purchase: `purchases.subscriptions.acknowledge` or `purchases.products.acknowledge`.
    ///
    /// `POST {baseUrl}/androidpublisher/v3/applications/{packageName}/purchases/subscriptions/{productId}/tokens/{purchaseToken}:acknowledge`
    /// (`products/{productId}` for a one-time product), body `{}`. Play refuses a purchase already
    /// acknowledged, so callers acknowledge only what it reports pending.
    public func acknowledge(packageName: String, productId: String, purchaseToken: String, subscription: Bool) async throws(StoreAPIError) {
        guard !packageName.isEmpty, !productId.isEmpty, !purchaseToken.isEmpty else {
            throw StoreAPIError(.play, kind: .rejected, message: "the package name, product id and purchase token are required to acknowledge")
        }
        let segments = ["applications", packageName, "purchases", subscription ? "subscriptions" : "products", productId, "tokens"]
        let url = baseURL + "/androidpublisher/v3/" + segments.map(PercentEncoding.pathSegment).joined(separator: "/") + "/"
            + PercentEncoding.pathSegment(purchaseToken) + ":acknowledge"
        let what = "acknowledging the purchase of \(productId)"
        _ = try await withStoreRetries(delays: Self.retryDelays) { error, retry in
            logger.debug(
                "Play Developer API call failed; retrying",
                metadata: [PlayLogKey.packageName: "\(packageName)", PlayLogKey.attempt: "\(retry)", LogKey.error: "\(error)"])
        } _: { () async throws(StoreAPIError) in
            try await authorized(url, method: "POST", body: Array("{}".utf8), what: what, packageName: packageName, expectsDocument: false)
        }
    }

    // MARK: Transport

    /// One API GET, with the retries of `.unavailable` failures.
    private func get(_ segments: [String], what: String, packageName: String, purchaseToken: String) async throws(StoreAPIError) -> JSON {
        guard !packageName.isEmpty else { throw StoreAPIError(.play, kind: .rejected, message: "the package name is empty") }
        guard !purchaseToken.isEmpty else { throw StoreAPIError(.play, kind: .rejected, message: "the purchase token is empty") }
        let url = baseURL + "/androidpublisher/v3/" + segments.map(PercentEncoding.pathSegment).joined(separator: "/")
        return try await withStoreRetries(delays: Self.retryDelays) { error, retry in
            logger.debug(
                "Play Developer API call failed; retrying",
                metadata: [PlayLogKey.packageName: "\(packageName)", PlayLogKey.attempt: "\(retry)", LogKey.error: "\(error)"])
        } _: { () async throws(StoreAPIError) in
            try await authorized(url, what: what, packageName: packageName)
        }
    }

    /// One attempt: a token, the request, and on 401 a fresh token and the request once more.
    private func authorized(
        _ url: String, method: String = "GET", body: [UInt8]? = nil, what: String, packageName: String, expectsDocument: Bool = true
    ) async throws(StoreAPIError) -> JSON {
        let token = try await tokens.token()
        var response = try await send(url, method: method, body: body, token: token)
        if response.status == 401 {
            tokens.invalidate(token)
            logger.info(
                "Play Developer API refused the access token; fetching a new one",
                metadata: [PlayLogKey.packageName: "\(packageName)", PlayLogKey.serviceAccount: "\(serviceAccount)"])
            response = try await send(url, method: method, body: body, token: try await tokens.token())
        }
        if !expectsDocument, (200..<300).contains(response.status) { return .object([:]) }
        return try document(response, what: what, packageName: packageName)
    }

    private func send(_ url: String, method: String, body: [UInt8]?, token: AccessTokenSource.AccessToken) async throws(StoreAPIError)
        -> HTTPClientResponse
    {
        var headers = [("Authorization", "Bearer \(token.value)"), ("Accept", "application/json")]
        if body != nil { headers.append(("Content-Type", "application/json")) }
        do {
            return try await http.send(method, url, headers: headers, body: body)
        } catch {
            throw StoreAPIError.transport(error, api: .play, endpoint: "the Play Developer API at \(baseURL)", setting: "playApi.baseUrl")
        }
    }

    /// The JSON object of a 2xx answer, or the error its status means.
    private func document(_ response: HTTPClientResponse, what: String, packageName: String) throws(StoreAPIError) -> JSON {
        let status = response.status
        switch status {
        case 200..<300:
            guard let document = try? JSON.parse(response.body), case .object = document else {
                throw StoreAPIError(.play, kind: .invalidResponse, message: "\(what) in \(packageName) came back as HTTP \(status) without a JSON object")
            }
            return document
        case 404, 410:
            throw StoreAPIError(
                .play, kind: .notFound,
                message: "Google Play does not know the purchase token for \(what) in \(packageName) (HTTP \(status)):"
                    + " it is wrong, belongs to another package, or expired long ago")
        case 401:
            throw StoreAPIError(
                .play, kind: .rejected,
                message: "the Play Developer API refused a fresh access token for \(serviceAccount) (HTTP 401"
                    + Self.googleError(response.body) + "); check that the service account is enabled")
        case 429, 500...:
            throw StoreAPIError.unavailable(
                .play, status: status, retryAfterHeader: response.header("retry-after"),
                message: "the Play Developer API answered HTTP \(status) for \(what) in \(packageName)")
        case 400..<500:
            let hint =
                status == 403
                ? "; grant \(serviceAccount) access to \(packageName) in Play Console (Users and permissions)"
                    + " and enable the Google Play Android Developer API in its Cloud project"
                : ""
            throw StoreAPIError(
                .play, kind: .rejected,
                message: "the Play Developer API refused the request for \(what) in \(packageName) (HTTP \(status)"
                    + Self.googleError(response.body) + ")" + hint)
        default:
            throw StoreAPIError(.play, kind: .invalidResponse, message: "the Play Developer API answered an unexpected HTTP \(status) for \(what) in \(packageName)")
        }
    }

    /// `, STATUS: "message"` from a Google API error body (`{"error": {"code", "message", "status"}}`),
    /// shortened and without control characters, or nothing.
    static func googleError(_ body: [UInt8]) -> String {
        guard let error = (try? JSON.parse(body))?["error"] else { return "" }
        var parts: [String] = []
        if let status = error["status"]?.stringValue, !status.isEmpty { parts.append(StoreAPIError.excerpt(status)) }
        if let message = error["message"]?.stringValue, !message.isEmpty { parts.append("\"" + StoreAPIError.excerpt(message) + "\"") }
        return parts.isEmpty ? "" : ", " + parts.joined(separator: ": ")
    }
}

/// Log metadata keys of this module (the shared ones are `LogKey`).
enum PlayLogKey {
    static let serviceAccount = "play.service_account"
    static let packageName = "play.package"
    static let expiresIn = "play.token_expires_in"
    static let attempt = "attempt"
}

extension GooglePlayClient: PlayPurchases {
    /// A client for each app that configures `google.playApi`, by app key. A missing or unusable key
    /// file is a configuration error naming the app's key.
    public static func clients(for configuration: RelayConfiguration, logger: Logger) throws(ConfigurationError) -> [String: any PlayPurchases] {
        var clients: [String: any PlayPurchases] = [:]
        // One transfer engine (one thread, one connection cache) for every app's client; none without one.
        guard configuration.apps.contains(where: { $0.google?.playApi != nil }) else { return [:] }
        let http = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(15), maxConcurrentTransfers: 8)
        for (index, app) in configuration.apps.enumerated() {
            guard let api = app.google?.playApi else { continue }
            do throws(StoreAPIError) {
                clients[app.key] = try GooglePlayClient(configuration: api, http: http, logger: logger)
            } catch {
                throw ConfigurationError(key: "apps[\(index)].google.playApi", message: error.message)
            }
        }
        return clients
    }
}
