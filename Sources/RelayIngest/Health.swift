import Synchronization

/// Liveness and readiness of one process, shared by every role.
///
/// Ready means: not shutting down, and every registered dependency check passes (for example "a Kafka
/// broker connection is up"). Shutting down flips readiness first, before intake stops, so load
/// balancers stop sending traffic.
public final class HealthState: Sendable {
    private struct State {
        var shuttingDown = false
        var checks: [(name: String, check: @Sendable () -> Bool)] = []
    }

    private let state = Mutex(State())

    public init() {}

    /// Adds a readiness condition, e.g. `("kafka", { producer.isConnected })`.
    public func addReadinessCheck(_ name: String, _ check: @escaping @Sendable () -> Bool) {
        state.withLock { $0.checks.append((name, check)) }
    }

    public func markShuttingDown() {
        state.withLock { $0.shuttingDown = true }
    }

    public var isShuttingDown: Bool { state.withLock { $0.shuttingDown } }

    /// The names of the failing conditions; empty when ready.
    public func notReadyReasons() -> [String] {
        let (shuttingDown, checks) = state.withLock { ($0.shuttingDown, $0.checks) }
        var reasons = shuttingDown ? ["shutting_down"] : []
        for (name, check) in checks where !check() { reasons.append(name) }
        return reasons
    }
}
