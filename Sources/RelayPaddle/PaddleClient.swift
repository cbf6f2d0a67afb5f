import Foundation
public import Logging
public import RelayConfig
public import RelayCore
public import RelayHTTPClient

/// The few Paddle Billing API reads the relay needs, over libcurl with the configured API key: a
/// transaction and a subscription, for the purchases apps hand over. Paddle answers `{"data": {...},
/// "meta": {...}}`; these return `data`. Connection errors, timeouts, 5xx and 429 are tried three times in
/// all, 100 ms and 200 ms apart, or after the answer's `Retry-After` when longer (up to
/// `StoreAPIError.maximumRetryAfter`; a longer one is returned in the error).
public final class PaddleClient: Sendable {
    static let retryDelays: [Duration] = [.milliseconds(100), .milliseconds(200)]

    private let baseURL: String
    private let apiKey: String
    private let http: HTTPClient
    private let logger: Logger

    public init(
        configuration: RelayConfiguration.PaddleAPI,
        http: HTTPClient = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(15), maxConcurrentTransfers: 8), logger: Logger
    ) {
        var baseURL = configuration.baseUrl
        while baseURL.hasSuffix("/") { baseURL.removeLast() }
        self.baseURL = baseURL
        self.apiKey = configuration.apiKey
        self.http = http
        self.logger = logger
    }

    /// A client for each app that configures `paddle.api`, by app key (one transfer engine for all).
    public static func clients(for configuration: RelayConfiguration, logger: Logger) -> [String: any PaddleReads] {
        guard configuration.apps.contains(where: { $0.paddle?.api != nil }) else { return [:] }
        let http = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(15), maxConcurrentTransfers: 8)
        var clients: [String: any PaddleReads] = [:]
        for app in configuration.apps {
            if let api = app.paddle?.api { clients[app.key] = PaddleClient(configuration: api, http: http, logger: logger) }
        }
        return clients
    }

    private func call(_ method: String, _ url: String, what: String, whole: Bool) async throws(StoreAPIError) -> JSON {
        try await withStoreRetries(delays: Self.retryDelays) { error, retry in
            logger.debug("Paddle API call failed; retrying", metadata: ["attempt": "\(retry)", LogKey.error: "\(error)"])
        } _: { () async throws(StoreAPIError) in
            try await send(method, url, what: what, whole: whole)
        }
    }

    private func read(_ prefix: String, _ id: String, what: String) async throws(StoreAPIError) -> JSON {
        guard !id.isEmpty else { throw StoreAPIError(.paddle, kind: .rejected, message: "the \(what) id is empty") }
        let url = baseURL + prefix + PercentEncoding.pathSegment(id)
        return try await withStoreRetries(delays: Self.retryDelays) { error, retry in
            logger.debug("Paddle API call failed; retrying", metadata: ["attempt": "\(retry)", LogKey.error: "\(error)"])
        } _: { () async throws(StoreAPIError) in
            try await get(url, what: "\(what) \(id)")
        }
    }

    private func get(_ url: String, what: String) async throws(StoreAPIError) -> JSON {
        try await send("GET", url, what: what, whole: false)
    }

    /// One request: `data` of a 2xx answer (the whole document with `whole`), or the error its status means.
    private func send(_ method: String, _ url: String, what: String, whole: Bool) async throws(StoreAPIError) -> JSON {
        let response: HTTPClientResponse
        do {
            var headers = [("Authorization", "Bearer \(apiKey)"), ("Accept", "application/json")]
            if method == "POST" { headers.append(("Content-Type", "application/json")) }
            response = try await http.send(method, url, headers: headers, body: method == "POST" ? Array("{}".utf8) : nil)
        } catch {
            throw StoreAPIError.transport(error, api: .paddle, endpoint: "the Paddle API at \(baseURL)", setting: "paddle.api.baseUrl")
        }
        let status = response.status
        switch status {
        case 200..<300:
            guard let document = try? JSON.parse(response.body), let data = document["data"], data.objectValue != nil || data.arrayValue != nil else {
                throw StoreAPIError(.paddle, kind: .invalidResponse, message: "\(what) came back as HTTP \(status) without data")
            }
            return whole ? document : data
        case 404:
            throw StoreAPIError(.paddle, kind: .notFound, message: "Paddle does not know \(what) (HTTP 404): it belongs to another account or environment")
        case 429, 500...:
            throw StoreAPIError.unavailable(
                .paddle, status: status, retryAfterHeader: response.header("retry-after"), message: "the Paddle API answered HTTP \(status) for \(what)")
        default:
            let hint = status == 401 || status == 403 ? "; check paddle.api.apiKey (it needs read access to transactions and subscriptions)" : ""
            throw StoreAPIError(.paddle, kind: .rejected, message: "the Paddle API refused the request for \(what) (HTTP \(status))\(hint)")
        }
    }
}

