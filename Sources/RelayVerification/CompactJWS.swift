import RelayCore

/// A compact JWS or JWT (`header.payload.signature`, base64url), split and decoded but not verified.
struct CompactJWS {
    /// The token's text, whose header and signing input are copied out only when asked for: a nested JWS
    /// whose notification's signature covers it is read for its payload alone.
    private let utf8: [UInt8]
    private let dots: (first: Int, second: Int)
    var payload: JSON
    var signature: [UInt8]

    /// The header as sent (base64url), decoded on demand: Apple's verifier keys its chain cache by it,
    /// so a header it has seen is never decoded again.
    var headerSegment: [UInt8] { Array(utf8[..<dots.first]) }
    /// The bytes the signature covers: the ASCII `header.payload`.
    var signingInput: [UInt8] { Array(utf8[..<dots.second]) }

    /// `headerSegment` lent in place, not copied (about 5 KB for an Apple JWS, looked up for each one).
    func withHeaderSegment<Result>(_ body: (UnsafeRawBufferPointer) -> Result) -> Result {
        utf8.withUnsafeBytes { body(UnsafeRawBufferPointer(rebasing: $0[..<dots.first])) }
    }

    /// `signingInput` lent in place, not copied (12.7 KB for an Apple notification, hashed once).
    func withSigningInput<Result>(_ body: (UnsafeRawBufferPointer) -> Result) -> Result {
        utf8.withUnsafeBytes { body(UnsafeRawBufferPointer(rebasing: $0[..<dots.second])) }
    }

    /// - Parameter what: names the token in rejection details ("signedPayload", "push token").
    init(_ text: String, what: String) throws(Rejection) {
        let utf8 = Array(text.utf8)
        guard let dots = JWSPayload.dots(in: utf8) else { throw Rejection(.malformed, "\(what) is not a compact JWS (three base64url parts)") }
        let payloadPart = utf8[(dots.first + 1)..<dots.second]
        let signaturePart = utf8[(dots.second + 1)...]
        guard let payloadBytes = Self.base64url(payloadPart), let payload = try? JSON.parse(payloadBytes), case .object = payload else {
            throw Rejection(.malformed, "\(what) payload is not base64url JSON")
        }
        guard let signature = Self.base64url(signaturePart) else {
            throw Rejection(.malformed, "\(what) signature is not base64url")
        }
        self.utf8 = utf8
        self.dots = (dots.first, dots.second)
        self.what = what
        self.payload = payload
        self.signature = signature
    }

    private var what: String

    /// The decoded header (a JSON object).
    func header() throws(Rejection) -> JSON {
        guard let bytes = Self.base64url(utf8[..<dots.first]), let header = try? JSON.parse(bytes), case .object = header else {
            throw Rejection(.malformed, "\(what) header is not base64url JSON")
        }
        return header
    }

    /// Strict base64url (RFC 7515: URL alphabet, no padding), canonical only: unused trailing bits set
    /// would let two texts carry one value.
    private static func base64url(_ part: ArraySlice<UInt8>) -> [UInt8]? {
        Base64.decode(part, alphabet: .url, padding: .forbidden, canonical: true)
    }
}
