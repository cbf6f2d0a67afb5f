import COpenSSL
import Synchronization

/// An OpenSSL public key (`EVP_PKEY`), owned: freed when the last reference goes, with the verification
/// contexts it keeps.
///
/// Immutable once made; OpenSSL 3 allows one key to verify on many threads at once. A context is used by one
/// thread at a time: each verification borrows one.
public final class PublicKey: @unchecked Sendable {
    let pointer: OpaquePointer
    /// ES256 verification contexts made ready (`EVP_PKEY_verify_init`) and not in use, owned. Making one
    /// looks the key's management and ECDSA up by name in OpenSSL 3.0, about 2.5 µs of a 64 µs verification.
    private let readyContexts = KeptHandles(limit: PublicKey.keptContexts, release: { EVP_PKEY_CTX_free($0) })
    /// More contexts than threads that verify at once are freed when returned.
    static let keptContexts = 16
    /// This key's multiples, once `prepareFixedBaseTable()` built them: ES256 verifications then take about
    /// half the time (`FixedBaseTable`).
    private let fixedBase = AtomicLazyReference<FixedBaseTable>()

    /// Takes ownership of one reference to `pointer`.
    init(taking pointer: OpaquePointer) {
        self.pointer = pointer
    }

    deinit { EVP_PKEY_free(pointer) }

    /// An RSA key from its big-endian modulus and public exponent (a JWK's `n` and `e`).
    public convenience init(rsaModulus modulus: [UInt8], exponent: [UInt8]) throws(OpenSSLError) {
        let key = modulus.withUnsafeBufferPointer { n in
            exponent.withUnsafeBufferPointer { e in
                relay_rsa_public_key(n.baseAddress, Int32(n.count), e.baseAddress, Int32(e.count))
            }
        }
        guard let key else { throw .drain("build RSA key") }
        self.init(taking: key)
    }

    /// A P-256 key from its SEC 1 encoded point (tests build keys for the verification's rarest cases).
    convenience init(p256Point point: [UInt8]) throws(OpenSSLError) {
        guard let key = point.withUnsafeBufferPointer({ relay_p256_public_key($0.baseAddress, $0.count) }) else {
            throw .drain("build P-256 key")
        }
        self.init(taking: key)
    }

    /// What kind of key this is, as far as the relay's algorithms care.
    public enum Kind: Sendable, Equatable {
        case ecP256
        case ecOther(String)
        case rsa(bits: Int)
        case other
    }

    public var kind: Kind {
        switch EVP_PKEY_get_base_id(pointer) {
        case EVP_PKEY_EC:
            var name = [CChar](repeating: 0, count: 64)
            var length = 0
            guard EVP_PKEY_get_group_name(pointer, &name, name.count, &length) == 1 else {
                OpenSSLError.clearQueue()
                return .ecOther("unknown")
            }
            let group = name.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
            return group == "prime256v1" || group == "P-256" ? .ecP256 : .ecOther(group)
        case EVP_PKEY_RSA:
            return .rsa(bits: Int(EVP_PKEY_get_bits(pointer)))
        default:
            return .other
        }
    }

    /// Verifies an ES256 (ECDSA P-256 with SHA-256) signature in JWS form: the raw 64-byte `r‖s`,
    /// converted to the DER `ECDSA-Sig-Value` that OpenSSL expects.
    ///
    /// The data is hashed here (SHA-256 fetched once, `Digest.sha256`) and the digest verified on a context
    /// made ready once for this key: the same check as `EVP_DigestVerify`, without its lookups of the digest,
    /// the key's management and ECDSA by name for every verification (one per Apple notification, each
    /// AppTransaction and handed-over purchase, two per App Store Server API record).
    public func verifyES256(_ signedData: [UInt8], rawSignature: [UInt8]) -> Bool {
        signedData.withUnsafeBytes { verifyES256($0, rawSignature: rawSignature) }
    }

    /// `verifyES256` over bytes borrowed from elsewhere (a JWS's signing input inside its text), not copied.
    public func verifyES256(_ signedData: UnsafeRawBufferPointer, rawSignature: [UInt8]) -> Bool {
        verifyES256(digest: Digest.sha256(signedData), rawSignature: rawSignature)
    }

    /// `verifyES256` of signatures checked together (an Apple notification's three): where their keys have
    /// a `FixedBaseTable`, one inversion mod n serves them all, about 10 µs less for each signature after
    /// the first; the keys may differ. The results are each signature's own, in order, the same as one
    /// `verifyES256` each would give. The digests are the caller's: for the relay's verifiers only.
    package static func verifyES256(_ checks: [ES256Check]) -> [Bool] {
        var results = [Bool](repeating: false, count: checks.count)
        var together: [(index: Int, table: FixedBaseTable)] = []
        for (index, check) in checks.enumerated() {
            if check.rawSignature.count == 64, check.digest.count == 32, let table = check.key.fixedBase.load() {
                together.append((index, table))
            } else {
                results[index] = check.key.verifyES256(digest: check.digest, rawSignature: check.rawSignature)
            }
        }
        let verified = together.count < 2
            ? nil : FixedBaseTable.verify(together.map { ($0.table, checks[$0.index].digest, checks[$0.index].rawSignature) })
        for (position, (index, _)) in together.enumerated() {
            let check = checks[index]
            results[index] = verified?[position] ?? check.key.verifyES256(digest: check.digest, rawSignature: check.rawSignature)
        }
        return results
    }

