/// Why a Play Developer API call failed. `isRetriable` says whether trying again later can help.
///
/// Messages say what to do about the failure and never contain the service account's private key, the
/// signed OAuth assertion or an access token.
public struct PlayAPIError: Error, Sendable, CustomStringConvertible {
    public enum Kind: String, Sendable {
        /// The service-account key file is missing, unreadable or not a usable key, or a configured URL
        /// is malformed: fix `playApi` in the configuration.
        case configuration
        /// Google does not know the purchase token (HTTP 404 or 410): unknown, or expired long ago.
        case notFound = "not_found"
        /// Google refused the request (any other 4xx, a 401 that a fresh token did not cure, or a 4xx
        /// from the token endpoint such as `invalid_grant`): usually permissions or the key; retrying
        /// will not help.
        case rejected
        /// Unreachable, timed out, 5xx or 429 (from the API or the token endpoint) after the retries.
        case unavailable
        /// Google answered something that is not the documented JSON.
        case invalidResponse = "invalid_response"
    }

    public var kind: Kind
    public var message: String

    public init(kind: Kind, message: String) {
        self.kind = kind
        self.message = message
    }

    /// Only `.unavailable` failures may succeed later.
    public var isRetriable: Bool { kind == .unavailable }

    public var description: String { "Play Developer API \(kind.rawValue): \(message)" }
}
