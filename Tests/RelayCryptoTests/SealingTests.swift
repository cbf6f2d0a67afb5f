import RelayCrypto
import Testing

/// AES-256-GCM sealing (checkout contexts): what is sealed opens only unchanged, under its key and its
/// associated data; each seal uses a fresh nonce.
@Suite struct SealingTests {
    let key = (0..<32).map { UInt8($0) }

    @Test func aSealedValueOpensOnlyUnchangedUnderItsKeyAndAssociatedData() throws {
        let plain = Array(#"{"code":"redemption_abc"}"#.utf8)
        let sealed = try AESGCM.seal(plain, key: key, associatedData: Array("v1:k1:".utf8))
        #expect(sealed.count == 12 + plain.count + 16)
        #expect(AESGCM.open(sealed, key: key, associatedData: Array("v1:k1:".utf8)) == plain)
        // Another nonce each time: the same value seals differently.
        #expect(try AESGCM.seal(plain, key: key, associatedData: Array("v1:k1:".utf8)) != sealed)
        for index in [0, 12, sealed.count / 2, sealed.count - 1] {
            var changed = sealed
            changed[index] ^= 0x01
            #expect(AESGCM.open(changed, key: key, associatedData: Array("v1:k1:".utf8)) == nil, "byte \(index)")
        }
        #expect(AESGCM.open(sealed, key: key, associatedData: Array("v1:k2:".utf8)) == nil)
        #expect(AESGCM.open(sealed, key: key.map { $0 ^ 0xFF }, associatedData: Array("v1:k1:".utf8)) == nil)
        #expect(AESGCM.open(Array(sealed.prefix(20)), key: key) == nil)
        #expect(throws: OpenSSLError.self) { try AESGCM.seal(plain, key: [1, 2, 3]) }
        #expect(try SecureRandom.bytes(20).count == 20)
        #expect(try SecureRandom.bytes(16) != SecureRandom.bytes(16))
    }
}
