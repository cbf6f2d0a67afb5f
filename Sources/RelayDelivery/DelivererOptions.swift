import CoreMetrics
import DequeModule
import Logging
import RelayConfig
import RelayCore
import RelayHTTPClient
import ServiceLifecycle
import Synchronization

/// Settings of the deliverer that are not configuration keys: tests compress them.
public struct DelivererOptions: Sendable {
    /// The least wait after a 429 or a timeout. Default: 60 s.
    public var throttledMinimumWait: Duration = .seconds(60)
    /// Failed attempts in a row that open an endpoint's circuit breaker. Default: 5.
    public var breakerThreshold = 5
    /// How long an open breaker diverts new deliveries before it lets a probe through. Default: 30 s.
    public var breakerCooldown: Duration = .seconds(30)
    /// Connection (TCP and TLS) timeout, at most `delivery.timeout`. Default: 10 s.
    public var connectTimeout: Duration = .seconds(10)
    /// The shortest and longest pause a `Retry-After` on a 429 or 503 sets for its endpoint. Default: 1 s and 5 min (an endpoint
    /// asking for longer is asked again after 5 minutes).
    public var minimumPause: Int64 = 1_000
    public var maximumPause: Int64 = 300_000
    /// Returns at the given wall-clock time (Unix ms) or later: the timer that starts deliveries held back
    /// by an endpoint's rate or pause. Tests with an injected `now` inject this too.
    public var sleepUntil: @Sendable (Int64) async -> Void = { at in
        let wait = at - wallClockMilliseconds()
        try? await Task.sleep(for: .milliseconds(max(1, wait)))
    }
    /// Uniform in 0..<1, for the retry jitter.
    public var random: @Sendable () -> Double = { Double.random(in: 0..<1) }
    /// The wall clock, Unix milliseconds.
    public var now: @Sendable () -> Int64 = { wallClockMilliseconds() }

    public init() {}
}

/// Why the deliverer cannot start: an endpoint's secrets.
public struct DelivererSetupError: Error, Sendable, CustomStringConvertible {
    public var key: String
    public var message: String
    public var description: String { "\(key): \(message)" }
}
