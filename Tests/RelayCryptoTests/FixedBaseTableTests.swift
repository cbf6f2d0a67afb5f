import COpenSSL
import Foundation
@testable import RelayCrypto
import Testing

/// A key's `FixedBaseTable`: the relay's own composition of OpenSSL's arithmetic must answer exactly as
/// OpenSSL's ECDSA verification does, for every signature, digest and key, genuine or not.
@Suite struct FixedBaseTableTests {
    /// A new key of `group` ("P-256", "P-384") from OpenSSL's generator.
    private func generatedKey(_ group: String = "P-256") throws -> PrivateKey {
        let context = try #require(EVP_PKEY_CTX_new_from_name(nil, "EC", nil))
        defer { EVP_PKEY_CTX_free(context) }
        try #require(EVP_PKEY_keygen_init(context) == 1 && EVP_PKEY_CTX_set_group_name(context, group) == 1)
        var key: OpaquePointer?
        try #require(EVP_PKEY_generate(context, &key) == 1)
        return PrivateKey(taking: try #require(key))
    }

    private func fixtureKey(_ name: String) throws -> PrivateKey {
        try PrivateKey(
            pem: String(
                contentsOf: URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                    .appendingPathComponent("Fixtures/apple/\(name)"), encoding: .utf8))
    }

    /// OpenSSL's signature of the 32-byte `digest` itself (not hashed again), as raw `r‖s`.
    private func sign(_ digest: [UInt8], with key: PrivateKey) throws -> [UInt8] {
        let context = try #require(EVP_PKEY_CTX_new_from_pkey(nil, key.pointer, nil))
        defer { EVP_PKEY_CTX_free(context) }
        #expect(EVP_PKEY_sign_init(context) == 1)
        var length = 0
        #expect(EVP_PKEY_sign(context, nil, &length, digest, digest.count) == 1)
        var der = [UInt8](repeating: 0, count: length)
        #expect(EVP_PKEY_sign(context, &der, &length, digest, digest.count) == 1)
        return try der.prefix(length).withUnsafeBufferPointer { buffer in
            var cursor = buffer.baseAddress
            let signature = try #require(d2i_ECDSA_SIG(nil, &cursor, buffer.count))
            defer { ECDSA_SIG_free(signature) }
            var raw = [UInt8](repeating: 0, count: 64)
            raw.withUnsafeMutableBufferPointer { out in
                _ = BN_bn2binpad(ECDSA_SIG_get0_r(signature), out.baseAddress, 32)
                _ = BN_bn2binpad(ECDSA_SIG_get0_s(signature), out.baseAddress! + 32, 32)
            }
            return raw
        }
    }

    /// OpenSSL's own answer for `raw` over `digest`: its verification of the DER form, nil for an error.
    private func openSSLVerifies(_ key: PublicKey, _ digest: [UInt8], _ raw: [UInt8]) throws -> Bool {
        let context = try #require(EVP_PKEY_CTX_new_from_pkey(nil, key.pointer, nil))
        defer { EVP_PKEY_CTX_free(context) }
        #expect(EVP_PKEY_verify_init(context) == 1)
        let der = PublicKey.derSignature(raw: raw)
        let result = EVP_PKEY_verify(context, der, der.count, digest, digest.count)
        ERR_clear_error()
        return result == 1
    }

    /// P-256's order n, big-endian.
    private static let order: [UInt8] = [
        0xFF, 0xFF, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x00, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
        0xBC, 0xE6, 0xFA, 0xAD, 0xA7, 0x17, 0x9E, 0x84, 0xF3, 0xB9, 0xCA, 0xC2, 0xFC, 0x63, 0x25, 0x51,
    ]

    /// `a` ± `b` on 32-byte big-endian numbers, modulo 2^256.
    private static func add(_ a: [UInt8], _ b: [UInt8], subtracting: Bool = false) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        var carry = 0
        for index in (0..<32).reversed() {
            let value = subtracting ? Int(a[index]) - Int(b[index]) + carry : Int(a[index]) + Int(b[index]) + carry
            out[index] = UInt8(truncatingIfNeeded: value)
            carry = subtracting ? (value < 0 ? -1 : 0) : (value > 255 ? 1 : 0)
        }
        return out
    }

