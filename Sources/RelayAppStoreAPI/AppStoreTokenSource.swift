import RelayCore
import RelayCrypto
import Synchronization

/// The bearer tokens of the App Store Server API: JWTs the client signs itself with its App Store
/// Connect key (ES256), no token endpoint involved
/// (https://developer.apple.com/documentation/appstoreserverapi/generating-json-web-tokens-for-api-requests).
///
/// A token lives 20 minutes (Apple accepts at most 60) and is reused until 5 minutes before it
/// expires, so a request never carries one that runs out on the way and a refused one is soon
/// replaced. Signing is local and takes microseconds, so it happens under the cache's lock.
public final class AppStoreTokenSource: Sendable {
    /// A signed token and its lifetime (seconds since 1970, by this machine's clock). `description`
    /// leaves the token out, so logging one prints no credential.
    public struct Token: Sendable, Equatable, CustomStringConvertible {
        /// The compact JWS, sent as `Authorization: Bearer <value>`.
        public let value: String
        public let issuedAt: Int64
        public let expiresAt: Int64

        public var description: String { "App Store Server API bearer token (iat \(issuedAt), exp \(expiresAt))" }
    }

    /// `exp - iat`. Short, so a leaked token is useless soon; Apple's limit is 3600 s.
    public static let lifetime: Int64 = 20 * 60
    /// A cached token is replaced this long before it expires.
    public static let refreshMargin: Int64 = 5 * 60
    /// The audience Apple requires of every App Store Server API token.
    public static let audience = "appstoreconnect-v1"

    public let key: AppStoreConnectKey
    private let now: @Sendable () -> Int64
    private let cached = Mutex<Token?>(nil)

    /// - Parameter now: seconds since 1970, for `iat`/`exp` and the cache.
    public init(key: AppStoreConnectKey, now: @escaping @Sendable () -> Int64) {
        self.key = key
        self.now = now
    }

    /// The cached token while it has more than `refreshMargin` left, else a newly signed one.
    public func token() throws(AppStoreAPIError) -> Token {
        let current = now()
        return try cached.withLock { cached throws(AppStoreAPIError) -> Token in
            // A clock that went back past `iat` gets a new token too: Apple refuses one issued in its future.
            if let token = cached, current >= token.issuedAt, current < token.expiresAt - Self.refreshMargin { return token }
            let token = try sign(issuedAt: current)
            cached = token
            return token
        }
    }

    /// Forgets `token` after Apple refused it, unless a newer token has replaced it already.
    public func invalidate(_ token: Token) {
        cached.withLock { cached in
            if cached == token { cached = nil }
        }
    }

    /// The signed JWT: header `{"alg":"ES256","kid":…,"typ":"JWT"}`, claims `iss`, `iat`, `exp`, `aud`, `bid`.
    func sign(issuedAt: Int64) throws(AppStoreAPIError) -> Token {
        let header: JSON = ["alg": "ES256", "kid": .string(key.keyId), "typ": "JWT"]
        let expiresAt = issuedAt + Self.lifetime
        let claims: JSON = [
            "iss": .string(key.issuerId), "iat": .integer(issuedAt), "exp": .integer(expiresAt),
            "aud": .string(Self.audience), "bid": .string(key.bundleId),
        ]
        let signingInput = Base64.encodeURL(header.serialized()) + "." + Base64.encodeURL(claims.serialized())
        let signature: [UInt8]
        do {
            signature = try key.privateKey.signES256(Array(signingInput.utf8))
        } catch {
            throw AppStoreAPIError(.configuration, "\(key) could not sign an ES256 token (\(error))")
        }
        return Token(value: signingInput + "." + Base64.encodeURL(signature), issuedAt: issuedAt, expiresAt: expiresAt)
    }
}
