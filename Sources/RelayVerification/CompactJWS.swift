import RelayCore

/// A compact JWS or JWT (`header.payload.signature`, base64url), split and decoded but not verified.
struct CompactJWS {
    /// The header as sent (base64url), decoded on demand: Apple's verifier keys its chain cache by it,
    /// so a header it has seen is never decoded again.
    var headerSegment: [UInt8]
    var payload: JSON
    /// The bytes the signature covers: the ASCII `header.payload`.
    var signingInput: [UInt8]
    var signature: [UInt8]

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
        self.headerSegment = Array(utf8[..<dots.first])
        self.what = what
        self.payload = payload
        self.signingInput = Array(utf8[..<dots.second])
        self.signature = signature
    }

    private var what: String

    /// The decoded header (a JSON object).
    func header() throws(Rejection) -> JSON {
        guard let bytes = Self.base64url(headerSegment[...]), let header = try? JSON.parse(bytes), case .object = header else {
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
