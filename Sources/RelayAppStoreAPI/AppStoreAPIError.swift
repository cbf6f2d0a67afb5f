public import RelayCore

/// Why a call to the App Store Server API failed. `isRetriable` says whether trying again later can
/// help. Messages say what to do and never contain the private key or a bearer token.
///
/// Its own type rather than RelayCore's `StoreAPIError`: callers need Apple's `errorCode` (which
/// 404s may be retried, which 400 field was wrong), the refused-key case apart from other
/// refusals, and the server's `Retry-After`.
public struct AppStoreAPIError: Error, Sendable, CustomStringConvertible {
    public enum Kind: String, Sendable {
        /// The key file is missing or not an EC P-256 key, an id is empty, or the base URL is malformed:
        /// fix the configuration.
        case configuration
        /// HTTP 401: Apple refused the signed bearer token. The key is revoked, not an In-App Purchase
        /// key, or its key id / issuer id / bundle id do not match, or this machine's clock is wrong.
        case keyRefused = "key_refused"
        /// HTTP 404 (not one of Apple's "retryable" 404s): the transaction is unknown in this environment
        /// for this bundle id.
        case notFound = "not_found"
        /// Another 4xx: the request is wrong (`errorCode` says which field); retrying will not help.
        case rejected
        /// Unreachable, timed out, 5xx, 429 or a retryable 404 after the retries: try again later
        /// (not before `retryAfter` when set).
        case unavailable
        /// Apple answered something that is not the documented JSON.
        case invalidResponse = "invalid_response"
    }

    public var kind: Kind
    public var message: String
    /// The HTTP status, when there was an answer.
    public var status: Int?
    /// Apple's numeric `errorCode` from the error body (4040010 is TransactionIdNotFoundError).
    public var errorCode: Int64?
    /// How long the server asked to wait (`Retry-After`), when it said.
    public var retryAfter: Duration?

    public init(_ kind: Kind, _ message: String, status: Int? = nil, errorCode: Int64? = nil, retryAfter: Duration? = nil) {
        self.kind = kind
        self.message = message
        self.status = status
        self.errorCode = errorCode
        self.retryAfter = retryAfter
    }

    /// Only `.unavailable` failures may succeed later.
    public var isRetriable: Bool { kind == .unavailable }

    public var description: String { "App Store Server API \(kind.rawValue): \(message)" }

    /// Apple's 404 error codes that mean "not yet, try again" (AccountNotFoundRetryable,
    /// AppNotFoundRetryable, OriginalTransactionIdNotFoundRetryable): retried, never `.notFound`.
    static let retryableNotFoundCodes: Set<Int64> = [4_040_002, 4_040_004, 4_040_006]

    /// Text from Apple quoted in a message: at most 200 characters, without control characters.
    static func excerpt(_ text: String) -> String {
        let cleaned = String(String.UnicodeScalarView(text.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F }))
        return cleaned.count > 200 ? cleaned.prefix(200) + "…" : cleaned
    }
}

extension AppStoreAPIError: StoreCallFailure {
    public var apiName: String { "App Store Server API" }
}
