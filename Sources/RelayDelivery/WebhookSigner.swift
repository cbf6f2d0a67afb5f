import RelayCore
import RelayCrypto

/// Signs webhook deliveries as Standard Webhooks does (docs/contracts.md, the standardized event): `webhook-id`,
/// `webhook-timestamp` (Unix seconds) and `webhook-signature` (`v1,<base64 HMAC-SHA256 of
/// "id.timestamp.body">`, one per secret, space-separated during rotation), keyed with the
/// base64-decoded secret after `whsec_`. The same values go out as `svix-id`, `svix-timestamp` and
/// `svix-signature`, so receivers written for Superwall's (Svix) webhooks verify unchanged.
public struct WebhookSigner: Sendable {
    /// Why an endpoint secret cannot sign. The message names the secret's position, never its value.
    public struct SecretError: Error, Sendable, CustomStringConvertible {
        public var index: Int
        public var description: String { "endpoint secret \(index + 1) is not whsec_ followed by base64" }
    }

    private let keys: [HMACSHA256Key]

    /// - Parameter secrets: the endpoint's secrets (`whsec_…`), newest first or last: every one signs.
    public init(secrets: [String]) throws(SecretError) {
        var keys: [HMACSHA256Key] = []
        for (index, secret) in secrets.enumerated() {
            guard let bytes = WebhookSecret.key(secret), let key = HMACSHA256Key(bytes) else { throw SecretError(index: index) }
            keys.append(key)
        }
        self.keys = keys
    }

    /// `v1,<signature>` per secret, space-separated.
    public func signature(id: String, timestamp: Int64, body: [UInt8]) -> String {
        let prefix = Array("\(id).\(timestamp).".utf8)
        return keys.compactMap { key in key.code(prefix: prefix, message: body).map { "v1," + Base64.encode($0) } }
            .joined(separator: " ")
    }

    /// Every signing header of one attempt, Standard Webhooks' and their `svix-*` aliases.
    public func headers(id: String, timestamp: Int64, body: [UInt8]) -> [(name: String, value: String)] {
        let signature = signature(id: id, timestamp: timestamp, body: body)
        return [
            ("webhook-id", id), ("webhook-timestamp", String(timestamp)), ("webhook-signature", signature),
            ("svix-id", id), ("svix-timestamp", String(timestamp)), ("svix-signature", signature),
        ]
    }
}
