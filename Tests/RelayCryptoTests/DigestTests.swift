import RelayCrypto
import Testing

/// HMAC-SHA256 through OpenSSL, one-shot and with a key prepared once (the webhook signer's).
@Suite struct DigestTests {
    // RFC 4231, test cases 2 and 6 (a key longer than the block).
    static let cases: [(key: [UInt8], message: String, mac: String)] = [
        (Array("Jefe".utf8), "what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
        (
            [UInt8](repeating: 0xaa, count: 131), "Test Using Larger Than Block-Size Key - Hash Key First",
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        ),
    ]

    @Test func bothFormsReproduceTheRFC4231Vectors() throws {
        for vector in Self.cases {
            let message = Array(vector.message.utf8)
            #expect(Digest.hmacSHA256(key: vector.key, message: message).map(Digest.hex) == vector.mac)
            let key = try #require(HMACSHA256Key(vector.key))
            // Split anywhere between prefix and message, the code is the whole message's.
            for split in [0, 4, message.count] {
                #expect(key.code(prefix: Array(message[..<split]), message: Array(message[split...])).map(Digest.hex) == vector.mac)
            }
        }
    }

    @Test func onePreparedKeySignsOnManyThreadsAtOnce() async throws {
        let key = try #require(HMACSHA256Key(Self.cases[0].key))
        let codes = await withTaskGroup(of: String?.self) { group in
            for _ in 0..<64 {
                group.addTask { key.code(prefix: Array("what do ya want ".utf8), message: Array("for nothing?".utf8)).map(Digest.hex) }
            }
            return await group.reduce(into: [String?]()) { $0.append($1) }
        }
        #expect(codes == Array(repeating: Self.cases[0].mac, count: 64))
    }
}
