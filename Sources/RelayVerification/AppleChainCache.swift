import Dispatch
import Glibc
import RelayCrypto
import Synchronization

/// Chains that passed verification, keyed by the JWS header that carried them (the exact bytes of its
/// base64url text: the algorithm and the x5c certificates), so steady state costs one ES256 verification per JWS and
/// no header decoding. Bounded (oldest entries go first) and tied to the certificates' validity: an
/// entry serves only times within every certificate's validity, and entries expired by the wall
/// clock are dropped.
///
/// A lookup reads the header where it lies, in the JWS's text: it is neither copied nor hashed whole
/// (about 5 KB, three times for each Apple notification). Entries are found by a digest of the header's
/// length and ends, then compared byte for byte, so only the exact header hits. The verifier enters a
/// header only after its JWS's signature verified with the chain, so headers made to share a digest
/// (Apple's certificates can be copied from any notification) are never entered unless Apple's key
/// signed them.
final class AppleChainCache: Sendable {
    private struct Entry {
        var digest: Int
        var header: [UInt8]
        var key: PublicKey
        var validity: Range<Int64>
    }

    private let capacity: Int
    /// Oldest first. A linear search: the capacity is small (64 by default), and a live deployment holds
    /// a few chains (Apple's leaf certificates change a few times a year).
    private let entries = Mutex<[Entry]>([])
    /// Given each chain's key when it is entered, instead of the default: a build of the key's
    /// `FixedBaseTable` on `preparing`, so that the chain's later verifications take about half the time
    /// (about 21 ms once per Apple leaf key in the process: other chains and apps of the same key share it;
    /// off Swift's cooperative pool; meanwhile the key verifies as before). A
    /// build that fails is not tried again while the chain stays cached: its key verifies as before.
    private let prepare: (@Sendable (PublicKey) -> Void)?

    init(capacity: Int, prepare: (@Sendable (PublicKey) -> Void)? = nil) {
        self.capacity = capacity
        self.prepare = prepare
    }

    /// Where keys' tables are built by default: one at a time, at a low priority.
    static let preparing = DispatchQueue(label: "apple-key-tables", qos: .utility)

    /// The key of the chain `header` carried, when it verified before and every certificate of it is
    /// valid at `time`.
    func lookup(_ header: UnsafeRawBufferPointer, at time: Int64) -> PublicKey? {
        guard capacity > 0 else { return nil }
        let digest = Self.digest(header)
        return entries.withLock { entries in
            for entry in entries where entry.digest == digest && entry.validity.contains(time) && Self.equal(entry.header, header) {
                return entry.key
            }
            return nil
        }
    }

    func insert(_ header: [UInt8], key publicKey: PublicKey, validity: Range<Int64>, now: Int64) {
        guard capacity > 0 else { return }
        let digest = header.withUnsafeBytes { Self.digest($0) }
        let entered = entries.withLock { entries in
            if let index = entries.firstIndex(where: { $0.digest == digest && $0.header == header }) {
                // The same bytes carry the same certificates, so the entry keeps its key (and the key's table).
                entries[index].validity = validity
                return false
            }
            entries.append(Entry(digest: digest, header: header, key: publicKey, validity: validity))
            if entries.count > capacity {
                // Expired chains go first, then the oldest.
                entries.removeAll { $0.validity.upperBound <= now }
                if entries.count > capacity { entries.removeFirst(entries.count - capacity) }
            }
            return true
        }
        // Only a chain whose JWS verified is entered, so no one but Apple's key can make the relay build a table.
        guard entered && !publicKey.hasFixedBaseTable else { return }
        if let prepare { return prepare(publicKey) }
        Self.preparing.async { [weak self] in
            // Not for a chain that left the cache while the build waited its turn.
            guard let self, self.holds(publicKey) else { return }
            publicKey.prepareFixedBaseTable()
        }
    }

    /// Whether a kept chain has this very key.
    private func holds(_ key: PublicKey) -> Bool { entries.withLock { $0.contains { $0.key === key } } }

    /// How many chains are kept (for tests).
    var count: Int { entries.withLock { $0.count } }

    /// How many of the kept chains' keys have their table (for tests).
    var countWithTables: Int { entries.withLock { $0.count(where: { $0.key.hasFixedBaseTable }) } }

    /// Signatures whose answer the verifier took from their check ahead of their turns, with this cache's
    /// keys (`AppleVerifier.checkAhead`; for tests, which show that a genuine notification's three answers
    /// come from it). Kept here because `AppleVerifier` is a struct; one relaxed add per signature.
    let answeredAhead = Atomic<Int>(0)

    /// The length, the first 128 bytes and the last 64. An Apple header's base64url text reaches its leaf
    /// certificate's serial number within about its first 90 characters, so two of Apple's chains differ
    /// there. The digest only spreads the entries: a hit still compares every byte.
    static func digest(_ bytes: UnsafeRawBufferPointer) -> Int {
        var hasher = Hasher()
        hasher.combine(bytes.count)
        hasher.combine(bytes: UnsafeRawBufferPointer(rebasing: bytes[..<min(128, bytes.count)]))
        hasher.combine(bytes: UnsafeRawBufferPointer(rebasing: bytes[(bytes.count - min(64, bytes.count))...]))
        return hasher.finalize()
    }

    private static func equal(_ stored: [UInt8], _ header: UnsafeRawBufferPointer) -> Bool {
        guard stored.count == header.count else { return false }
        if header.isEmpty { return true }
        return stored.withUnsafeBytes { memcmp($0.baseAddress!, header.baseAddress!, header.count) == 0 }
    }
}
