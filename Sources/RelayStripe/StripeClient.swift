import Foundation
public import Logging
public import RelayConfig
public import RelayCore
public import RelayHTTPClient

/// The few Stripe API reads the normalizer needs, over libcurl with the configured secret key: a
/// refunded charge with its invoice expanded, which names the subscription and price the refund is of.
///
/// Requests pin `Stripe-Version` to 2024-06-20, the last version whose charges still name their invoice
/// (2025-03-31.basil moved that to invoice payments), so the answer's shape does not follow the account's
/// default version. Connection errors, timeouts, 5xx and 429 are tried three times in all, 100 ms and
/// 200 ms apart, or after the answer's `Retry-After` when longer (up to `StoreAPIError.maximumRetryAfter`;
/// a longer one is returned in the error).
public final class StripeClient: Sendable {
    static let apiVersion = "2024-06-20"
    static let retryDelays: [Duration] = [.milliseconds(100), .milliseconds(200)]

    private let baseURL: String
    private let secretKey: String
    private let http: HTTPClient
    private let logger: Logger

    public init(
        configuration: RelayConfiguration.StripeAPI,
        http: HTTPClient = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(15), maxConcurrentTransfers: 8),
        logger: Logger
    ) {
        var baseURL = configuration.baseUrl
        while baseURL.hasSuffix("/") { baseURL.removeLast() }
        self.baseURL = baseURL
        self.secretKey = configuration.secretKey
        self.http = http
        self.logger = logger
    }

    /// `GET /v1/charges/{id}?expand[]=invoice`: the Charge, its `invoice` an Invoice object (or null).
    public func charge(_ id: String) async throws(StoreAPIError) -> JSON {
        guard !id.isEmpty else { throw StoreAPIError(.stripe, kind: .rejected, message: "the charge id is empty") }
        let url = baseURL + "/v1/charges/" + PercentEncoding.pathSegment(id) + "?expand%5B%5D=invoice"
        return try await withStoreRetries(delays: Self.retryDelays) { error, retry in
            logger.debug("Stripe API call failed; retrying", metadata: ["attempt": "\(retry)", LogKey.error: "\(error)"])
        } _: { () async throws(StoreAPIError) in
            try await get(url, what: "charge \(id)")
        }
    }

    /// `GET /v1/subscriptions/{id}`: the Subscription (a purchase an app hands over).
    public func subscription(_ id: String) async throws(StoreAPIError) -> JSON {
        try await read("/v1/subscriptions/", id, what: "subscription")
    }

    /// `GET /v1/checkout/sessions/{id}`: the Checkout Session (a purchase an app hands over).
    public func checkoutSession(_ id: String) async throws(StoreAPIError) -> JSON {
        try await read("/v1/checkout/sessions/", id, what: "checkout session")
    }

    /// `GET /v1/events?…`: one page of events created in [`createdFrom`, `createdBefore`) (Unix seconds) of
    /// `types`, newest first, after `startingAfter`.
    public func events(createdFrom: Int64, createdBefore: Int64, types: [String], startingAfter: String?) async throws(StoreAPIError) -> JSON {
        var query = [("created[gte]", String(createdFrom)), ("created[lt]", String(createdBefore)), ("limit", "100")]
        query += types.map { ("types[]", $0) }
        if let startingAfter { query.append(("starting_after", startingAfter)) }
        let url = baseURL + "/v1/events?" + query.map { "\(PercentEncoding.encode($0.0))=\(PercentEncoding.encode($0.1))" }.joined(separator: "&")
        return try await withStoreRetries(delays: Self.retryDelays) { error, retry in
            logger.debug("Stripe API call failed; retrying", metadata: ["attempt": "\(retry)", LogKey.error: "\(error)"])
        } _: { () async throws(StoreAPIError) in
            try await get(url, what: "the events list")
        }
    }

    /// `GET /v1/subscriptions?status=all&limit=100…`: one page of the account's subscriptions, newest first.
    public func subscriptions(createdFrom: Int64?, startingAfter: String?) async throws(StoreAPIError) -> JSON {
        var query = [("status", "all"), ("limit", "100")]
        if let createdFrom { query.append(("created[gte]", String(createdFrom))) }
        if let startingAfter { query.append(("starting_after", startingAfter)) }
        return try await list("/v1/subscriptions", query, what: "the subscriptions list")
    }

    /// `GET /v1/invoices?subscription=&status=paid&limit=100…`: one page of a subscription's paid invoices.
    public func invoices(subscription: String, startingAfter: String?) async throws(StoreAPIError) -> JSON {
        var query = [("subscription", subscription), ("status", "paid"), ("limit", "100")]
        if let startingAfter { query.append(("starting_after", startingAfter)) }
        return try await list("/v1/invoices", query, what: "the invoices of \(subscription)")
    }

    /// `GET /v1/charges?customer=&limit=100…`: one page of a customer's charges.
    public func charges(customer: String, startingAfter: String?) async throws(StoreAPIError) -> JSON {
        var query = [("customer", customer), ("limit", "100")]
        if let startingAfter { query.append(("starting_after", startingAfter)) }
        return try await list("/v1/charges", query, what: "the charges of \(customer)")
    }

    private func list(_ path: String, _ query: [(String, String)], what: String) async throws(StoreAPIError) -> JSON {
        let url = baseURL + path + "?" + query.map { "\(PercentEncoding.encode($0.0))=\(PercentEncoding.encode($0.1))" }.joined(separator: "&")
        return try await withStoreRetries(delays: Self.retryDelays) { error, retry in
            logger.debug("Stripe API call failed; retrying", metadata: ["attempt": "\(retry)", LogKey.error: "\(error)"])
        } _: { () async throws(StoreAPIError) in
            try await get(url, what: what)
        }
    }

    /// `GET /v1/events/{id}`: one event, as Stripe sent (or would have sent) it to a webhook.
    public func event(_ id: String) async throws(StoreAPIError) -> JSON {
        try await read("/v1/events/", id, what: "event")
    }

    /// `GET /v1/invoices/{id}`: the Invoice (`reconcile stripe`'s missed renewal).
    public func invoice(_ id: String) async throws(StoreAPIError) -> JSON {
        try await read("/v1/invoices/", id, what: "invoice")
    }

    /// `GET /v1/prices/{id}`: the Price (its `type`, `recurring`), for a Checkout Session's mode.
    public func price(_ id: String) async throws(StoreAPIError) -> JSON {
        try await read("/v1/prices/", id, what: "price")
    }

    /// `POST /v1/checkout/sessions`: a Checkout Session from `form`. Retried like a read: `Idempotency-Key`
    /// makes Stripe answer a repeat with the session the first request made.
    public func createCheckoutSession(_ form: [(String, String)], idempotencyKey: String) async throws(StoreAPIError) -> JSON {
        let body = Array(form.map { "\(PercentEncoding.encode($0.0))=\(PercentEncoding.encode($0.1))" }.joined(separator: "&").utf8)
        let url = baseURL + "/v1/checkout/sessions"
        return try await withStoreRetries(delays: Self.retryDelays) { error, retry in
            logger.debug("Stripe API call failed; retrying", metadata: ["attempt": "\(retry)", LogKey.error: "\(error)"])
        } _: { () async throws(StoreAPIError) in
            try await send("POST", url, what: "a new checkout session", body: body, extraHeaders: [
                ("Content-Type", "application/x-www-form-urlencoded"), ("Idempotency-Key", idempotencyKey),
            ])
        }
    }

    private func read(_ prefix: String, _ id: String, what: String) async throws(StoreAPIError) -> JSON {
        guard !id.isEmpty else { throw StoreAPIError(.stripe, kind: .rejected, message: "the \(what) id is empty") }
        let url = baseURL + prefix + PercentEncoding.pathSegment(id)
        return try await withStoreRetries(delays: Self.retryDelays) { error, retry in
            logger.debug("Stripe API call failed; retrying", metadata: ["attempt": "\(retry)", LogKey.error: "\(error)"])
        } _: { () async throws(StoreAPIError) in
            try await get(url, what: "\(what) \(id)")
        }
    }

    private func get(_ url: String, what: String) async throws(StoreAPIError) -> JSON {
        try await send("GET", url, what: what)
    }

    private func send(_ method: String, _ url: String, what: String, body: [UInt8]? = nil, extraHeaders: [(String, String)] = [])
        async throws(StoreAPIError) -> JSON
    {
        let response: HTTPClientResponse
        do {
            response = try await http.send(
                method, url,
                headers: [("Authorization", "Bearer \(secretKey)"), ("Stripe-Version", Self.apiVersion), ("Accept", "application/json")] + extraHeaders,
                body: body)
        } catch {
            throw StoreAPIError.transport(error, api: .stripe, endpoint: "the Stripe API at \(baseURL)", setting: "stripe.api.baseUrl")
        }
        let status = response.status
        switch status {
        case 200..<300:
            guard let document = try? JSON.parse(response.body), case .object = document else {
                throw StoreAPIError(.stripe, kind: .invalidResponse, message: "\(what) came back as HTTP \(status) without a JSON object")
            }
            return document
        case 404:
            throw StoreAPIError(.stripe, kind: .notFound, message: "Stripe does not know \(what) (HTTP 404): it belongs to another account or mode")
        case 429, 500...:
            throw StoreAPIError.unavailable(
                .stripe, status: status, retryAfterHeader: response.header("retry-after"), message: "the Stripe API answered HTTP \(status) for \(what)")
        default:
            let hint = status == 401 || status == 403
                ? "; check stripe.api.secretKey (it needs read access to charges, invoices, subscriptions, prices and Checkout Sessions, and write access to Checkout Sessions for web checkout)"
                : ""
            throw StoreAPIError(
                .stripe, kind: .rejected, message: "the Stripe API refused the request for \(what) (HTTP \(status)\(Self.stripeError(response.body)))\(hint)")
        }
    }
}

extension StripeClient {
    /// `: <code>` of a Stripe error body (`{"error": {"code", "type"}}`): Stripe's machine code (`email_invalid`,
    /// `resource_missing`), never its message, which may quote what was sent (an e-mail address).
    static func stripeError(_ body: [UInt8]) -> String {
        let error = (try? JSON.parse(body))?["error"]
        guard let code = error?["code"]?.stringValue ?? error?["type"]?.stringValue,
            code.count <= 64, code.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "_") })
        else { return "" }
        return ": " + code
    }
}

extension StripeClient: StripeCharges {
    /// A client for each app that configures `stripe.api`, by app key.
    public static func clients(for configuration: RelayConfiguration, logger: Logger) -> [String: any StripeCharges] {
        var clients: [String: any StripeCharges] = [:]
        // One transfer engine (one thread, one connection cache) for every app's client; none without one.
        guard configuration.apps.contains(where: { $0.stripe?.api != nil }) else { return [:] }
        let http = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(15), maxConcurrentTransfers: 8)
        for app in configuration.apps {
            if let api = app.stripe?.api { clients[app.key] = StripeClient(configuration: api, http: http, logger: logger) }
        }
        return clients
    }
}
