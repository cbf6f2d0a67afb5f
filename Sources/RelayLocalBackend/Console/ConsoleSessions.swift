import Foundation
import RelayConfig
import RelayCrypto

/// The console's sign-in: a secret or read key, exchanged once for a session cookie, so the key itself is
/// never kept in the browser.
///
/// The cookie is `v1.<kind>.<key fingerprint>.<expiry>.<nonce>.<mac>`: which kind of key signed in
/// (`s` secret, `r` read), 64 bits of an HMAC of the key (to find the read key's apps again, and
/// so that removing a key from the configuration ends its sessions), when it expires (Unix seconds), 128
/// random bits, and an HMAC-SHA256 of the rest under a key derived from the backend's secret keys: every
/// backend replica with the same configuration accepts it, and rotating the secret key ends every session.
/// Actions also need the session's CSRF token (an HMAC of the cookie) in the form they post.
struct ConsoleSessions: Sendable {
    static let cookieName = "relay_console"
    /// How long a session lasts.
    static let lifetimeSeconds: Int64 = 12 * 3600

    struct Session: Sendable {
        var principal: BackendPrincipal
        var csrf: String
        var expiresAt: Int64
    }

    private let signingKey: [UInt8]
    private let keys: [(kind: String, fingerprint: String, principal: BackendPrincipal)]

    init(_ configuration: RelayConfiguration) {
        signingKey = Digest.sha256(Array(("revenue-relay console session v1\u{0}" + configuration.backend.secretKeys.sorted().joined(separator: "\u{0}")).utf8))
        let applicationIds = Dictionary(configuration.apps.map { ($0.key, $0.applicationId) }, uniquingKeysWith: { first, _ in first })
        var keys: [(kind: String, fingerprint: String, principal: BackendPrincipal)] = []
        let signingKey = self.signingKey
        func fingerprint(_ key: String) -> String { Self.fingerprint(key, signingKey: signingKey) }
        for key in configuration.backend.secretKeys { keys.append(("s", fingerprint(key), .secret)) }
        for readKey in configuration.backend.readKeys {
            keys.append(
                ("r", fingerprint(readKey.key), .read(apps: Set(readKey.apps), applicationIds: Set(readKey.apps.compactMap { applicationIds[$0] }))))
        }
        self.keys = keys
    }

    /// 64 bits of an HMAC of the key under the signing key: it names the key without letting a copied cookie
    /// test guesses of it offline.
    static func fingerprint(_ key: String, signingKey: [UInt8]) -> String {
        String(Digest.hex(Digest.hmacSHA256(key: signingKey, message: Array(("key\u{0}" + key).utf8)) ?? []).prefix(16))
    }

    /// A new session's cookie value for `principal` (a secret or read key's, as `BackendKeys` resolved it).
    func issue(key: String, principal: BackendPrincipal, now: Int64) -> String? {
        let kind: String
        switch principal {
        case .secret: kind = "s"
        case .read: kind = "r"
        case .publicApp: return nil
        }
        guard let nonce = try? SecureRandom.bytes(16) else { return nil }
        let body = "v1.\(kind).\(Self.fingerprint(key, signingKey: signingKey)).\(now / 1000 + Self.lifetimeSeconds).\(Digest.hex(nonce))"
        guard let mac = Digest.hmacSHA256(key: signingKey, message: Array(body.utf8)) else { return nil }
        return body + "." + Digest.hex(mac)
    }

    /// The session a cookie value stands for, or nil: forged, expired, or its key no longer configured.
    func session(cookie: String, now: Int64) -> Session? {
        let parts = cookie.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 6, parts[0] == "v1", let expiresAt = Int64(parts[3]), parts[5].utf8.count == 64 else { return nil }
        let body = parts[0...4].joined(separator: ".")
        guard let mac = Digest.hmacSHA256(key: signingKey, message: Array(body.utf8)),
            Digest.constantTimeEquals(Array(Digest.hex(mac).utf8), Array(parts[5].utf8))
        else { return nil }
        guard expiresAt > now / 1000 else { return nil }
        guard let entry = keys.first(where: { $0.kind == parts[1] && $0.fingerprint == parts[2] }) else { return nil }
        return Session(principal: entry.principal, csrf: csrf(cookie), expiresAt: expiresAt)
    }

    /// The CSRF token of a session: what its forms carry.
    func csrf(_ cookie: String) -> String {
        let mac = Digest.hmacSHA256(key: signingKey, message: Array(("csrf\u{0}" + cookie).utf8)) ?? []
        return String(Digest.hex(mac).prefix(32))
    }

    /// The signature of an action's notice for the session with this CSRF token (the page shows only those).
    func noticeSignature(_ notice: String, csrf: String) -> String {
        let mac = Digest.hmacSHA256(key: signingKey, message: Array(("notice\u{0}" + csrf + "\u{0}" + notice).utf8)) ?? []
        return String(Digest.hex(mac).prefix(32))
    }

    /// Whether a posted token is the session's (constant time).
    static func matches(_ given: String?, _ expected: String) -> Bool {
        guard let given else { return false }
        return Digest.constantTimeEquals(Array(given.utf8), Array(expected.utf8))
    }
}
