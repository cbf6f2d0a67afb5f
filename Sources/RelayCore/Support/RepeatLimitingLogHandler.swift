public import Logging
import Synchronization

/// Passes log lines to `upstream`, but at most `burst` identical lines (same label, level, message and
/// metadata) per `window`; the rest are counted, and the next identical line after the window says how
/// many were left out (`log.suppressed`). A broker that stays unreachable, or a flood of failing
/// connections, once wrote 2 GB of the same few lines in a minute and filled the disk.
public struct RepeatLimitingLogHandler: LogHandler {
    /// Counts shared by every handler of the process (each `Logger` copies its handler).
    public final class Limiter: Sendable {
        struct Entry {
            var windowStart: ContinuousClock.Instant
            var passed: Int
            var suppressed: Int
        }

        let burst: Int
        let window: Duration
        let now: @Sendable () -> ContinuousClock.Instant
        /// By the line's hash (`key(...)`): two different lines that collide share a count, with a chance of
        /// about one in 2^64 per pair; building the line's whole text as the key cost more than writing it.
        private let entries = Mutex<[Int: Entry]>([:])
        /// More distinct lines than this within a window forget the oldest counts (bounded memory).
        private let maximumEntries = 4096

        public init(burst: Int = 5, window: Duration = .seconds(10), now: @escaping @Sendable () -> ContinuousClock.Instant = { .now }) {
            self.burst = burst
            self.window = window
            self.now = now
        }

        /// nil: leave the line out. Otherwise log it, noting how many identical lines were left out before.
        func admit(_ key: Int) -> Int? {
            let now = self.now()
            return entries.withLock { entries in
                if entries.count >= maximumEntries, entries[key] == nil {
                    entries = entries.filter { now - $0.value.windowStart < window }
                    if entries.count >= maximumEntries { entries.removeAll() }
                }
                var entry = entries[key] ?? Entry(windowStart: now, passed: 0, suppressed: 0)
                if now - entry.windowStart >= window {
                    let suppressed = entry.suppressed
                    entry = Entry(windowStart: now, passed: 1, suppressed: 0)
                    entries[key] = entry
                    return suppressed
                }
                if entry.passed < burst {
                    entry.passed += 1
                    entries[key] = entry
                    return 0
                }
                entry.suppressed += 1
                entries[key] = entry
                return nil
            }
        }
    }

    private var upstream: any LogHandler
    private let label: String
    private let limiter: Limiter

    public init(label: String, upstream: any LogHandler, limiter: Limiter) {
        self.label = label
        self.upstream = upstream
        self.limiter = limiter
    }

    public func log(event: LogEvent) {
        // The line as it will be written: the logger's metadata (a store, an app, a consumer group), the
        // provider's, the event's and its error all tell two lines with the same message apart.
        var metadata = upstream.metadata
        if let provider = upstream.metadataProvider { metadata.merge(provider.get()) { $1 } }
        if let own = event.metadata { metadata.merge(own) { $1 } }
        guard let suppressed = limiter.admit(Self.key(label: label, event: event, metadata: metadata)) else { return }
        var event = event
        if suppressed > 0 {
            event.metadata = (event.metadata ?? [:]).merging(["log.suppressed": "\(suppressed)"]) { $1 }
        }
        upstream.log(event: event)
    }

    /// The line's identity: its label, level, message, metadata (in any order) and error, hashed.
    static func key(label: String, event: LogEvent, metadata: Logger.Metadata) -> Int {
        var hasher = Hasher()
        hasher.combine(label)
        hasher.combine(event.level)
        hasher.combine(event.message.description)
        // Each entry hashed alone and the hashes added: the same set of entries gives the same sum in any order.
        var entries = 0
        for (name, value) in metadata {
            var entry = Hasher()
            entry.combine(name)
            entry.combine(value.description)
            entries &+= entry.finalize()
        }
        hasher.combine(metadata.count)
        hasher.combine(entries)
        if let error = event.error { hasher.combine("\(error)") }
        return hasher.finalize()
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { upstream[metadataKey: key] }
        set { upstream[metadataKey: key] = newValue }
    }

    public var metadata: Logger.Metadata {
        get { upstream.metadata }
        set { upstream.metadata = newValue }
    }

    public var logLevel: Logger.Level {
        get { upstream.logLevel }
        set { upstream.logLevel = newValue }
    }

    public var metadataProvider: Logger.MetadataProvider? {
        get { upstream.metadataProvider }
        set { upstream.metadataProvider = newValue }
    }
}