    /// `verifyES256` of a SHA-256 `digest` already taken.
    func verifyES256(digest: [UInt8], rawSignature: [UInt8]) -> Bool {
        // An EC key only (callers check the curve): no other kind of key is ever asked to check this DER.
        guard rawSignature.count == 64, digest.count == 32, EVP_PKEY_get_base_id(pointer) == EVP_PKEY_EC else { return false }
        // The table's verification, unless OpenSSL failed in it (then the usual one decides).
        if let table = fixedBase.load(), let verified = table.verify(digest: digest, rawSignature: rawSignature) { return verified }
        guard let context = borrowContext() else { return false }
        let der = Self.derSignature(raw: rawSignature)
        let verified = EVP_PKEY_verify(context, der, der.count, digest, digest.count) == 1
        if verified {
            readyContexts.giveBack(context)
        } else {
            // Not kept after a failure (a forged or broken signature): nothing of it can reach another check.
            readyContexts.discard(context)
            OpenSSLError.clearQueue()
        }
        return verified
    }

    /// Builds this key's `FixedBaseTable` (about 21 ms and 150 KB, once), or takes the one another key of its
    /// point uses (`FixedBaseTable.shared(for:)`), so its ES256 verifications take about half the time; for a
    /// key that verifies many signatures (Apple's leaf key), off Swift's cooperative pool.
    /// False when the key is not a P-256 key or no table could be built; verification is unchanged then.
    ///
    /// Only on x86_64 and arm64: there OpenSSL multiplies P-256 points with its assembly, which uses the table.
    /// Its portable code would ignore it, and two of its multiplications cost more than its own verification.
    @discardableResult
    public func prepareFixedBaseTable() -> Bool {
        #if arch(x86_64) || arch(arm64)
        if fixedBase.load() != nil { return true }
        // The table checks the curve itself: any other key gets none.
        guard let table = FixedBaseTable.shared(for: pointer) else { return false }
        _ = fixedBase.storeIfNil(table)
        return true
        #else
        return false
        #endif
    }

    /// Whether ES256 verifications use this key's `FixedBaseTable`.
    public var hasFixedBaseTable: Bool { fixedBase.load() != nil }

    /// This key's table, once built (for tests).
    var fixedBaseTable: FixedBaseTable? { fixedBase.load() }

    /// A ready context, kept or made now; nil when OpenSSL cannot make one.
    private func borrowContext() -> OpaquePointer? {
        if let kept = readyContexts.take() { return kept }
        guard let context = EVP_PKEY_CTX_new_from_pkey(nil, pointer, nil) else {
            OpenSSLError.clearQueue()
            return nil
        }
        guard EVP_PKEY_verify_init(context) == 1 else {
            EVP_PKEY_CTX_free(context)
            OpenSSLError.clearQueue()
            return nil
        }
        return context
    }

    /// Verification contexts this key keeps ready (for tests).
    var keptContextCount: Int { readyContexts.count }

    /// Verifies an RS256 (RSASSA-PKCS1-v1_5 with SHA-256) signature.
    public func verifyRS256(_ signedData: [UInt8], signature: [UInt8]) -> Bool {
        verify(signedData, signature: signature)
    }

    private func verify(_ signedData: [UInt8], signature: [UInt8]) -> Bool {
        guard let context = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(context) }
        let verified = signedData.withUnsafeBytes { data in
            signature.withUnsafeBufferPointer { signature in
                EVP_DigestVerifyInit_ex(context, nil, "SHA256", nil, nil, pointer, nil) == 1
                    && EVP_DigestVerify(
                        context, signature.baseAddress, signature.count, data.baseAddress?.assumingMemoryBound(to: UInt8.self),
                        data.count) == 1
            }
        }
        if !verified { OpenSSLError.clearQueue() }
        return verified
    }

    /// The DER encoding of a raw 64-byte `r‖s` ECDSA signature: `SEQUENCE { INTEGER r, INTEGER s }`, each integer
    /// in its fewest bytes and positive (a 0 before a first byte with its high bit set), as `i2d_ECDSA_SIG`
    /// writes it. Every length fits DER's short form (at most 70 bytes).
    static func derSignature(raw: [UInt8]) -> [UInt8] {
        precondition(raw.count == 64, "an ES256 signature is 64 bytes")
        var der: [UInt8] = [0x30, 0]
        der.reserveCapacity(72)
        for half in [raw[0..<32], raw[32..<64]] {
            var start = half.startIndex
            while start < half.endIndex - 1, half[start] == 0 { start += 1 }
            let padded = half[start] & 0x80 != 0
            der.append(0x02)
            der.append(UInt8(half.endIndex - start + (padded ? 1 : 0)))
            if padded { der.append(0) }
            der.append(contentsOf: half[start...])
        }
        der[1] = UInt8(der.count - 2)
        return der
    }
}

