import Synchronization

/// A token bucket per client: each client may make `burst` requests at once and `ratePerSecond` on
/// average. The clock is injected (monotonic nanoseconds), so tests step time instead of sleeping.
///
/// Memory is bounded: at most `maxClients` buckets are kept. When that many are tracked, buckets that
/// have refilled (clients idle long enough to be back at `burst`) are dropped, which forgets nothing a
/// limit depends on; if every bucket is still draining (a flood from more addresses than that), all are
/// dropped, so the limiter errs towards letting clients through rather than growing without bound.
public final class ClientRateLimiter: Sendable {
    /// Whether a request may go ahead; when not, how long until it could.
    public enum Decision: Sendable, Equatable {
        case allowed
        /// Refused; retry after this many whole seconds (at least 1).
        case limited(retryAfterSeconds: Int)
    }

    /// The bookkeeping, a value type tested without a clock of its own.
    struct State: Sendable {
        struct Bucket: Sendable {
            var tokens: Double
            var updatedAt: UInt64
        }

        let ratePerSecond: Double
        let burst: Double
        let maxClients: Int
        var buckets: [String: Bucket] = [:]

        mutating func take(_ client: String, now: UInt64) -> Decision {
            var bucket = buckets[client] ?? Bucket(tokens: burst, updatedAt: now)
            let elapsed = Double(now &- min(now, bucket.updatedAt)) / 1_000_000_000
            bucket.tokens = min(burst, bucket.tokens + elapsed * ratePerSecond)
            bucket.updatedAt = now
            let decision: Decision
            if bucket.tokens >= 1 {
                bucket.tokens -= 1
                decision = .allowed
            } else {
                // At most a day: a rate too small to count in seconds must not trap the conversion.
                let wait = min((1 - bucket.tokens) / ratePerSecond, 86_400)
                decision = .limited(retryAfterSeconds: max(1, Int(wait.rounded(.up))))
            }
            if buckets[client] == nil, buckets.count >= maxClients { evict(now: now) }
            buckets[client] = bucket
            return decision
        }

        /// Drops the buckets that are full again; all of them when none is.
        private mutating func evict(now: UInt64) {
            buckets = buckets.filter { _, bucket in
                bucket.tokens + Double(now &- min(now, bucket.updatedAt)) / 1_000_000_000 * ratePerSecond < burst
            }
            if buckets.count >= maxClients { buckets.removeAll(keepingCapacity: true) }
        }
    }

    private let state: Mutex<State>
    private let now: @Sendable () -> UInt64
    /// False when the limit is off (a rate of 0).
    private let enabled: Bool

    /// - Parameters:
    ///   - ratePerSecond: requests a second on average; 0 allows everything.
    ///   - burst: requests at once (the bucket's size).
    ///   - maxClients: buckets kept at most.
    ///   - now: monotonic nanoseconds. Default: the system's monotonic clock.
    public init(
        ratePerSecond: Double, burst: Int, maxClients: Int = 100_000,
        now: (@Sendable () -> UInt64)? = nil
    ) {
        enabled = ratePerSecond > 0
        state = Mutex(State(ratePerSecond: max(ratePerSecond, .leastNonzeroMagnitude), burst: Double(max(burst, 1)), maxClients: max(maxClients, 1)))
        self.now = now ?? { ContinuousClock.nanosecondsSinceStart() }
    }

    /// The limit on guessing a secret (redemption codes, console keys) and on costly creations (checkouts):
    /// 10 at once per client, then one every 6 seconds.
    public static func guessing(now: (@Sendable () -> UInt64)? = nil) -> ClientRateLimiter {
        ClientRateLimiter(ratePerSecond: 1.0 / 6, burst: 10, now: now)
    }

    /// Takes one request of `client` from its bucket.
    public func take(_ client: String) -> Decision {
        guard enabled else { return .allowed }
        let now = now()
        return state.withLock { $0.take(client, now: now) }
    }

    /// How many clients are tracked (for tests of the bound).
    public var trackedClients: Int { state.withLock { $0.buckets.count } }
}

extension ContinuousClock {
    /// Nanoseconds since an arbitrary fixed point of this process (monotonic).
    static func nanosecondsSinceStart() -> UInt64 {
        let elapsed = processStart.duration(to: .now).components
        return UInt64(max(0, elapsed.seconds)) * 1_000_000_000 + UInt64(max(0, elapsed.attoseconds / 1_000_000_000))
    }

    private static let processStart = ContinuousClock.now
}
