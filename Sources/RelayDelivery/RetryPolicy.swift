import Foundation
import RelayCore

/// When a failed delivery is tried again, as Svix does it (docs/delivery.md):
///
/// - after attempt `n` fails, the next attempt waits step `n` of the schedule, ±20% jitter; after the
///   last step the delivery is dead-lettered;
/// - a `Retry-After` (seconds or an HTTP date) is honoured within 1× to 2× of that wait;
/// - after a 429 or a timeout the wait is at least `throttledMinimumWait` (60 s).
public struct RetryPolicy: Sendable {
    public var schedule: [Duration]
    public var throttledMinimumWait: Duration
    /// Fraction of each step added or taken away at random. Default 0.2.
    public var jitter: Double

    /// The schedule's whole span (without jitter): how long after its first attempt a delivery may still
    /// be waiting before it is dead-lettered.
    public var spanMilliseconds: Int64 { schedule.reduce(0) { $0 + $1.wholeMilliseconds } }

    public init(schedule: [Duration], throttledMinimumWait: Duration = .seconds(60), jitter: Double = 0.2) {
        self.schedule = schedule
        self.throttledMinimumWait = throttledMinimumWait
        self.jitter = jitter
    }

    /// What one failed attempt looked like.
    public struct Failure: Sendable {
        public var status: Int?
        public var timedOut: Bool
        /// The response's `Retry-After`, in milliseconds from now.
        public var retryAfterMilliseconds: Int64?

        public init(status: Int?, timedOut: Bool = false, retryAfterMilliseconds: Int64? = nil) {
            self.status = status
            self.timedOut = timedOut
            self.retryAfterMilliseconds = retryAfterMilliseconds
        }
    }

    public enum Decision: Sendable, Equatable {
        /// Produce to retry step `step` (1-based), to be attempted `waitMilliseconds` from now.
        case retry(step: Int, waitMilliseconds: Int64)
        case deadLetter
    }

    /// The decision after attempt number `attempts` (1-based, counting this one) failed.
    /// `random` is uniform in 0..<1.
    public func next(afterAttempt attempts: Int, failure: Failure, random: Double) -> Decision {
        guard attempts >= 1, attempts <= schedule.count else { return .deadLetter }
        let step = Double(schedule[attempts - 1].wholeMilliseconds)
        let scheduled = step * (1 + jitter * (2 * random - 1))
        var wait = scheduled
        if let retryAfter = failure.retryAfterMilliseconds {
            wait = min(max(Double(retryAfter), scheduled), 2 * scheduled)
        }
        if failure.status == 429 || failure.timedOut {
            wait = max(wait, Double(throttledMinimumWait.wholeMilliseconds))
        }
        return .retry(step: attempts, waitMilliseconds: Int64(wait.rounded()))
    }

    /// The retry topic a wait goes to: the step's own, unless the wait is longer than that step can hold
    /// (after a 429, a timeout or a `Retry-After`); then the first later step at least that long. A
    /// consumer holds each topic's partitions at their head record until it is due, so a long wait at the
    /// head of a short step's topic would hold up every other endpoint's retries behind it.
    public func topicStep(forWait wait: Int64, from step: Int) -> Int {
        guard step >= 1, step <= schedule.count else { return max(1, min(step, schedule.count)) }
        var candidate = step
        while candidate < schedule.count, Double(schedule[candidate - 1].wholeMilliseconds) * (1 + jitter) < Double(wait) {
            candidate += 1
        }
        return candidate
    }
}
