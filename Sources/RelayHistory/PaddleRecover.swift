import Foundation
public import Logging
public import RelayConfig
public import RelayCore
public import RelayHTTPClient
import RelayPaddle

/// `revenue-relay recover paddle`: Paddle notifications whose events this deployment never processed (an
/// outage longer than Paddle's retries), sent again by Paddle itself: the command lists the notifications
/// Paddle sent in the period and asks Paddle to replay the first of each missed event
/// (`POST /notifications/{id}/replay`). Paddle signs and sends it to the ingest like any notification, so
/// it goes through the unchanged path: verified by its signature, recorded, applied once (its `event_id` is
/// the original's, so the relay recognizes a repeat).
public struct PaddleHistoryCommands: Sendable {
    public typealias Failure = CommandFailure

    public let app: RelayConfiguration.App
    let appIndex: Int
    /// The destination whose notifications `recover` lists and replays.
    let settingId: String?
    let client: any PaddleReads
    let backend: HistoryBackend
    /// Where `reconcile` and `import` append (`recover` appends nothing: Paddle sends the replays).
    let producer: (any RecordProducer)?
    let topic: String
    let now: @Sendable () -> Int64
    /// How the commands wait out Paddle's rate limits and outages.
    public var pacing = HistoryLoop.Pacing.standard

    public init(
        configuration: RelayConfiguration, appKey: String, producer: (any RecordProducer)? = nil, backendURL: String? = nil,
        http: HTTPClient = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(30), maxConcurrentTransfers: 8), logger: Logger,
        now: (@Sendable () -> Int64)? = nil
    ) throws(Failure) {
        let (app, index) = try HistoryRun.app(configuration, key: appKey)
        guard let paddle = app.paddle else {
            throw Failure(.configuration, "app \(appKey) has no paddle section (apps[\(index)].paddle); the Paddle commands need one")
        }
        guard let api = paddle.api else {
            throw Failure(
                .configuration,
                "app \(appKey) has no Paddle API key: set apps[\(index)].paddle.api {apiKey} to a key that may read subscriptions, transactions and notifications")
        }
        self.backend = try HistoryRun.backend(configuration, url: backendURL, http: http, logger: logger)
        self.settingId = api.notificationSettingId
        self.appIndex = index
        self.producer = producer
        self.topic = configuration.topics.notifications
        self.app = app
        self.client = PaddleClient(configuration: api, http: http, logger: logger)
        self.now = HistoryRun.clock(now)
    }

    /// What `recover paddle` did.
    public struct RecoverSummary: Sendable, Equatable {
        /// Events (of the types the relay maps) Paddle notified in the period.
        public var found = 0
        /// Of those, events the relay already processed.
        public var alreadyProcessed = 0
        /// Notifications Paddle was asked to send again.
        public var replayed = 0
        /// Notifications Paddle refused to replay (the summary says; the run goes on).
        public var refused = 0

        public init(found: Int = 0, alreadyProcessed: Int = 0, replayed: Int = 0, refused: Int = 0) {
            self.found = found
            self.alreadyProcessed = alreadyProcessed
            self.replayed = replayed
            self.refused = refused
        }
    }

    /// Lists the notifications of [`since`, `until`) (Unix ms; `until` nil: now); for each event of a type
    /// the relay maps that it never processed (no events recorded for its `event_id`, and its subscription's
    /// state does not remember it), asks Paddle to replay its first notification, oldest first. Paddle sends
    /// replays asynchronously: the summary counts requests, and a run right after may find them unprocessed yet.
    public func recover(since: Int64, until: Int64?, progress: @escaping @Sendable (String) -> Void = { _ in }) async throws(Failure) -> RecoverSummary {
        guard let settingId else {
            throw Failure(
                .configuration,
                "app \(app.key) names no notification destination: set apps[\(appIndex)].paddle.api.notificationSettingId to the ntfset_… that sends to the relay's ingest (replays go to it)")
        }
        let end = try HistoryRun.window(since: since, until: until, now: now(), days: nil, what: "notifications")
        var summary = RecoverSummary()
        var events: [String: (notification: String, occurredAt: String, subject: String)] = [:]
        let loop = HistoryLoop(pacing: pacing, progress: progress)
        try await loop.pages("the notifications list") { after throws(StoreAPIError) in
            let page = try await client.notifications(
                settingId: settingId, from: Timestamp.rfc3339(milliseconds: since), to: Timestamp.rfc3339(milliseconds: end), after: after)
            let more = page["meta"]?["pagination"]?["has_more"]?.boolValue == true
            return (page, more ? page["data"]?.arrayValue?.last?["id"]?.stringValue : nil)
        } failure: { error in
            Self.failure(error, done: "nothing was replayed yet")
        } each: { page, number throws(Failure) in
            for notification in page["data"]?.arrayValue ?? [] {
                guard let id = notification["id"]?.stringValue, let payload = notification["payload"],
                    let eventId = payload["event_id"]?.stringValue, PaddleEventTypes.mapped.contains(payload["event_type"]?.stringValue ?? "")
                else { continue }
                let occurred = payload["occurred_at"]?.stringValue ?? notification["occurred_at"]?.stringValue ?? ""
                // One notification a Paddle event: the first sent (retries and replays name the same event).
                if let known = events[eventId], known.occurredAt <= occurred, known.notification < id { continue }
                if events[eventId] == nil { summary.found += 1 }
                events[eventId] = (id, occurred, NotificationSubject.extract(store: .paddle, body: payload.serialized()))
            }
            loop.report(summary.found, "events", "page \(number)")
        }
        var missed: [(notification: String, occurredAt: String)] = []
        // Each subscription's state is read once a run, however many of its events are listed.
        var states: [String: SubscriptionState?] = [:]
        for (eventId, notification) in events {
            var processed = false
            if notification.subject.hasPrefix("sub_") || notification.subject.hasPrefix("txn_") {
                if states[notification.subject] == nil {
                    states[notification.subject] = .some(try await backend.subscription(store: .paddle, id: notification.subject))
                }
                processed = states[notification.subject]??.recentNotifications.contains { $0.id == eventId } ?? false
            }
            if !processed { processed = try await backend.hasEvents(notificationId: eventId) }
            if processed {
                summary.alreadyProcessed += 1
            } else {
                missed.append((notification.notification, notification.occurredAt))
            }
        }
        for notification in missed.sorted(by: { ($0.occurredAt, $0.notification) < ($1.occurredAt, $1.notification) }) {
            do throws(StoreAPIError) {
                _ = try await loop.call("replaying a notification") { () async throws(StoreAPIError) in
                    try await client.replayNotification(notification.notification)
                }
            } catch {
                // The key refused, or Paddle unreachable: stop. Paddle refusing this one notification: go on.
                guard error.kind == .rejected, error.status != 401, error.status != 403 else {
                    throw Self.failure(error, done: "\(summary.replayed) notifications were replayed before")
                }
                summary.refused += 1
                progress("Paddle refused to replay \(notification.notification): \(error.message)")
                continue
            }
            summary.replayed += 1
            loop.report(summary.replayed, of: missed.count, "replayed", "")
        }
        return summary
    }

    static func failure(_ error: StoreAPIError, done: String) -> Failure {
        switch error.kind {
        case .configuration: Failure(.configuration, error.message)
        case .rejected: Failure(.configuration, "Paddle refused the request: \(error.message)")
        default: Failure(.unavailable, "the Paddle API failed (\(error.message)); \(done); run the same command again")
        }
    }
}
