import Foundation
import RelayCore
import RelayTestSupport
import Testing

/// Base64 and base64url decoding against Foundation's decoder, at every length and with a bad character
/// at every position (the decoder reads four characters at a time and writes whole words).
@Suite struct Base64Tests {
    static func urlText(_ bytes: [UInt8]) -> String {
        Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    @Test func decodesWhatFoundationEncodesAtEveryLength() {
        var generator = SeededGenerator(seed: 37)
        for length in 0...260 {
            for _ in 0..<4 {
                let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
                let standard = Data(bytes).base64EncodedString()
                let url = Self.urlText(bytes)
                #expect(Base64.decode(Array(standard.utf8), alphabet: .standard, padding: .required, canonical: true) == bytes, "\(length)")
                #expect(Base64.decode(Array(url.utf8), alphabet: .url, padding: .forbidden, canonical: true) == bytes, "\(length)")
                #expect(Base64.decode(Array(url.utf8), alphabet: .either, padding: .optional, canonical: false) == bytes, "\(length)")
                #expect(Base64.decode(standard) == bytes, "\(length)")
                // The other alphabet's characters are refused (each text of 48 bytes or more has some).
                if length >= 48, standard.contains(where: { $0 == "+" || $0 == "/" }) {
                    #expect(Base64.decode(Array(standard.utf8), alphabet: .url, padding: .optional, canonical: false) == nil)
                }
                if length >= 48, url.contains(where: { $0 == "-" || $0 == "_" }) {
                    #expect(Base64.decode(Array(url.utf8), alphabet: .standard, padding: .optional, canonical: false) == nil)
                }
            }
        }
    }

    @Test func aCharacterOutsideTheAlphabetAnywhereIsRefused() {
        // 88, 89 and 90 bytes: texts of two, three and no characters after the last whole four.
        for count in [88, 89, 90] {
            let text = Array(Self.urlText(Array(0..<UInt8(count))).utf8)
            for position in text.indices {
                // "=" in the last two places is padding, which `.optional` accepts.
                for bad in [UInt8(ascii: "="), UInt8(ascii: "."), UInt8(ascii: " "), 0x00, 0x80, 0xFF, UInt8(ascii: "+")]
                where bad != UInt8(ascii: "=") || position < text.count - 2 {
                    var broken = text
                    broken[position] = bad
                    #expect(Base64.decode(broken, alphabet: .url, padding: .optional, canonical: false) == nil, "\(bad) at \(position) of \(count)")
                }
            }
        }
    }

    @Test func canonicalRefusesSetUnusedBits() {
        // "QQ" is "A" (0x41); "QR" has bits set after the byte, "QUE" is "AA"... "QUF" has them set after two bytes.
        #expect(Base64.decode(Array("QQ".utf8), alphabet: .url, padding: .forbidden, canonical: true) == [0x41])
        #expect(Base64.decode(Array("QR".utf8), alphabet: .url, padding: .forbidden, canonical: true) == nil)
        #expect(Base64.decode(Array("QR".utf8), alphabet: .url, padding: .forbidden, canonical: false) == [0x41])
        #expect(Base64.decode(Array("QUE".utf8), alphabet: .url, padding: .forbidden, canonical: true) == [0x41, 0x41])
        #expect(Base64.decode(Array("QUF".utf8), alphabet: .url, padding: .forbidden, canonical: true) == nil)
        #expect(Base64.decode(Array("Q".utf8), alphabet: .url, padding: .forbidden, canonical: false) == nil, "one character is no byte")
        #expect(Base64.decode(Array("QQ==".utf8), alphabet: .standard, padding: .forbidden, canonical: true) == nil)
        #expect(Base64.decode(Array("QQ".utf8), alphabet: .standard, padding: .required, canonical: true) == nil)
    }
}
