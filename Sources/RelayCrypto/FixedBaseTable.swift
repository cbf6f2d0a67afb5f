import COpenSSL
import Synchronization

/// A P-256 public key's multiples precomputed once, for ES256 verifications that take half the time of
/// OpenSSL's own (about 30 against 62 µs on one core of the benchmark VM, `revenue-relay-bench
/// apple-verify`). A verification is u1·G + u2·Q: OpenSSL has a built-in table for the generator G and
/// computes u2·Q from scratch, which is most of the work. This table makes Q the generator of a second
/// copy of the group, so both products come from tables. The arithmetic is all OpenSSL's;
/// `relay_p256_verify_fixed_base` puts SEC 1's verification equation together from it, with the same
/// checks as OpenSSL's verification, for one signature or several at once.
///
/// Worth it only for a key that verifies many signatures: building it takes about 21 ms and it holds
/// about 150 KB. The relay builds one for each of Apple's leaf keys its chain caches hold, shared by every
/// key object of the same point (`shared(for:)`: each app's cache has its own object for Apple's key).
/// Owns its two groups and the big-number contexts it keeps; used by many threads at once (the groups
/// are only read, and each verification borrows a context).
final class FixedBaseTable: @unchecked Sendable {
    private let standard: OpaquePointer
    private let fixed: OpaquePointer
    /// `BN_CTX`s not in use, owned. One verification uses one.
    private let contexts = KeptHandles(limit: PublicKey.keptContexts, release: { BN_CTX_free($0) })

    /// Nil when OpenSSL cannot build the table of this P-256 point (`p256Point(of:)`).
    private init?(point: [UInt8]) {
        guard let fixed = relay_p256_fixed_base_group(point, point.count) else {
            OpenSSLError.clearQueue()
            return nil
        }
        guard let standard = EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1) else {
            EC_GROUP_free(fixed)
            OpenSSLError.clearQueue()
            return nil
        }
        self.fixed = fixed
        self.standard = standard
    }

    deinit {
        EC_GROUP_free(fixed)
        EC_GROUP_free(standard)
    }

    /// `key`'s encoded point when it is a P-256 key.
    private static func p256Point(of key: OpaquePointer) -> [UInt8]? {
        var point = [UInt8](repeating: 0, count: 65)
        let length = relay_p256_encoded_point(key, &point)
        guard length > 0 else {
            OpenSSLError.clearQueue()
            return nil
        }
        return Array(point.prefix(length))
    }

    /// The tables alive, by their P-256 point, held weakly: a table lives as long as a key uses it.
    private static let alive = Mutex<[[UInt8]: Weak]>([:])

    private struct Weak: Sendable {
        weak var table: FixedBaseTable?
    }

    /// The table of `key`'s point: the one another key of that point already uses, else a new one (built
    /// outside the lock; of two built at once for one point, one is kept). Nil when `key` is not a P-256 key
    /// or OpenSSL cannot build the table. Only a P-256 key's point is looked up, so no other curve's key can
    /// find a P-256 table.
    static func shared(for key: OpaquePointer) -> FixedBaseTable? {
        guard let point = p256Point(of: key) else { return nil }
        if let table = alive.withLock({ $0[point]?.table }) { return table }
        guard let built = FixedBaseTable(point: point) else { return nil }
        return alive.withLock { alive in
            if let table = alive[point]?.table { return table }
            alive = alive.filter { $0.value.table != nil }
            alive[point] = Weak(table: built)
            return built
        }
    }

    /// Whether the raw 64-byte `r‖s` signs the 32-byte `digest` under this table's key; nil when OpenSSL
    /// failed (the caller verifies the usual way then).
    func verify(digest: [UInt8], rawSignature: [UInt8]) -> Bool? {
        Self.verify([(self, digest, rawSignature)])?.first
    }

    /// Whether each raw 64-byte `r‖s` signs its 32-byte digest under its table's key, checked together:
    /// their inverses mod n come from one inversion, about 10 µs less for each signature after the first
    /// (`relay_p256_verify_fixed_base`). Each result depends only on its own signature, digest and key.
    /// Nil when OpenSSL failed (the caller verifies each the usual way then).
    static func verify(_ checks: [(table: FixedBaseTable, digest: [UInt8], rawSignature: [UInt8])]) -> [Bool]? {
        guard let first = checks.first else { return [] }
        precondition(
            checks.allSatisfy { $0.digest.count == 32 && $0.rawSignature.count == 64 }, "an ES256 verification takes a SHA-256 digest and r‖s")
        let limit = Int(RELAY_P256_BATCH_LIMIT)
        guard checks.count <= limit else {
            var results: [Bool] = []
            for start in stride(from: 0, to: checks.count, by: limit) {
                guard let some = verify(Array(checks[start..<min(start + limit, checks.count)])) else { return nil }
                results += some
            }
            return results
        }
        guard let context = first.table.contexts.take() ?? BN_CTX_new() else {
            OpenSSLError.clearQueue()
            return nil
        }
        let groups: [OpaquePointer?] = checks.map { $0.table.fixed }
        let digests = checks.flatMap(\.digest)
        let signatures = checks.flatMap(\.rawSignature)
        var results = [Int32](repeating: 0, count: checks.count)
        // The groups are only read, and their tables (held by `checks`) outlive the call.
        let status = withExtendedLifetime(checks) {
            groups.withUnsafeBufferPointer { groups in
                relay_p256_verify_fixed_base(first.table.standard, groups.baseAddress, digests, signatures, Int32(checks.count), context, &results)
            }
        }
        guard status == 1 else {
            first.table.contexts.discard(context)
            OpenSSLError.clearQueue()
            return nil
        }
        first.table.contexts.giveBack(context)
        return results.map { $0 == 1 }
    }
}
