import DequeModule
import RelayCrypto
import Synchronization

/// Chains that passed verification, keyed by the JWS header that carried them (the exact bytes of its
/// base64url text: the algorithm and the x5c certificates), so steady state costs one ES256 verification per JWS and
/// no header decoding. Bounded (oldest entries go first) and tied to the certificates' validity: an
/// entry serves only times within every certificate's validity, and entries expired by the wall
/// clock are dropped.
final class AppleChainCache: Sendable {
    /// The header's exact bytes, hashed as one buffer.
    struct Key: Hashable, Sendable {
        let bytes: [UInt8]

        init(_ bytes: [UInt8]) {
            self.bytes = bytes
        }

        func hash(into hasher: inout Hasher) {
            bytes.withUnsafeBytes { hasher.combine(bytes: $0) }
        }
    }

    private struct Entry {
        var key: PublicKey
        var validity: Range<Int64>
    }

    private struct State {
        var entries: [Key: Entry] = [:]
        var order: Deque<Key> = []
    }

    private let capacity: Int
    private let state = Mutex(State())

    init(capacity: Int) {
        self.capacity = capacity
    }

    func lookup(_ key: Key, at time: Int64) -> PublicKey? {
        guard capacity > 0 else { return nil }
        return state.withLock { state in
            guard let entry = state.entries[key], entry.validity.contains(time) else { return nil }
            return entry.key
        }
    }

    func insert(_ key: Key, key publicKey: PublicKey, validity: Range<Int64>, now: Int64) {
        guard capacity > 0 else { return }
        state.withLock { state in
            if state.entries.updateValue(Entry(key: publicKey, validity: validity), forKey: key) != nil { return }
            state.order.append(key)
            if state.order.count > capacity {
                // Expired chains go first, then the oldest.
                let expired = state.order.filter { state.entries[$0].map { $0.validity.upperBound <= now } ?? true }
                for stale in expired { state.entries[stale] = nil }
                state.order.removeAll { state.entries[$0] == nil }
                while state.order.count > capacity, let oldest = state.order.popFirst() { state.entries[oldest] = nil }
            }
        }
    }
}