    private static func number(_ value: UInt8) -> [UInt8] { [UInt8](repeating: 0, count: 31) + [value] }

    /// A signature to check under a key and its table, and OpenSSL's answer for it.
    private struct Candidate {
        var key: PublicKey
        var table: FixedBaseTable
        var digest: [UInt8]
        var raw: [UInt8]
        var expected: Bool
    }

    /// Twenty-one signatures (genuine, altered in nineteen ways, another key's) over each of seventeen
    /// digests of every kind, under each of five genuine keys, with OpenSSL's answer for each.
    private func candidates() throws -> [Candidate] {
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        func bytes(_ count: Int) -> [UInt8] {
            (0..<count).map { _ in
                state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
                return UInt8(truncatingIfNeeded: state >> 56)
            }
        }
        let keys = try [fixtureKey("leaf.key"), fixtureKey("rogue-leaf.key")] + (0..<3).map { _ in try generatedKey() }
        let n = Self.order
        var all: [Candidate] = []
        for (index, signer) in keys.enumerated() {
            let key = signer.publicKey
            let table = try #require(FixedBaseTable.shared(for: key.pointer))
            let stranger = keys[(index + 1) % keys.count]
            // Digests: random, zero (u1 = 0), all ones and n itself (both above n: reduced), n − 1, one.
            let digests = (0..<12).map { _ in bytes(32) } + [
                Self.number(0), [UInt8](repeating: 0xFF, count: 32), n, Self.add(n, Self.number(1), subtracting: true), Self.number(1),
            ]
            for digest in digests {
                let genuine = try sign(digest, with: signer)
                let (r, s) = (Array(genuine[..<32]), Array(genuine[32...]))
                var candidates: [(raw: [UInt8], valid: Bool?)] = [
                    (genuine, true),
                    (r + Self.add(n, s, subtracting: true), true),  // the same signature's other valid form
                    (try sign(bytes(32), with: signer), false),  // another digest's
                    (try sign(digest, with: stranger), false),  // another key's
                    (s + r, nil), (Self.number(0) + s, false), (r + Self.number(0), false), (n + s, false), (r + n, false),
                    (Self.add(r, n) + s, nil), ([UInt8](repeating: 0xFF, count: 64), false), ([UInt8](repeating: 0, count: 64), false),
                    (Self.add(n, Self.number(1), subtracting: true) + s, nil), (Self.number(1) + Self.number(1), false),
                ]
                for bit in [0, 7, 100, 255, 256, 300, 511] {
                    var flipped = genuine
                    flipped[bit / 8] ^= UInt8(1 << (bit % 8))
                    candidates.append((flipped, nil))
                }
                for (raw, valid) in candidates {
                    let expected = try openSSLVerifies(key, digest, raw)
                    if let valid { #expect(expected == valid, "OpenSSL: key \(index) digest \(digest) signature \(raw)") }
                    all.append(Candidate(key: key, table: table, digest: digest, raw: raw, expected: expected))
                }
            }
        }
        #expect(all.count == 5 * 17 * 21)
        return all
    }

    /// Every signature below, over digests of every kind, with genuine keys, answered by the table exactly as
    /// by OpenSSL; the genuine signatures (and their other valid form, s → n − s) verify.
    @Test func theTableAnswersAsOpenSSLsVerificationForEverySignature() throws {
        for candidate in try candidates() {
            #expect(
                candidate.table.verify(digest: candidate.digest, rawSignature: candidate.raw) == candidate.expected,
                "digest \(candidate.digest) signature \(candidate.raw)")
        }
    }

