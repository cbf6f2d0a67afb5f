/// A per-endpoint circuit breaker. After `threshold` failed attempts in a row it opens: new deliveries
/// skip the endpoint (they go to the first retry step) for `cooldown`; then one new delivery is let
/// through as a probe. The probe's success, or any other successful attempt, closes it; the probe's
/// failure opens it for another cooldown. Retries that are due are attempted whatever its state: they
/// are already spaced by the schedule, and they must progress to the dead-letter topic.
struct CircuitBreaker: Sendable {
    enum Phase: Sendable, Equatable {
        case closed
        case open(until: Int64)
        /// The probe is out.
        case probing
    }

    enum Admission: Sendable, Equatable {
        case pass, probe, divert
    }

    enum Transition: Sendable, Equatable {
        case none, opened, closed
    }

    let threshold: Int
    let cooldownMilliseconds: Int64
    private(set) var phase = Phase.closed
    private(set) var consecutiveFailures = 0

    init(threshold: Int, cooldownMilliseconds: Int64) {
        self.threshold = max(1, threshold)
        self.cooldownMilliseconds = max(0, cooldownMilliseconds)
    }

    var isOpen: Bool { phase != .closed }

    /// Whether a new delivery (not a due retry) may go to the endpoint now.
    mutating func admitNew(now: Int64) -> Admission {
        switch phase {
        case .closed: return .pass
        case .probing: return .divert
        case .open(let until):
            guard now >= until else { return .divert }
            phase = .probing
            return .probe
        }
    }

    /// The probe could not be sent after all: let the next new delivery probe.
    mutating func probeAbandoned(now: Int64) {
        if phase == .probing { phase = .open(until: now) }
    }

    mutating func record(success: Bool, now: Int64) -> Transition {
        if success {
            consecutiveFailures = 0
            guard phase != .closed else { return .none }
            phase = .closed
            return .closed
        }
        consecutiveFailures += 1
        switch phase {
        case .probing:
            phase = .open(until: now + cooldownMilliseconds)
            return .none
        case .open:
            return .none
        case .closed:
            guard consecutiveFailures >= threshold else { return .none }
            phase = .open(until: now + cooldownMilliseconds)
            return .opened
        }
    }
}
