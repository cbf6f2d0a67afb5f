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

    /// Per byte: 0 a base64url character, 2 a dot, 1 anything else.
    private static let byteClasses: [UInt8] = (0...255).map { value in
        let byte = UInt8(value)
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"),
            UInt8(ascii: "_"):
            return 0
        case UInt8(ascii: "."): return 2
        default: return 1
        }
    }

    /// The first part's bytes when `text` is a compact JWS/JWT (three non-empty base64url parts), else nil.
    /// An Apple notification is 12 KB and every one is checked, so the scan is one branch-free pass over
    /// the contiguous UTF-8 bytes (a table lookup per byte), then a search for the two dots. Splitting it as
    /// a generic `Substring.UTF8View` was 5% of the relay's CPU, and a byte loop with comparisons 2.7–4.5%
    /// (`perf`, the e2e bench).
    static func compactHeader(_ text: String) -> [UInt8]? {
        var text = text
        return text.withUTF8 { bytes -> [UInt8]? in
            var refused: UInt8 = 0
            var dots = 0
            Self.byteClasses.withUnsafeBufferPointer { classes in
                for byte in bytes {
                    let kind = classes[Int(byte)]
                    refused |= kind & 1
                    dots &+= Int(kind >> 1)
                }
            }
            guard refused == 0, dots == 2, let first = bytes.firstIndex(of: UInt8(ascii: ".")), first > 0,
                let second = bytes[(first + 1)...].firstIndex(of: UInt8(ascii: ".")), second > first + 1, second < bytes.count - 1
            else { return nil }
            return Array(bytes[0..<first])
        }
    }
}