    /// The same signatures checked together, in groups of one to forty (more than one call takes, so
    /// those are split) that mix keys, valid and invalid signatures and those out of range (which take no
    /// part in the shared inversion): each answered as OpenSSL answers it alone. `PublicKey`'s form also
    /// takes keys without a table, which it checks one by one.
    @Test func signaturesCheckedTogetherAnswerEachAsAlone() throws {
        var candidates = try candidates()
        var state: UInt64 = 0x2545_F491_4F6C_DD1D
        func next(_ bound: Int) -> Int {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int((state >> 33) % UInt64(bound))
        }
        for index in candidates.indices.reversed() { candidates.swapAt(index, next(index + 1)) }
        let untabled = Dictionary(
            candidates.map { (ObjectIdentifier($0.key), $0.key) }, uniquingKeysWith: { first, _ in first }
        ).mapValues { key in
            // The same key again, without a table: the pointer's reference is its own.
            EVP_PKEY_up_ref(key.pointer)
            return PublicKey(taking: key.pointer)
        }
        var start = 0
        var groups = 0
        while start < candidates.count {
            let size = [1, 2, 3, 3, 3, 5, 16, 17, 40][next(9)]
            let group = Array(candidates[start..<min(start + size, candidates.count)])
            start += group.count
            groups += 1
            let expected = group.map(\.expected)
            #expect(FixedBaseTable.verify(group.map { ($0.table, $0.digest, $0.raw) }) == expected, "\(group.map(\.raw))")
            for key in group.map(\.key) where !key.hasFixedBaseTable { #expect(key.prepareFixedBaseTable()) }
            let checks = group.enumerated().map { position, candidate in
                ES256Check(
                    key: position % 2 == 0 ? candidate.key : untabled[ObjectIdentifier(candidate.key)]!, digest: candidate.digest,
                    rawSignature: candidate.raw)
            }
            #expect(PublicKey.verifyES256(checks) == expected, "\(group.map(\.raw))")
        }
        #expect(groups > 100)
        #expect(FixedBaseTable.verify([]) == [])
        #expect(PublicKey.verifyES256([]) == [])
    }

    /// The cases random signatures never reach, built on purpose: keys under which a signature's sum
    /// R = u1·G + u2·Q is the point at infinity; keys under which R's x is above the order n, so that r is
    /// x − n (valid) and not x (out of range); and keys under which R's x is a small t and r is t + (p − n),
    /// which only a comparison that forgot r + n must be below p would take. OpenSSL and the table agree on each.
    @Test func theRareCasesAnswerAsOpenSSLsVerificationToo() throws {
        let group = try #require(EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1))
        defer { EC_GROUP_free(group) }
        let context = try #require(BN_CTX_new())
        defer { BN_CTX_free(context) }
        let n = try #require(EC_GROUP_get0_order(group))
        var state: UInt64 = 0xD1B5_4A32_D192_ED03
        func bytes() -> [UInt8] {
            (0..<32).map { _ in
                state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
                return UInt8(truncatingIfNeeded: state >> 56)
            }
        }
        func number(_ bytes: [UInt8]) -> OpaquePointer { bytes.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress, 32, nil)! } }
        func encoded(_ value: OpaquePointer) -> [UInt8] {
            var out = [UInt8](repeating: 0, count: 32)
            _ = out.withUnsafeMutableBufferPointer { BN_bn2binpad(value, $0.baseAddress, 32) }
            return out
        }
        /// A scalar in [1, n − 1].
        func scalar() -> OpaquePointer {
            let value = number(bytes())
            BN_nnmod(value, value, n, context)
            if BN_is_zero(value) == 1 { BN_set_word(value, 7) }
            return value
        }
        // Another key's genuine signature, checked in a batch with each constructed one.
        let genuine = try fixtureKey("leaf.key")
        let other = try #require(FixedBaseTable.shared(for: genuine.publicKey.pointer))
        /// The key of point `q`, and both verifications' answers for `r‖s` over `digest`.
        func answers(_ q: OpaquePointer, _ digest: [UInt8], _ r: OpaquePointer, _ s: OpaquePointer) throws -> (Bool, Bool?) {
            var point = [UInt8](repeating: 0, count: 65)
            #expect(EC_POINT_point2oct(group, q, POINT_CONVERSION_UNCOMPRESSED, &point, 65, context) == 65)
            let key = try PublicKey(p256Point: point)
            let table = try #require(FixedBaseTable.shared(for: key.pointer))
            let raw = encoded(r) + encoded(s)
            let alone = table.verify(digest: digest, rawSignature: raw)
            // Together with itself, and with another key's valid signature, the same answer.
            let otherDigest = bytes()
            let together = FixedBaseTable.verify([(other, otherDigest, try sign(otherDigest, with: genuine)), (table, digest, raw), (table, digest, raw)])
            #expect(together == alone.map { [true, $0, $0] })
            return (try openSSLVerifies(key, digest, raw), alone)
        }
        for _ in 0..<4 {
            let digest = bytes()
            let e = number(digest)
            let (r, s) = (scalar(), scalar())
            defer { [e, r, s].forEach { BN_free($0) } }
            let rInverse = try #require(BN_mod_inverse(nil, r, n, context))
            defer { BN_free(rInverse) }
            // Q = −(e/r)·G: then u1·G + u2·Q = (e/s)·G − (e/s)·G, the point at infinity.
            let k = try #require(BN_new())
            defer { BN_free(k) }
            #expect(BN_mod_mul(k, e, rInverse, n, context) == 1)
            let q = try #require(EC_POINT_new(group))
            defer { EC_POINT_free(q) }
            #expect(EC_POINT_mul(group, q, k, nil, nil, context) == 1 && EC_POINT_invert(group, q, context) == 1)
            let atInfinity = try answers(q, digest, r, s)
            #expect(atInfinity.0 == false && atInfinity.1 == false)

            // A point R whose x is n + t for the smallest t that is some point's x, and Q = (s/t)·R − (e/t)·G:
            // then R = u1·G + u2·Q for the signature (t, s), and x(R) mod n = t.
            let x = try #require(BN_new()), t = try #require(BN_new())
            let big = try #require(EC_POINT_new(group))
            defer { BN_free(x); BN_free(t); EC_POINT_free(big) }
            var found = false
            for small in 1..<200 where !found {
                BN_set_word(t, UInt(small))
                BN_add(x, n, t)
                found = EC_POINT_set_compressed_coordinates(group, big, x, 0, context) == 1
                ERR_clear_error()
            }
            try #require(found)
            let tInverse = try #require(BN_mod_inverse(nil, t, n, context))
            let a = try #require(BN_new()), b = try #require(BN_new())
            let bG = try #require(EC_POINT_new(group))
            defer { BN_free(tInverse); BN_free(a); BN_free(b); EC_POINT_free(bG) }
            #expect(BN_mod_mul(a, s, tInverse, n, context) == 1 && BN_mod_mul(b, e, tInverse, n, context) == 1)
            #expect(EC_POINT_mul(group, q, nil, big, a, context) == 1 && EC_POINT_mul(group, bG, b, nil, nil, context) == 1)
            #expect(EC_POINT_invert(group, bG, context) == 1 && EC_POINT_add(group, q, q, bG, context) == 1)
            let reduced = try answers(q, digest, t, s)
            #expect(reduced.0 == true && reduced.1 == true)
            let unreduced = try answers(q, digest, x, s)
            #expect(unreduced.0 == false && unreduced.1 == false)

            // The other side of that case: R's x is the small t itself and r = t + (p − n), below n, so that
            // r + n = t + p is not below p and so no x. (r + n)·Z² ≡ t·Z² = X (mod p) must not be taken as a match.
            let p = try #require(BN_new()), beyondN = try #require(BN_new()), tiny = try #require(BN_new())
            let small = try #require(EC_POINT_new(group))
            defer { BN_free(p); BN_free(beyondN); BN_free(tiny); EC_POINT_free(small) }
            #expect(EC_GROUP_get_curve(group, p, nil, nil, context) == 1)
            found = false
            for candidate in 1..<200 where !found {
                BN_set_word(tiny, UInt(candidate))
                found = EC_POINT_set_compressed_coordinates(group, small, tiny, 0, context) == 1
                ERR_clear_error()
            }
            try #require(found)
            #expect(BN_sub(beyondN, p, n) == 1 && BN_add(beyondN, beyondN, tiny) == 1 && BN_cmp(beyondN, n) < 0)
            let rInverseOfR = try #require(BN_mod_inverse(nil, beyondN, n, context))
            defer { BN_free(rInverseOfR) }
            #expect(BN_mod_mul(a, s, rInverseOfR, n, context) == 1 && BN_mod_mul(b, e, rInverseOfR, n, context) == 1)
            #expect(EC_POINT_mul(group, q, nil, small, a, context) == 1 && EC_POINT_mul(group, bG, b, nil, nil, context) == 1)
            #expect(EC_POINT_invert(group, bG, context) == 1 && EC_POINT_add(group, q, q, bG, context) == 1)
            let beyond = try answers(q, digest, beyondN, s)
            #expect(beyond.0 == false && beyond.1 == false)
        }
    }

    /// Once its table is built, a key verifies through it (no OpenSSL verification context is made), with the
    /// same answers; only P-256 keys get one.
    @Test func aKeyVerifiesThroughItsTableOnceBuiltAndOnlyP256KeysGetOne() throws {
        let signer = try fixtureKey("leaf.key")
        let key = signer.publicKey
        #expect(!key.hasFixedBaseTable)
        let data = Array("a notification".utf8)
        let signature = try signer.signES256(data)
        #expect(key.verifyES256(data, rawSignature: signature) && key.keptContextCount == 1)
        #expect(key.prepareFixedBaseTable() && key.hasFixedBaseTable && key.prepareFixedBaseTable())
        let tabled = signer.publicKey
        #expect(tabled.prepareFixedBaseTable())
        for length in [0, 1, 64, 13_000] {
            let data = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 7) }
            let signature = try signer.signES256(data)
            #expect(tabled.verifyES256(data, rawSignature: signature))
            var changed = signature
            changed[40] ^= 2
            #expect(!tabled.verifyES256(data, rawSignature: changed))
            #expect(!tabled.verifyES256(data + [0], rawSignature: signature))
            #expect(!tabled.verifyES256(data, rawSignature: try fixtureKey("rogue-leaf.key").signES256(data)))
            #expect(!tabled.verifyES256(data, rawSignature: Array(signature.prefix(63))))
        }
        #expect(tabled.keptContextCount == 0)

        let p384 = try generatedKey("P-384").publicKey
        #expect(!p384.prepareFixedBaseTable() && !p384.hasFixedBaseTable)
        let rsa = try PublicKey(rsaModulus: [0xC3] + [UInt8](repeating: 0x5A, count: 254) + [0x01], exponent: [1, 0, 1])
        #expect(!rsa.prepareFixedBaseTable() && !rsa.hasFixedBaseTable)
        #expect(!rsa.verifyES256(data, rawSignature: signature))
    }

    /// Key objects of the same point (each app's chain cache makes its own for Apple's leaf key) share one
    /// table; another point gets its own; the table goes when the last key using it goes.
    @Test func keysOfOnePointShareOneTableWhileAnyUsesIt() throws {
        // A point of this test's own: tests running at the same time share the fixtures' keys' tables.
        let signer = try generatedKey()
        var first: PublicKey? = signer.publicKey
        var second: PublicKey? = signer.publicKey
        #expect(first !== second)
        #expect(try #require(first).prepareFixedBaseTable() && #require(second).prepareFixedBaseTable())
        weak let shared = first?.fixedBaseTable
        #expect(shared != nil && shared === second?.fixedBaseTable)
        let other = try generatedKey().publicKey
        #expect(other.prepareFixedBaseTable() && other.fixedBaseTable !== shared)
        // Verifications through the shared table answer for either key.
        let data = Array("shared".utf8)
        let signature = try signer.signES256(data)
        do {
            let kept = try #require(second)
            withExtendedLifetime(kept) {
                #expect(kept.verifyES256(data, rawSignature: signature) && !other.verifyES256(data, rawSignature: signature))
                first = nil
                #expect(shared != nil)
            }
        }
        second = nil
        // Another thread's registry insert holds each live table for an instant while it prunes the dead
        // ones: the table may outlive the last key by that instant.
        let deadline = ContinuousClock.now + .seconds(2)
        while shared != nil, ContinuousClock.now < deadline { usleep(1_000) }
        #expect(shared == nil)
        // A key of that point made now builds a new one.
        let third = signer.publicKey
        #expect(third.prepareFixedBaseTable() && third.fixedBaseTable != nil)
    }

    /// One table verifies on many threads at once, each with its own big-number context.
    @Test func oneTableVerifiesOnManyThreadsAtOnce() async throws {
        let signer = try fixtureKey("leaf.key")
        let key = signer.publicKey
        #expect(key.prepareFixedBaseTable())
        let signed = try (0..<8).map { index -> ([UInt8], [UInt8]) in
            let data = Array("notification \(index)".utf8)
            return (data, try signer.signES256(data))
        }
        #expect(await wrongAnswersOnManyThreads(key, signed) == 0)
        #expect(key.keptContextCount == 0)
    }
}
