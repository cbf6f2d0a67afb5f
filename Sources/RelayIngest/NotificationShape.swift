public import RelayCore

/// The ingest's structural checks: whether a request looks like what its store sends, before it is
/// written to the log. They need no secret and verify nothing (the worker does, and a notification that
/// fails verification goes to the rejected topic, to be replayed once the configuration is fixed). A
/// request no store would send is refused with 400 and never written, so junk cannot fill the log.
///
/// - Apple: `signedPayload` is a compact JWS of three base64url parts whose header names ES256 and an x5c chain.
/// - Google: an `Authorization: Bearer` token of three parts, and a Pub/Sub `message.data`.
/// - Stripe: a `Stripe-Signature` with `t=` (a time) and `v1=`.
/// - Paddle: a `Paddle-Signature` with `ts=` (a time) and `h1=`.
public enum NotificationShape {
    /// Why a request is not shaped like its store's notifications: `detail` is safe to answer and log
    /// (it names fields, never their values).
    public struct Mismatch: Sendable, Equatable, Error {
        public var detail: String
        init(_ detail: String) { self.detail = detail }
    }

    /// Nil when the request has its store's shape.
    /// - Parameter header: the request's header field by lowercase name.
    public static func mismatch(store: Store, document: JSON, header: (String) -> String?) -> Mismatch? {
        switch store {
        case .apple: return apple(document)
        case .google: return google(document, authorization: header("authorization"))
        case .stripe: return signatureHeader(header("stripe-signature"), name: "Stripe-Signature", separator: ",", time: "t", signature: "v1")
        case .paddle: return signatureHeader(header("paddle-signature"), name: "Paddle-Signature", separator: ";", time: "ts", signature: "h1")
        case .promotional: return Mismatch("grants are made through the backend, never received")
        }
    }

    private static func apple(_ document: JSON) -> Mismatch? {
        guard let jws = document["signedPayload"]?.stringValue else { return Mismatch("the body has no signedPayload string") }
        guard let headerPart = compactHeader(jws) else { return Mismatch("signedPayload is not a compact JWS (three base64url parts)") }
        guard let headerBytes = Base64.decode(headerPart, alphabet: .url, padding: .forbidden, canonical: false),
            let header = try? JSON.parse(headerBytes), header.objectValue != nil
        else { return Mismatch("the JWS header of signedPayload is not base64url JSON") }
        guard header["alg"]?.stringValue == "ES256" else { return Mismatch("the JWS header of signedPayload does not name alg ES256") }
        guard let chain = header["x5c"]?.arrayValue, !chain.isEmpty, chain.allSatisfy({ $0.stringValue?.isEmpty == false }) else {
            return Mismatch("the JWS header of signedPayload has no x5c certificate chain")
        }
        return nil
    }

    private static func google(_ document: JSON, authorization: String?) -> Mismatch? {
        guard let authorization else { return Mismatch("no Authorization header (Pub/Sub push sends a Bearer token)") }
        let fields = authorization.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard fields.count == 2, fields[0].lowercased() == "bearer", compactHeader(String(fields[1])) != nil else {
            return Mismatch("the Authorization header is not a Bearer token of three base64url parts")
        }
        guard let data = document["message"]?["data"]?.stringValue, !data.isEmpty else {
            return Mismatch("the body has no Pub/Sub message.data")
        }
        return nil
    }

    /// `Stripe-Signature: t=…,v1=…` or `Paddle-Signature: ts=…;h1=…`: a decimal time and a non-empty signature.
    private static func signatureHeader(_ value: String?, name: String, separator: Character, time: String, signature: String) -> Mismatch? {
        guard let value else { return Mismatch("no \(name) header") }
        var hasTime = false
        var hasSignature = false
        for field in value.split(separator: separator) {
            let pair = field.split(separator: "=", maxSplits: 1)
            guard pair.count == 2 else { continue }
            let key = pair[0].trimmingCharacters(in: .whitespaces)
            let text = pair[1].trimmingCharacters(in: .whitespaces)
            if key == time, !text.isEmpty, text.utf8.count <= 20, text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) {
                hasTime = true
            }
            if key == signature, !text.isEmpty { hasSignature = true }
        }
        guard hasTime, hasSignature else { return Mismatch("the \(name) header has no \(time)= time and \(signature)= signature") }
        return nil
    }

    /// The first part's bytes when `text` is a compact JWS/JWT (three non-empty base64url parts), else nil.
    /// An Apple notification is 12.7 KB and every one is checked, so the bytes are checked eight at a time
    /// (`base64URLOrDots`) and the dots found with memchr. Splitting it as a generic `Substring.UTF8View` was
    /// 5% of the relay's CPU, a byte loop with comparisons 2.7–4.5%, a table lookup per byte 2% (`perf`,
    /// the e2e bench).
    static func compactHeader(_ text: String) -> [UInt8]? {
        var text = text
        return text.withUTF8 { bytes -> [UInt8]? in
            guard base64URLOrDots(bytes), let (first, second) = JWSPayload.dots(in: bytes), first > 0, second > first + 1, second < bytes.count - 1
            else { return nil }
            return Array(bytes[0..<first])
        }
    }

    /// Whether every byte is a base64url character (`A-Z a-z 0-9 - _`) or a dot.
    static func base64URLOrDots(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        guard let base = bytes.baseAddress else { return true }
        var index = 0
        var valid = true
        while valid, bytes.count - index >= 8 {
            valid = base64URLOrDots(word: UnsafeRawPointer(base + index).loadUnaligned(as: UInt64.self))
            index += 8
        }
        while valid, index < bytes.count {
            var word = UInt64(UInt8(ascii: "A")) &* lowBits
            withUnsafeMutableBytes(of: &word) { $0[0] = bytes[index] }
            valid = base64URLOrDots(word: word)
            index += 1
        }
        return valid
    }

    private static let lowBits: UInt64 = 0x0101_0101_0101_0101
    private static let highBits: UInt64 = 0x8080_8080_8080_8080

    /// Whether all eight bytes of `word` are base64url characters or dots: per byte, below 0x80 and in one of
    /// the ranges `-.` `0-9` `A-Z` `_` `a-z`. For a byte x below 0x80, x + (0x80 - lo) has its top bit set
    /// exactly when x ≥ lo, and x + (0x7F - hi) exactly when x > hi; neither sum carries into the next byte.
    @inline(__always) private static func base64URLOrDots(word: UInt64) -> Bool {
        guard word & highBits == 0 else { return false }
        @inline(__always) func within(_ low: UInt8, _ high: UInt8) -> UInt64 {
            (word &+ lowBits &* UInt64(0x80 - low)) & ~(word &+ lowBits &* UInt64(0x7F - high))
        }
        let inSet =
            within(UInt8(ascii: "-"), UInt8(ascii: ".")) | within(UInt8(ascii: "0"), UInt8(ascii: "9"))
            | within(UInt8(ascii: "A"), UInt8(ascii: "Z")) | within(UInt8(ascii: "_"), UInt8(ascii: "_"))
            | within(UInt8(ascii: "a"), UInt8(ascii: "z"))
        return inSet & highBits == highBits
    }
}
