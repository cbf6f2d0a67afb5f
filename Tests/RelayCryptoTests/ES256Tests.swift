import COpenSSL
import Foundation
@testable import RelayCrypto
import Testing

/// ES256 verification: the raw JWS signature turned into DER by hand, the digest verified on its own context.
@Suite struct ES256Tests {
    /// What OpenSSL's own encoder writes for `raw` (`i2d_ECDSA_SIG`), the relay's encoding before it wrote DER itself.
    private func openSSLDER(_ raw: [UInt8]) throws -> [UInt8] {
        let signature = try #require(ECDSA_SIG_new())
        defer { ECDSA_SIG_free(signature) }
        let r = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress, 32, nil) }
        let s = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress! + 32, 32, nil) }
        #expect(ECDSA_SIG_set0(signature, r, s) == 1)
        var der = [UInt8](repeating: 0, count: Int(i2d_ECDSA_SIG(signature, nil)))
        der.withUnsafeMutableBufferPointer { buffer in
            var cursor = buffer.baseAddress
            _ = i2d_ECDSA_SIG(signature, &cursor)
        }
        return der
    }

    @Test func theDEREncodingIsOpenSSLsForEveryShapeOfRAndS() throws {
        var state: UInt64 = 0x2545_F491_4F6C_DD1D
        func byte() -> UInt8 {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return UInt8(truncatingIfNeeded: state >> 56)
        }
        var signatures: [[UInt8]] = [
            [UInt8](repeating: 0, count: 64), [UInt8](repeating: 0xFF, count: 64), [UInt8](repeating: 0x80, count: 64),
            [UInt8](repeating: 0x7F, count: 64), [UInt8](repeating: 0, count: 63) + [1],
        ]
        for _ in 0..<500 {
            var raw = (0..<64).map { _ in byte() }
            // Leading zero bytes (shorter integers), a high bit (a 0 before it), or neither, in r and in s.
            for half in [0, 32] {
                switch byte() % 4 {
                case 0: for index in half..<(half + Int(byte() % 33)) { raw[index] = 0 }
                case 1: raw[half] |= 0x80
                case 2: raw[half] &= 0x7F
                default: break
                }
            }
            signatures.append(raw)
        }
        for raw in signatures {
            #expect(PublicKey.derSignature(raw: raw) == (try openSSLDER(raw)), "\(raw)")
        }
    }

    @Test func aSignatureVerifiesAndAnyChangeToItOrTheDataDoesNot() throws {
        let pem = try String(
            contentsOf: URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .appendingPathComponent("Fixtures/apple/leaf.key"), encoding: .utf8)
        let key = try PrivateKey(pem: pem)
        let other = try PrivateKey(
            pem: String(
                contentsOf: URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                    .appendingPathComponent("Fixtures/apple/rogue-leaf.key"), encoding: .utf8))
        for length in [0, 1, 55, 56, 64, 4_000, 13_000] {
            let data = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 31) }
            let signature = try key.signES256(data)
            #expect(key.publicKey.verifyES256(data, rawSignature: signature))
            #expect(!other.publicKey.verifyES256(data, rawSignature: signature))
            if length > 0 {
                var changed = data
                changed[length / 2] ^= 1
                #expect(!key.publicKey.verifyES256(changed, rawSignature: signature))
            }
            for index in [0, 31, 32, 63] {
                var forged = signature
                forged[index] ^= 0x40
                #expect(!key.publicKey.verifyES256(data, rawSignature: forged))
            }
            #expect(!key.publicKey.verifyES256(data, rawSignature: Array(signature.prefix(63))))
            #expect(!key.publicKey.verifyES256(data, rawSignature: [UInt8](repeating: 0, count: 64)))
        }
    }
}