extension PaddleClient: PaddleReads {
    /// `GET /transactions/{id}`.
    public func transaction(_ id: String) async throws(StoreAPIError) -> JSON {
        try await read("/transactions/", id, what: "transaction")
    }

    /// `GET /subscriptions/{id}`.
    public func subscription(_ id: String) async throws(StoreAPIError) -> JSON {
        try await read("/subscriptions/", id, what: "subscription")
    }

    /// `GET /notifications?from=&to=&per_page=200[&after=]`: a page, with `meta.pagination` (`has_more`, `next`).
    public func notifications(settingId: String, from: String, to: String, after: String?) async throws(StoreAPIError) -> JSON {
        var query = [("notification_setting_id", settingId), ("from", from), ("to", to), ("per_page", "200")]
        if let after { query.append(("after", after)) }
        let url = baseURL + "/notifications?" + query.map { "\($0.0)=\(PercentEncoding.encode($0.1))" }.joined(separator: "&")
        return try await call("GET", url, what: "the notifications list", whole: true)
    }

    /// `GET /transactions?subscription_id=&status=completed&order_by=billed_at[…]&per_page=&after=`: a page,
    /// with `meta.pagination` (`has_more`).
    public func transactions(subscriptionId: String, newestFirst: Bool, perPage: Int, after: String?) async throws(StoreAPIError) -> JSON {
        var query = [
            ("subscription_id", subscriptionId), ("status", "completed"), ("order_by", newestFirst ? "billed_at[DESC]" : "billed_at[ASC]"),
            ("per_page", String(perPage)),
        ]
        if let after { query.append(("after", after)) }
        let url = baseURL + "/transactions?" + query.map { "\($0.0)=\(PercentEncoding.encode($0.1))" }.joined(separator: "&")
        return try await call("GET", url, what: "the transactions of \(subscriptionId)", whole: true)
    }

    /// `GET /subscriptions?per_page=200[&after=]`: a page, with `meta.pagination` (`has_more`).
    public func subscriptions(after: String?) async throws(StoreAPIError) -> JSON {
        var query = [("per_page", "200")]
        if let after { query.append(("after", after)) }
        return try await call("GET", baseURL + "/subscriptions?" + Self.query(query), what: "the subscriptions list", whole: true)
    }

    /// `GET /adjustments?subscription_id=&per_page=50[&after=]`: a page, with `meta.pagination` (`has_more`).
    public func adjustments(subscriptionId: String, after: String?) async throws(StoreAPIError) -> JSON {
        var query = [("subscription_id", subscriptionId), ("per_page", "50")]
        if let after { query.append(("after", after)) }
        return try await call("GET", baseURL + "/adjustments?" + Self.query(query), what: "the adjustments of \(subscriptionId)", whole: true)
    }

    /// `GET /adjustments?id=`: the adjustment, or `.notFound` when the list is empty.
    public func adjustment(_ id: String) async throws(StoreAPIError) -> JSON {
        guard !id.isEmpty else { throw StoreAPIError(.paddle, kind: .rejected, message: "the adjustment id is empty") }
        let list = try await call("GET", baseURL + "/adjustments?" + Self.query([("id", id)]), what: "adjustment \(id)", whole: false)
        guard let adjustment = list.arrayValue?.first(where: { $0["id"]?.stringValue == id }) else {
            throw StoreAPIError(.paddle, kind: .notFound, message: "Paddle does not know adjustment \(id): it belongs to another account or environment")
        }
        return adjustment
    }

    static func query(_ items: [(String, String)]) -> String {
        items.map { "\($0.0)=\(PercentEncoding.encode($0.1))" }.joined(separator: "&")
    }

    /// `POST /notifications/{id}/replay`: Paddle sends it again to its notification destination.
    public func replayNotification(_ id: String) async throws(StoreAPIError) -> JSON {
        guard !id.isEmpty else { throw StoreAPIError(.paddle, kind: .rejected, message: "the notification id is empty") }
        return try await call("POST", baseURL + "/notifications/" + PercentEncoding.pathSegment(id) + "/replay", what: "replaying notification \(id)", whole: false)
    }
}
