import Logging
import RelayCore
import RelayHTTPClient
import RelayCrypto
import Synchronization

/// OAuth 2.0 access tokens for a service account, by the JWT bearer grant
/// (https://developers.google.com/identity/protocols/oauth2/service-account#httprest): an RS256 JWT
/// signed with the service account's key is exchanged at the token endpoint for a bearer token.
///
/// A token is cached until `refreshMargin` before it expires. Callers that need a token while none is
/// cached share one request to the token endpoint. A token the API refused is forgotten with
/// `invalidate(_:)`, so the next caller fetches a new one.
final class AccessTokenSource: Sendable {
    /// A bearer token and when it expires (seconds since 1970, by the client's clock).
    struct AccessToken: Sendable, Equatable {
        var value: String
        var expiresAt: Int64
    }

    /// The scope the Play Developer API needs.
    static let scope = "https://www.googleapis.com/auth/androidpublisher"
    /// The assertion's lifetime (`exp - iat`); Google accepts at most one hour.
    static let assertionLifetime: Int64 = 3600
    /// A cached token is replaced this long before it expires, so no request carries one that runs
    /// out on the way.
    static let refreshMargin: Int64 = 60

    private struct State {
        var cached: AccessToken?
        /// The token request every caller waits for while there is no usable cached token.
        var inFlight: Task<Result<AccessToken, StoreAPIError>, Never>?
    }

    private enum Lookup {
        case cached(AccessToken)
        case pending(Task<Result<AccessToken, StoreAPIError>, Never>)
    }

    let key: ServiceAccountKey
    let tokenURL: String
    private let http: HTTPClient
    private let logger: Logger
    private let now: @Sendable () -> Int64
    private let state = Mutex(State())

    init(key: ServiceAccountKey, tokenURL: String, http: HTTPClient, logger: Logger, now: @escaping @Sendable () -> Int64) {
        self.key = key
        self.tokenURL = tokenURL
        self.http = http
        self.logger = logger
        self.now = now
    }

    /// A token valid for at least `refreshMargin` more seconds (when Google grants that long): the
    /// cached one, or the one the shared in-flight request brings.
    func token() async throws(StoreAPIError) -> AccessToken {
        let current = now()
        let lookup = state.withLock { state -> Lookup in
            if let cached = state.cached, current < cached.expiresAt - Self.refreshMargin { return .cached(cached) }
            if let running = state.inFlight { return .pending(running) }
            // The task's last step takes this lock, so it cannot finish before `inFlight` is set.
            let task = Task { await self.fetch() }
            state.inFlight = task
            return .pending(task)
        }
        switch lookup {
        case .cached(let token): return token
        case .pending(let task): return try await task.value.get()
        }
    }

    /// Forgets `token` after the API refused it, unless a newer token has replaced it already.
    func invalidate(_ token: AccessToken) {
        state.withLock { state in
            if state.cached == token { state.cached = nil }
        }
    }

    /// Requests a token and publishes the outcome to the cache; runs once per shared request.
    private func fetch() async -> Result<AccessToken, StoreAPIError> {
        let result: Result<AccessToken, StoreAPIError>
        do throws(StoreAPIError) {
            result = .success(try await requestToken())
        } catch {
            result = .failure(error)
        }
        state.withLock { state in
            if case .success(let token) = result { state.cached = token }
            state.inFlight = nil
        }
        switch result {
        case .success(let token):
            logger.debug(
                "Play Developer API access token obtained",
                metadata: [PlayLogKey.serviceAccount: "\(key.clientEmail)", PlayLogKey.expiresIn: "\(token.expiresAt - now())"])
        case .failure(let error):
            logger.warning(
                "Play Developer API access token could not be obtained",
                metadata: [PlayLogKey.serviceAccount: "\(key.clientEmail)", LogKey.error: "\(error)"])
        }
        return result
    }