/// One ES256 signature for `PublicKey.verifyES256(_:)`: the key, the SHA-256 digest of the signed bytes
/// (`Digest.sha256`), and the raw 64-byte `r‖s`.
package struct ES256Check: Sendable {
    package let key: PublicKey
    package let digest: [UInt8]
    package let rawSignature: [UInt8]

    package init(key: PublicKey, digest: [UInt8], rawSignature: [UInt8]) {
        self.key = key
        self.digest = digest
        self.rawSignature = rawSignature
    }
}

/// An OpenSSL private key, owned. Signs service-account JWTs (RS256) and, in tests and benchmarks,
/// App Store–shaped JWSs (ES256).
public final class PrivateKey: @unchecked Sendable {
    let pointer: OpaquePointer

    deinit { EVP_PKEY_free(pointer) }

    /// Takes ownership of one reference to `pointer` (tests make keys with OpenSSL's generator).
    init(taking pointer: OpaquePointer) {
        self.pointer = pointer
    }

    /// A PEM private key: PKCS#8 (`PRIVATE KEY`) or traditional (`EC PRIVATE KEY`, `RSA PRIVATE KEY`).
    public init(pem: String) throws(OpenSSLError) {
        let key = withMemoryBIO(Array(pem.utf8)) { bio in PEM_read_bio_PrivateKey(bio, nil, nil, nil) }
        guard let key else { throw .drain("parse PEM private key") }
        self.pointer = key
    }

    /// The matching public key.
    public var publicKey: PublicKey {
        EVP_PKEY_up_ref(pointer)
        return PublicKey(taking: pointer)
    }

    /// An ES256 signature in JWS form (raw 64-byte `r‖s`).
    public func signES256(_ data: [UInt8]) throws(OpenSSLError) -> [UInt8] {
        let der = try sign(data)
        let raw: [UInt8]? = der.withUnsafeBufferPointer { buffer in
            var cursor = buffer.baseAddress
            guard let signature = d2i_ECDSA_SIG(nil, &cursor, buffer.count) else { return nil }
            defer { ECDSA_SIG_free(signature) }
            var raw = [UInt8](repeating: 0, count: 64)
            let written = raw.withUnsafeMutableBufferPointer { out in
                BN_bn2binpad(ECDSA_SIG_get0_r(signature), out.baseAddress, 32) == 32
                    && BN_bn2binpad(ECDSA_SIG_get0_s(signature), out.baseAddress! + 32, 32) == 32
            }
            return written ? raw : nil
        }
        guard let raw else { throw .drain("convert ECDSA signature") }
        return raw
    }

    /// An RS256 (RSASSA-PKCS1-v1_5, SHA-256) signature.
    public func signRS256(_ data: [UInt8]) throws(OpenSSLError) -> [UInt8] {
        try sign(data)
    }

    private func sign(_ data: [UInt8]) throws(OpenSSLError) -> [UInt8] {
        guard let context = EVP_MD_CTX_new() else { throw .drain("sign") }
        defer { EVP_MD_CTX_free(context) }
        let signature: [UInt8]? = data.withUnsafeBytes { data in
            let input = data.baseAddress?.assumingMemoryBound(to: UInt8.self)
            var length = 0
            guard EVP_DigestSignInit(context, nil, EVP_sha256(), nil, pointer) == 1,
                EVP_DigestSign(context, nil, &length, input, data.count) == 1
            else { return nil }
            var signature = [UInt8](repeating: 0, count: length)
            let signed = signature.withUnsafeMutableBufferPointer { out in
                EVP_DigestSign(context, out.baseAddress, &length, input, data.count) == 1
            }
            guard signed else { return nil }
            return Array(signature.prefix(length))
        }
        guard let signature else { throw .drain("sign") }
        return signature
    }
}

/// Runs `body` with a read-only memory BIO over `bytes`.
func withMemoryBIO<Result>(_ bytes: [UInt8], _ body: (OpaquePointer) -> Result?) -> Result? {
    bytes.withUnsafeBytes { buffer -> Result? in
        guard let bio = BIO_new_mem_buf(buffer.baseAddress, Int32(buffer.count)) else { return nil }
        defer { BIO_free(bio) }
        return body(bio)
    }
}
