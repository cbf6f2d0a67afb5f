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

    public init(_ api: API, kind: Kind, message: String, status: Int? = nil) {
        self.api = api
        self.kind = kind
        self.message = message
        self.status = status
    }

    /// Only `.unavailable` failures may succeed later.
    public var isRetriable: Bool { kind == .unavailable }

    public var description: String { "\(api.rawValue) \(kind.rawValue): \(message)" }
}
