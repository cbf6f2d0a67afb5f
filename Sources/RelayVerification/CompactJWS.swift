import RelayCore

/// A compact JWS or JWT (`header.payload.signature`, base64url), split and decoded but not verified.
struct CompactJWS {
    var header: JSON
    var payload: JSON
    /// The bytes the signature covers: the ASCII `header.payload`.
    var signingInput: [UInt8]
    var signature: [UInt8]

    /// - Parameter what: names the token in rejection details ("signedPayload", "push token").
    init(_ text: String, what: String) throws(Rejection) {
        let utf8 = Array(text.utf8)
        var dots: [Int] = []
        for (index, byte) in utf8.enumerated() where byte == UInt8(ascii: ".") {
            dots.append(index)
            if dots.count > 2 { break }
        }
        guard dots.count == 2 else { throw Rejection(.malformed, "\(what) is not a compact JWS (three base64url parts)") }
        let headerPart = utf8[..<dots[0]]
        let payloadPart = utf8[(dots[0] + 1)..<dots[1]]
        let signaturePart = utf8[(dots[1] + 1)...]
        guard let headerBytes = Self.base64url(headerPart), let header = try? JSON.parse(headerBytes), case .object = header else {
            throw Rejection(.malformed, "\(what) header is not base64url JSON")
        }
        guard let payloadBytes = Self.base64url(payloadPart), let payload = try? JSON.parse(payloadBytes), case .object = payload else {
            throw Rejection(.malformed, "\(what) payload is not base64url JSON")
        }
        guard let signature = Self.base64url(signaturePart) else {
            throw Rejection(.malformed, "\(what) signature is not base64url")
        }
        self.header = header
        self.payload = payload
        self.signingInput = Array(utf8[..<dots[1]])
        self.signature = signature
    }

    /// Strict base64url (RFC 7515: URL alphabet, no padding).
    private static func base64url(_ part: ArraySlice<UInt8>) -> [UInt8]? {
        for byte in part {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "-"), UInt8(ascii: "_"):
                continue
            default:
                return nil
            }
        }
        let text = String(decoding: part, as: UTF8.self)
        // Only the canonical encoding: unused trailing bits set would let two texts carry one value.
        guard let bytes = Base64.decode(text), Base64.encodeURL(bytes) == text else { return nil }
        return bytes
    }
}
