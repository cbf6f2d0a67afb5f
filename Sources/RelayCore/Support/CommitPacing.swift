/// The shortest time between the starts of two group commits of one writer: the embedded log's
/// (`log.commitInterval`) and the local backend's state writes (`backend.commitInterval`).
///
/// A group-committing writer takes everything waiting when it gets to it. At a steady rate that is a write or
/// two a commit, and each commit costs about the same whatever it holds: its fsync (the kernel's writeback of
/// the WAL), the WAL's frame headers, waking the writer and every waiter. Commits that would start sooner than
/// the interval after the last one started wait for the rest of it, with the writes that come meanwhile. A
/// write that finds the writer idle for an interval is committed at once, so a quiet service adds no latency;
/// under load a write waits about the interval more at most. A caller that waits for each write before making
/// the next gets at most one write per interval, so N such callers N per interval. (The relay's Kafka
/// producer batches by waiting too, `linger.ms` 5: from each batch's first record, quiet or not.)
public struct CommitPacing: Sendable {
    /// 5 ms. In the end-to-end benchmark at 500 notifications/s, 3 ms took a tenth off the relay's CPU per
    /// notification, 6 ms a quarter, 10 ms a third; the p99 from POST to webhook rose about 5.5, 7 and 17 ms. At
    /// saturation, where commits already carry dozens of writes, none moved it beyond the VM's noise
    /// (docs/benchmarks.md, *Commit pacing*).
    public static let defaultInterval: Duration = .milliseconds(5)

    /// Zero: every commit starts as soon as there is something to commit.
    public let interval: Duration

    public init(interval: Duration) {
        self.interval = max(.zero, interval)
    }

    /// How long the next commit waits, if it must: nil when it may start now (nothing committed yet, or the
    /// interval since the last commit started is over).
    public func wait(after lastCommit: ContinuousClock.Instant?, now: ContinuousClock.Instant = .now) -> Duration? {
        guard interval > .zero, let lastCommit else { return nil }
        let left = lastCommit + interval - now
        return left > .zero ? left : nil
    }
}
