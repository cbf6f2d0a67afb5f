import Foundation

/// Why a call to a store's API (Google's Play Developer API, Stripe's API, the App Store Server API) failed. `isRetriable` says
/// whether trying again later can help. Messages say what to do and never contain a key, a signed
/// assertion or an access token.
public struct StoreAPIError: Error, Sendable, CustomStringConvertible {
    /// Which API answered (or did not).
    public enum API: String, Sendable {
        case play = "Play Developer API"
        case stripe = "Stripe API"
        case paddle = "Paddle API"
        case appStore = "App Store Server API"
    }

    public enum Kind: String, Sendable {
        /// A key file is missing, unreadable or not a usable key, or a configured URL is malformed: fix
        /// the API's configuration (`playApi`, `stripe.api`).
        case configuration
        /// The store does not know the object (HTTP 404, or 410 from Google): unknown, or expired long ago.
        case notFound = "not_found"
        /// The store refused the request (a 4xx that a fresh token did not cure, or a token endpoint's
        /// `invalid_grant`): usually permissions or the key; retrying will not help.
        case rejected
        /// Unreachable, timed out, 5xx or 429 after the retries.
        case unavailable
        /// The store answered something that is not the documented JSON.
        case invalidResponse = "invalid_response"
    }

    public var api: API
    public var kind: Kind
    public var message: String
    /// The HTTP status, when the store answered (a 401 tells a refused key from other refusals).
    public var status: Int?
    /// How long the store asked to be left alone (`Retry-After` of a 429 or 5xx), when it said.
    public var retryAfter: Duration?

    public init(_ api: API, kind: Kind, message: String, status: Int? = nil) {
        self.api = api
        self.kind = kind
        self.message = message
        self.status = status
    }

    /// Only `.unavailable` failures may succeed later.
    public var isRetriable: Bool { kind == .unavailable }

    public var description: String { "\(api.rawValue) \(kind.rawValue): \(message)" }

    /// The longest `Retry-After` a client waits for inside one call; a longer one ends the call with the
    /// error, for the caller to schedule (the worker's backoff, a history command's `HistoryLoop`).
    public static let maximumRetryAfter: Duration = .seconds(10)

    /// `.unavailable` for a 429 or 5xx answer, with its `Retry-After` (seconds or an HTTP date).
    public static func unavailable(_ api: API, status: Int, retryAfterHeader: String?, message: String) -> StoreAPIError {
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        var error = StoreAPIError(api, kind: .unavailable, message: message, status: status)
        if let milliseconds = RetryAfter.milliseconds(retryAfterHeader, now: now) {
            error.retryAfter = .milliseconds(milliseconds)
            error.message += "; it asked to wait \(milliseconds / 1000) s (Retry-After)"
        }
        return error
    }
}

/// A failed call to a store's API that a long-running command can wait out: `isRetriable` with the
/// store's `Retry-After`, when it gave one.
public protocol StoreCallFailure: Error {
    var isRetriable: Bool { get }
    var retryAfter: Duration? { get }
    var status: Int? { get }
    /// The API's name for messages ("Stripe API").
    var apiName: String { get }
}

extension StoreAPIError: StoreCallFailure {
    public var apiName: String { api.rawValue }
}

/// `withRetries` for one store API call: `.unavailable` failures are tried again after `delays`, or after
/// the store's `Retry-After` when that is longer. A `Retry-After` beyond `StoreAPIError.maximumRetryAfter`
/// is not waited for: the error carries it.
public func withStoreRetries<Value>(
    delays: [Duration], onRetry: (StoreAPIError, Int) -> Void, _ operation: () async throws(StoreAPIError) -> Value
) async throws(StoreAPIError) -> Value {
    try await withRetries(
        delays: delays, isRetriable: { $0.isRetriable && ($0.retryAfter.map { $0 <= StoreAPIError.maximumRetryAfter } ?? true) }, onRetry: onRetry,
        wait: { max($1, $0.retryAfter ?? .zero) }, operation)
}