    /// One JWT bearer grant: POST the signed assertion as a form, read the token from the answer.
    private func requestToken() async throws(StoreAPIError) -> AccessToken {
        let issuedAt = now()
        let assertion = try assertion(issuedAt: issuedAt)
        let form =
            "grant_type=" + PercentEncoding.encode("urn:ietf:params:oauth:grant-type:jwt-bearer") + "&assertion=" + PercentEncoding.encode(assertion)
        let response: HTTPClientResponse
        do {
            response = try await http.send(
                "POST", tokenURL, headers: [("Content-Type", "application/x-www-form-urlencoded"), ("Accept", "application/json")],
                body: Array(form.utf8))
        } catch {
            throw StoreAPIError.transport(error, api: .play, endpoint: "the OAuth token endpoint \(tokenURL)", setting: "playApi.tokenUrl")
        }
        switch response.status {
        case 200:
            return try Self.accessToken(response, issuedAt: issuedAt, tokenURL: tokenURL)
        case 429, 500...:
            throw StoreAPIError(.play, kind: .unavailable, message: "the OAuth token endpoint \(tokenURL) answered HTTP \(response.status)")
        case 400..<500:
            throw StoreAPIError(
                .play, kind: .rejected,
                message: "the OAuth token endpoint \(tokenURL) refused the service account \(key.clientEmail) (HTTP \(response.status)"
                    + Self.oauthError(response.body, redacting: assertion)
                    + "); check that the key in playApi.serviceAccountKey has not been deleted or disabled in the Google Cloud console"
                    + " and that this machine's clock is right")
        default:
            throw StoreAPIError(.play, kind: .invalidResponse, message: "the OAuth token endpoint \(tokenURL) answered an unexpected HTTP \(response.status)")
        }
    }

    /// The signed JWT: header `{"alg":"RS256","typ":"JWT","kid":…}`, claims `iss`, `scope`, `aud`, `iat`, `exp`.
    func assertion(issuedAt: Int64) throws(StoreAPIError) -> String {
        var header: [String: JSON] = ["alg": "RS256", "typ": "JWT"]
        if let kid = key.privateKeyId { header["kid"] = .string(kid) }
        let claims: JSON = [
            "iss": .string(key.clientEmail), "scope": .string(Self.scope), "aud": .string(tokenURL),
            "iat": .integer(issuedAt), "exp": .integer(issuedAt + Self.assertionLifetime),
        ]
        let signingInput = Base64.encodeURL(JSON.object(header).serialized()) + "." + Base64.encodeURL(claims.serialized())
        let signature: [UInt8]
        do {
            signature = try key.privateKey.signRS256(Array(signingInput.utf8))
        } catch {
            throw StoreAPIError(.play, kind: .configuration, message: "the service account's private key could not sign the OAuth assertion (\(error))")
        }
        return signingInput + "." + Base64.encodeURL(signature)
    }

    /// The token of a 200 answer: `{"access_token", "expires_in", "token_type": "Bearer"}`.
    private static func accessToken(_ response: HTTPClientResponse, issuedAt: Int64, tokenURL: String) throws(StoreAPIError) -> AccessToken {
        func invalid(_ problem: String) -> StoreAPIError {
            StoreAPIError(.play, kind: .invalidResponse, message: "the OAuth token endpoint \(tokenURL) answered 200 with \(problem)")
        }
        guard let document = try? JSON.parse(response.body), case .object = document else { throw invalid("a body that is not a JSON object") }
        guard let value = document["access_token"]?.stringValue, !value.isEmpty else { throw invalid("no access_token") }
        if let type = document["token_type"], type.stringValue?.lowercased() != "bearer" {
            throw invalid("a token_type other than Bearer")
        }
        // expires_in is only RECOMMENDED (RFC 6749 section 5.1); Google always sends it, and its tokens last an hour.
        let lifetime = document["expires_in"].map { $0.int64Value } ?? assertionLifetime
        guard let lifetime, lifetime > 0 else { throw invalid("an expires_in that is not a positive integer") }
        // Counted from when the request was sent, so the cache errs on the early side.
        return AccessToken(value: value, expiresAt: issuedAt + min(lifetime, 86_400))
    }

    /// `, error "…": "…"` from an RFC 6749 error body (`error`, `error_description`), or nothing. The
    /// text is Google's, shortened, with control characters dropped and the assertion (should an
    /// endpoint ever echo it) blanked out.
    static func oauthError(_ body: [UInt8], redacting assertion: String) -> String {
        guard let document = try? JSON.parse(body), let code = document["error"]?.stringValue else { return "" }
        func quoted(_ text: String) -> String {
            "\"" + StoreAPIError.excerpt(assertion.isEmpty ? text : text.replacing(assertion, with: "[assertion]")) + "\""
        }
        var text = ", error \(quoted(code))"
        if let description = document["error_description"]?.stringValue, !description.isEmpty { text += ": \(quoted(description))" }
        return text
    }
}
