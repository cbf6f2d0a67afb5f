/// RFC 3986 percent-encoding over UTF-8 bytes, for ids that go into URLs (backend paths, Play API
/// paths and forms).
public enum PercentEncoding {
    /// Encodes every byte but the unreserved ASCII characters (`A–Z a–z 0–9 - . _ ~`), so the result is
    /// safe as one URL path segment or one `application/x-www-form-urlencoded` value: a purchase token's
    /// `/`, `+` and `=` can never change the path or the form.
    public static func encode(_ text: String) -> String {
        var output: [UInt8] = []
        output.reserveCapacity(text.utf8.count)
        for byte in text.utf8 {
            if isUnreserved(byte) {
                output.append(byte)
            } else {
                output.append(UInt8(ascii: "%"))
                output.append(hexDigits[Int(byte >> 4)])
                output.append(hexDigits[Int(byte & 0x0F)])
            }
        }
        return String(decoding: output, as: UTF8.self)
    }

    /// One URL path segment: `encode`, and `.` and `..` (which would move up the path) spelled `%2E`.
    public static func pathSegment(_ text: String) -> String {
        text == "." || text == ".." ? String(repeating: "%2E", count: text.count) : encode(text)
    }

    private static func isUnreserved(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
            UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
            true
        default:
            false
        }
    }

    private static let hexDigits = Array("0123456789ABCDEF".utf8)
}
