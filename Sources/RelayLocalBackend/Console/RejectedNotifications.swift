public import RelayCore
import Synchronization

/// A notification the worker rejected, as the console shows it: where it is on the rejected topic, its
/// store and app, the reason code and the bounded detail (never the payload).
public struct RejectedNotification: Sendable, Equatable {
    public var position: String
    public var store: String
    public var app: String
    public var reason: String
    public var detail: String
    /// When the ingest received it (Unix ms), else when it was rejected.
    public var receivedAt: Int64?

    public init(position: String, store: String, app: String, reason: String, detail: String, receivedAt: Int64?) {
        self.position = position
        self.store = store
        self.app = app
        self.reason = reason
        self.detail = detail
        self.receivedAt = receivedAt
    }

    /// Reads a record of the rejected topic; nil without a reason header.
    public init?(_ record: ConsumedRecord) {
        guard let reason = record.headers.first(named: RelayHeaderName.rejectReason)?.stringValue else { return nil }
        self.init(
            position: "\(record.topic):\(record.partition):\(record.offset)",
            store: record.headers.first(named: RelayHeaderName.store)?.stringValue ?? "unknown",
            app: record.headers.first(named: RelayHeaderName.app)?.stringValue ?? "unknown", reason: reason,
            detail: String((record.headers.first(named: RelayHeaderName.rejectDetail)?.stringValue ?? "").prefix(500)),
            receivedAt: record.headers.first(named: RelayHeaderName.receivedAt)?.stringValue.flatMap { Int64($0) } ?? record.timestampMilliseconds)
    }
}

/// The latest rejected notifications, read from the rejected topic's end (RelayApp wires it to the log);
/// nil in a backend without the log. A read is kept for 10 seconds, so reloading the page does not open a
/// reader on the log each time.
public struct RejectedNotifications: Sendable {
    public typealias Recent = @Sendable (_ limit: Int) async throws -> [RejectedNotification]
    private let read: Recent
    private let cache = Cache()
    private let clock: ContinuousClock = ContinuousClock()

    public init(recent: @escaping Recent) {
        self.read = recent
    }

    private final class Cache: Sendable {
        let value = Mutex<(at: ContinuousClock.Instant, limit: Int, found: [RejectedNotification])?>(nil)
    }

    func recent(_ limit: Int) async throws -> [RejectedNotification] {
        let now = clock.now
        if let cached = cache.value.withLock({ $0 }), cached.limit == limit, now - cached.at < .seconds(10) { return cached.found }
        let found = try await read(limit)
        cache.value.withLock { $0 = (now, limit, found) }
        return found
    }
}
