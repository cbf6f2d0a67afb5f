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

    /// The contexts a key keeps ready are lent to one verification at a time: many at once on one key each get
    /// their own answer, and a context used by a failed verification is not kept.
    @Test func oneKeyVerifiesOnManyThreadsAtOnceWithTheContextsItKeeps() async throws {
        let pem = try String(
            contentsOf: URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .appendingPathComponent("Fixtures/apple/leaf.key"), encoding: .utf8)
        let signer = try PrivateKey(pem: pem)
        let key = signer.publicKey
        let signed = try (0..<8).map { index -> ([UInt8], [UInt8]) in
            let data = Array("notification \(index)".utf8)
            return (data, try signer.signES256(data))
        }
        #expect(await wrongAnswersOnManyThreads(key, signed) == 0)
        #expect((1...PublicKey.keptContexts).contains(key.keptContextCount))
        let kept = key.keptContextCount
        #expect(!key.verifyES256(signed[0].0, rawSignature: signed[1].1))
        #expect(key.keptContextCount == kept - 1)
        #expect(key.verifyES256(signed[0].0, rawSignature: signed[0].1))
    }

    @Test func sha256IsTheStandards() {
        // FIPS 180-2's examples.
        #expect(Digest.hex(Digest.sha256(Array("abc".utf8))) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(Digest.hex(Digest.sha256([])) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(
            Digest.hex(Digest.sha256(Array("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".utf8)))
                == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
    }
}

/// How many of 640 verifications on 32 tasks at once with one `key` answered wrong: each task checks the
/// `signed` data in turn, every fifth time against another notification's signature, which must fail.
func wrongAnswersOnManyThreads(_ key: PublicKey, _ signed: [([UInt8], [UInt8])]) async -> Int {
    await withTaskGroup(of: Int.self) { group in
        for task in 0..<32 {
            group.addTask {
                var wrong = 0
                for round in 0..<20 {
                    let (data, signature) = signed[(task + round) % signed.count]
                    let forged = round % 5 == 3
                    let other = signed[(task + round + 1) % signed.count].1
                    if key.verifyES256(data, rawSignature: forged ? other : signature) == forged { wrong += 1 }
                }
                return wrong
            }
        }
        return await group.reduce(0, +)
    }
}
