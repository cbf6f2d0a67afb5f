public import RelayCrypto
import Foundation
public import Logging
public import RelayCore
public import RelayHTTPClient
import Synchronization

/// Google's public keys for Pub/Sub push tokens, by `kid`, from a file or an HTTPS URL (fetched with
/// libcurl). Two formats are read: a JWKS (`{"keys": [{"kty": "RSA", "kid", "n", "e"}]}`, as at
/// https://www.googleapis.com/oauth2/v3/certs) and the PEM map (`{"<kid>": "-----BEGIN CERTIFICATE-----…"}`,
/// as at https://www.googleapis.com/oauth2/v1/certs).
///
/// Keys are cached; a URL is fetched again when its `Cache-Control: max-age` (default 1 h) runs out,
/// and a `kid` that is not known makes the source be read again (at most once per `refetchInterval`),
/// so Google's key rotation needs no restart. While a URL cannot be fetched, the keys already known
/// keep serving.
public final class GoogleKeySet: Sendable {
    public enum Source: Sendable, CustomStringConvertible {
        case file(String)
        case url(String)

        /// `https://…` (or `http://` on loopback) is a URL; anything else a file path.
        public init(_ text: String) {
            let lower = text.lowercased()
            self = lower.hasPrefix("https://") || lower.hasPrefix("http://") ? .url(text) : .file(text)
        }

        public var description: String {
            switch self {
            case .file(let path): path
            case .url(let url): url
            }
        }
    }

    /// Why a key set could not be read or parsed.
    public struct LoadError: Error, Sendable, CustomStringConvertible {
        public var message: String
        public var description: String { message }
    }

    private struct State {
        var keys: [String: PublicKey] = [:]
        var loaded = false
        var expiresAt: ContinuousClock.Instant = .now
        var lastAttempt: ContinuousClock.Instant?
        var inFlight: Task<Result<Void, LoadError>, Never>?
    }

    public let source: Source
    private let httpClient: HTTPClient
    private let refetchInterval: Duration
    private let logger: Logger
    private let state = Mutex(State())

    /// A file source is read now, so a missing or invalid file is a startup error; a URL is fetched on first use.
    public init(source: Source, httpClient: HTTPClient, refetchInterval: Duration = .seconds(60), logger: Logger) throws(LoadError) {
        self.source = source
        self.httpClient = httpClient
        self.refetchInterval = refetchInterval
        self.logger = logger
        if case .file(let path) = source {
            let keys = try Self.readFile(path)
            state.withLock {
                $0.keys = keys
                $0.loaded = true
                $0.expiresAt = .now + .seconds(365 * 86_400)
                $0.lastAttempt = .now
            }
        }
    }

    /// The key with this `kid`, or nil when the source, read again if allowed, has none. Throws only
    /// when no keys can be had at all, or the source cannot be reached to look for an unknown `kid`.
    public func key(for kid: String) async throws(VerificationUnavailable) -> PublicKey? {
        let (known, loaded, expired, mayRefetch) = state.withLock { state in
            let now = ContinuousClock.now
            let mayRefetch = state.lastAttempt.map { now - $0 >= refetchInterval } ?? true
            return (state.keys[kid], state.loaded, now >= state.expiresAt, mayRefetch)
        }
        if let known, !expired { return known }
        // Known sources are read again at most once per refetchInterval; until then an unknown kid is unknown.
        if loaded, !mayRefetch { return known }
        switch await refresh() {
        case .success: return state.withLock { $0.keys[kid] }
        case .failure(let error):
            if let known { return known }  // stale keys keep serving while the source is down
            throw VerificationUnavailable("Google's push-token keys could not be read from \(source): \(error)")
        }
    }

    /// Reads the source once, shared by every caller that arrives while it runs.
    private func refresh() async -> Result<Void, LoadError> {
        let task = state.withLock { state in
            if let running = state.inFlight { return running }
            state.lastAttempt = .now
            let task = Task { await self.load() }
            state.inFlight = task
            return task
        }
        return await task.value
    }

    private func load() async -> Result<Void, LoadError> {
        do {
            let (keys, lifetime) = try await fetch()
            state.withLock { state in
                state.keys = keys
                state.loaded = true
                state.expiresAt = .now + lifetime
                state.inFlight = nil
            }
            logger.info("Google push-token keys loaded", metadata: ["keys.source": "\(source)", "keys.count": "\(keys.count)"])
            return .success(())
        } catch {
            state.withLock { $0.inFlight = nil }
            logger.warning("Google push-token keys could not be loaded", metadata: ["keys.source": "\(source)", LogKey.error: "\(error)"])
            return .failure(error)
        }
    }

    private func fetch() async throws(LoadError) -> (keys: [String: PublicKey], lifetime: Duration) {
        switch source {
        case .file(let path):
            return (try Self.readFile(path), .seconds(365 * 86_400))
        case .url(let url):
            let response: HTTPClientResponse
            do {
                response = try await httpClient.send("GET", url, headers: [("Accept", "application/json")])
            } catch {
                throw LoadError(message: "GET failed: \(error)")
            }
            guard response.status == 200 else { throw LoadError(message: "GET answered HTTP \(response.status)") }
            return (try Self.parse(response.body), Self.maxAge(response.header("cache-control")) ?? .seconds(3600))
        }
    }

    private static func readFile(_ path: String) throws(LoadError) -> [String: PublicKey] {
        guard let data = FileManager.default.contents(atPath: path) else { throw LoadError(message: "cannot read \(path)") }
        do {
            return try parse(Array(data))
        } catch {
            throw LoadError(message: "\(path): \(error.message)")
        }
    }

    /// Parses a JWKS or a PEM certificate map; entries that are not RSA keys are skipped.
    public static func parse(_ bytes: [UInt8]) throws(LoadError) -> [String: PublicKey] {
        guard let document = try? JSON.parse(bytes), let object = document.objectValue else {
            throw LoadError(message: "not a JSON object")
        }
        var keys: [String: PublicKey] = [:]
        if let entries = object["keys"]?.arrayValue {
            for entry in entries where entry["kty"]?.stringValue == "RSA" {
                guard let kid = entry["kid"]?.stringValue, let n = entry["n"]?.stringValue.flatMap(Base64.decode),
                    let e = entry["e"]?.stringValue.flatMap(Base64.decode)
                else { throw LoadError(message: "an RSA key lacks kid, n or e") }
                do {
                    keys[kid] = try PublicKey(rsaModulus: n, exponent: e)
                } catch {
                    throw LoadError(message: "key \(kid): \(error)")
                }
            }
        } else {
            for (kid, value) in object {
                guard let pem = value.stringValue else { throw LoadError(message: "entry \(kid) is not a PEM string") }
                do {
                    guard let certificate = try Certificate.pem(Array(pem.utf8)).first else { continue }
                    keys[kid] = try certificate.publicKey()
                } catch {
                    throw LoadError(message: "entry \(kid): \(error)")
                }
            }
        }
        return keys
    }

    static func maxAge(_ cacheControl: String?) -> Duration? {
        guard let cacheControl else { return nil }
        for directive in cacheControl.split(separator: ",") {
            let parts = directive.trimmingCharacters(in: .whitespaces).split(separator: "=", maxSplits: 1)
            if parts.count == 2, parts[0].lowercased() == "max-age", let seconds = Int64(parts[1]), seconds > 0 {
                return .seconds(seconds)
            }
        }
        return nil
    }
}
