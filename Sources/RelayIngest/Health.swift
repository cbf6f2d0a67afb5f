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
        var warnings: [(name: String, check: @Sendable () -> Bool)] = []
    }

    private let state = Mutex(State())

    public init() {}

    /// Adds a readiness condition, e.g. `("kafka", { producer.isConnected })`.
    public func addReadinessCheck(_ name: String, _ check: @escaping @Sendable () -> Bool) {
        state.withLock { $0.checks.append((name, check)) }
    }

    /// Adds a condition `/health/ready` reports under `warnings` while it holds, without turning not
    /// ready: the process still serves, but something (e.g. "the log's budget is full") needs attention.
    public func addWarning(_ name: String, _ holds: @escaping @Sendable () -> Bool) {
        state.withLock { $0.warnings.append((name, holds)) }
    }

    /// The names of the warnings that hold now.
    public func currentWarnings() -> [String] {
        state.withLock { $0.warnings }.filter { $0.check() }.map(\.name)
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
