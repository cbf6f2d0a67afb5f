import RelayCore
import Synchronization
import Testing

/// The per-client token bucket, on a clock the test steps (no sleeping).
@Suite struct ClientRateLimiterTests {
    final class Clock: Sendable {
        let nanoseconds = Mutex<UInt64>(1_000_000_000)
        func advance(milliseconds: UInt64) { nanoseconds.withLock { $0 += milliseconds * 1_000_000 } }
        var now: @Sendable () -> UInt64 { { self.nanoseconds.withLock { $0 } } }
    }

    @Test func aClientGetsItsBurstThenItsRateAndOthersAreNotAffected() {
        let clock = Clock()
        let limiter = ClientRateLimiter(ratePerSecond: 2, burst: 3, now: clock.now)
        for _ in 0..<3 { #expect(limiter.take("10.0.0.1") == .allowed) }
        // The bucket is empty: the next token comes in half a second, which is 1 s rounded up.
        #expect(limiter.take("10.0.0.1") == .limited(retryAfterSeconds: 1))
        // A refused request takes nothing: it stays refused until a token has come.
        clock.advance(milliseconds: 400)
        #expect(limiter.take("10.0.0.1") == .limited(retryAfterSeconds: 1))
        // Another client has its own bucket.
        #expect(limiter.take("10.0.0.2") == .allowed)
        clock.advance(milliseconds: 100)
        #expect(limiter.take("10.0.0.1") == .allowed)
        #expect(limiter.take("10.0.0.1") == .limited(retryAfterSeconds: 1))
        // Idle long enough, the bucket is full again, never fuller than the burst.
        clock.advance(milliseconds: 60_000)
        for _ in 0..<3 { #expect(limiter.take("10.0.0.1") == .allowed) }
        #expect(limiter.take("10.0.0.1") != .allowed)
    }

    @Test func retryAfterSaysWhenTheNextRequestIsAllowed() {
        let clock = Clock()
        let limiter = ClientRateLimiter(ratePerSecond: 0.25, burst: 1, now: clock.now)
        #expect(limiter.take("c") == .allowed)
        #expect(limiter.take("c") == .limited(retryAfterSeconds: 4))
        clock.advance(milliseconds: 2_500)
        #expect(limiter.take("c") == .limited(retryAfterSeconds: 2))
        clock.advance(milliseconds: 1_000)
        #expect(limiter.take("c") == .limited(retryAfterSeconds: 1))
        clock.advance(milliseconds: 500)
        #expect(limiter.take("c") == .allowed)
    }

    /// However small the rate, the wait is stated (at most a day), never a trap converting it.
    @Test func aTinyRateWaitsAtMostADay() {
        let limiter = ClientRateLimiter(ratePerSecond: 1e-20, burst: 1, now: { 5 })
        #expect(limiter.take("c") == .allowed)
        #expect(limiter.take("c") == .limited(retryAfterSeconds: 86_400))
    }

    @Test func aRateOfZeroTurnsTheLimitOff() {
        let limiter = ClientRateLimiter(ratePerSecond: 0, burst: 1, now: { 0 })
        for _ in 0..<1_000 { #expect(limiter.take("c") == .allowed) }
        #expect(limiter.trackedClients == 0)
    }

    /// A flood from many addresses cannot grow the limiter without bound; clients that are still
    /// limited stay limited while idle ones are forgotten.
    @Test func theBucketsKeptAreBounded() {
        let clock = Clock()
        let limiter = ClientRateLimiter(ratePerSecond: 1, burst: 2, maxClients: 100, now: clock.now)
        #expect(limiter.take("abuser") == .allowed)
        #expect(limiter.take("abuser") == .allowed)
        #expect(limiter.take("abuser") != .allowed)
        for index in 0..<99 { _ = limiter.take("idle-\(index)") }
        #expect(limiter.trackedClients == 100)
        // The idle clients' buckets refill; the abuser keeps draining its own.
        clock.advance(milliseconds: 1_500)
        #expect(limiter.take("abuser") == .allowed)
        #expect(limiter.take("newcomer") == .allowed)
        #expect(limiter.trackedClients <= 100)
        #expect(limiter.take("abuser") != .allowed, "a full limiter forgot a client that is still limited")
        // When every kept bucket is still draining, all are dropped rather than growing past the bound.
        for index in 0..<1_000 { _ = limiter.take("flood-\(index)") }
        #expect(limiter.trackedClients <= 100)
    }
}
