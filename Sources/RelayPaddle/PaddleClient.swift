import Foundation
public import Logging
public import RelayConfig
public import RelayCore
public import RelayHTTPClient

/// The few Paddle Billing API reads the relay needs, over libcurl with the configured API key: a
/// transaction and a subscription, for the purchases apps hand over. Paddle answers `{"data": {...},
/// "meta": {...}}`; these return `data`. Connection errors, timeouts, 5xx and 429 are tried three times in
/// all, 100 ms and 200 ms apart.
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

    private func read(_ prefix: String, _ id: String, what: String) async throws(StoreAPIError) -> JSON {
        guard !id.isEmpty else { throw StoreAPIError(.paddle, kind: .rejected, message: "the \(what) id is empty") }
        let url = baseURL + prefix + PercentEncoding.pathSegment(id)
        return try await withRetries(delays: Self.retryDelays, isRetriable: \.isRetriable) { error, retry in
            logger.debug("Paddle API call failed; retrying", metadata: ["attempt": "\(retry)", LogKey.error: "\(error)"])
        } _: { () async throws(StoreAPIError) in
            try await get(url, what: "\(what) \(id)")
        }
    }

    private func get(_ url: String, what: String) async throws(StoreAPIError) -> JSON {
        let response: HTTPClientResponse
        do {
            response = try await http.send("GET", url, headers: [("Authorization", "Bearer \(apiKey)"), ("Accept", "application/json")])
        } catch {
            throw StoreAPIError.transport(error, api: .paddle, endpoint: "the Paddle API at \(baseURL)", setting: "paddle.api.baseUrl")
        }
        let status = response.status
        switch status {
        case 200..<300:
            guard let document = try? JSON.parse(response.body), let data = document["data"], case .object = data else {
                throw StoreAPIError(.paddle, kind: .invalidResponse, message: "\(what) came back as HTTP \(status) without a data object")
            }
            return data
        case 404:
            throw StoreAPIError(.paddle, kind: .notFound, message: "Paddle does not know \(what) (HTTP 404): it belongs to another account or environment")
        case 429, 500...:
            throw StoreAPIError(.paddle, kind: .unavailable, message: "the Paddle API answered HTTP \(status) for \(what)")
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
}
