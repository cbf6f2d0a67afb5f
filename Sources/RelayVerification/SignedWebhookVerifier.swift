import RelayCrypto
public import RelayCore

/// Verifies Stripe (`Stripe-Signature: t=…,v1=…`) and Paddle Billing (`Paddle-Signature: ts=…;h1=…`)
/// webhooks, for one app: HMAC-SHA256 of the timestamp and the exact body with each configured secret,
/// compared in constant time with every signature of the header (several appear while a secret is
/// rolled), then the timestamp within the tolerance around the receive time, in both directions.
public struct SignedWebhookVerifier: Sendable {
    public enum Scheme: Sendable {
        /// Key: the whole `whsec_…` string. Signed: `t` + "." + body. Header: `,`-separated `t`, `v1`.
        case stripe
        /// Key: the whole secret key. Signed: `ts` + ":" + body. Header: `;`-separated `ts`, `h1`.
        case paddle
    }

    private let app: String
    private let scheme: Scheme
    /// One prepared HMAC key per secret (nil where OpenSSL could not set one up: it matches nothing), made once:
    /// a one-shot `HMAC()` looks the MAC and the digest up by name in OpenSSL 3.0 for every notification.
    private let keys: [HMACSHA256Key?]
    private let toleranceSeconds: Int64

    public init(app: String, scheme: Scheme, secrets: [String], tolerance: Duration) {
        self.app = app
        self.scheme = scheme
        self.keys = secrets.map { HMACSHA256Key(Array($0.utf8)) }
        self.toleranceSeconds = tolerance.components.seconds
    }

    private var store: Store { scheme == .stripe ? .stripe : .paddle }
    private var headerName: String { scheme == .stripe ? "stripe-signature" : "paddle-signature" }

    public func verify(body: [UInt8], signatureHeader: String?, receivedAtSeconds: Int64) throws(Rejection) -> VerifiedNotification {
        let (timestamp, timestampText, signatures) = try parseHeader(signatureHeader)
        // The signed text is the timestamp, the separator and the body: MACed as two parts, the body not copied.
        var prefix = Array(timestampText.utf8)
        prefix.append(scheme == .stripe ? UInt8(ascii: ".") : UInt8(ascii: ":"))
        var matched = false
        for key in keys {
            guard let mac = key?.code(prefix: prefix, message: body) else { continue }
            let expected = Array(Digest.hex(mac).utf8)
            // Every candidate is compared, so timing tells nothing about which one matched.
            for signature in signatures where Digest.constantTimeEquals(Array(signature.utf8), expected) { matched = true }
        }
        guard matched else {
            throw Rejection(.badSignature, "no \(headerName) signature matches the body with any of the app's \(keys.count) secret(s)")
        }
        // The timestamp is whatever the sender wrote: no arithmetic on it may trap.
        let (age, overflow) = receivedAtSeconds.subtractingReportingOverflow(timestamp)
        guard !overflow, age.magnitude <= UInt64(toleranceSeconds) else {
            throw Rejection(
                .staleTimestamp,
                "\(headerName) timestamp \(timestamp) is \(overflow ? "far" : "\(age.magnitude) s") \(timestamp < receivedAtSeconds ? "before" : "after") the receive time \(receivedAtSeconds); tolerance \(toleranceSeconds) s")
        }
        guard let event = try? JSON.parse(body), case .object = event else { throw Rejection(.malformed, "body is not a JSON object") }
        switch scheme {
        case .stripe:
            let environment = event["livemode"]?.boolValue.map { $0 ? "PRODUCTION" : "SANDBOX" }
            return VerifiedNotification(
                store: .stripe, app: app, payload: event, notificationId: event["id"]?.stringValue, type: event["type"]?.stringValue,
                environment: environment)
        case .paddle:
            return VerifiedNotification(
                store: .paddle, app: app, payload: event,
                notificationId: event["event_id"]?.stringValue ?? event["notification_id"]?.stringValue,
                type: event["event_type"]?.stringValue)
        }
    }

    /// The timestamp (as a number and as sent: the signed text is the header's own digits) and the
    /// signatures of the scheme this relay checks (`v1`, `h1`).
    private func parseHeader(_ header: String?) throws(Rejection) -> (Int64, Substring, [Substring]) {
        guard let header, !header.isEmpty else {
            throw Rejection(.missingSignature, "no \(headerName) header")
        }
        let (separator, timestampKey, signatureKey): (Character, String, String) = scheme == .stripe ? (",", "t", "v1") : (";", "ts", "h1")
        var timestampText: Substring?
        var signatures: [Substring] = []
        for item in header.split(separator: separator) {
            let pair = item.split(separator: "=", maxSplits: 1)
            guard pair.count == 2 else { continue }
            let key = pair[0].trimmingPrefix(while: \.isWhitespace)
            if key == timestampKey { timestampText = pair[1] }
            if key == signatureKey { signatures.append(pair[1]) }
        }
        guard let timestampText, !timestampText.isEmpty, timestampText.allSatisfy(\.isASCII), let timestamp = Int64(timestampText) else {
            throw Rejection(.malformed, "\(headerName) has no \(timestampKey)=<unix seconds>")
        }
        guard !signatures.isEmpty else {
            throw Rejection(.missingSignature, "\(headerName) has no \(signatureKey) signature")
        }
        return (timestamp, timestampText, signatures)
    }
}
