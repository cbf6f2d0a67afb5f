import Foundation
public import Logging
public import RelayConfig
public import RelayCore
public import RelayHTTPClient
import RelayStripe

/// `revenue-relay recover stripe`: Stripe events this deployment never processed (an outage, a webhook
/// endpoint disabled for a while), re-ingested through the normal path. Like the App Store commands it
/// writes nothing itself: it appends raw notification records (`relay-source: stripe-api`,
/// `{"eventId", "type"}`) to `relay.notifications`, keyed by the event's subscription as the ingest keys
/// Stripe's webhooks, and the worker reads each event from Stripe's API with the app's key and applies it
/// as the webhook it stands for: the same ids, state rules and events, delivered as missed events.
public struct StripeHistoryCommands: Sendable {
    public typealias Failure = CommandFailure

    /// The days of events Stripe lists (`GET /v1/events`).
    public static let eventDays: Int64 = 30

    public let app: RelayConfiguration.App
    let client: any StripeCharges
    let producer: any RecordProducer
    let topic: String
    let backend: HistoryBackend
    let now: @Sendable () -> Int64
    /// How the commands wait out Stripe's rate limits and outages.
    public var pacing = HistoryLoop.Pacing.standard

    /// - Parameters:
    ///   - appKey: the `apps[].key` whose `stripe.api` is read.
    ///   - producer: appends to the configured log (`ToolLog`, or a running relay's).
    ///   - backendURL: the backend instead of `backend.url`.
    ///   - client: Stripe's API (default: the configured `stripe.api`).
    public init(
        configuration: RelayConfiguration, appKey: String, producer: any RecordProducer, backendURL: String? = nil,
        http: HTTPClient = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(30), maxConcurrentTransfers: 8), logger: Logger,
        now: (@Sendable () -> Int64)? = nil
    ) throws(Failure) {
        let (app, index) = try HistoryRun.app(configuration, key: appKey)
        guard let stripe = app.stripe else {
            throw Failure(.configuration, "app \(appKey) has no stripe section (apps[\(index)].stripe); the Stripe commands need one")
        }
        guard let api = stripe.api else {
            throw Failure(
                .configuration,
                "app \(appKey) has no Stripe API key: set apps[\(index)].stripe.api {secretKey} to a restricted key that may read events")
        }
        self.backend = try HistoryRun.backend(configuration, url: backendURL, http: http, logger: logger)
        self.app = app
        self.client = StripeClient(configuration: api, http: http, logger: logger)
        self.producer = producer
        self.topic = configuration.topics.notifications
        self.now = HistoryRun.clock(now)
    }

    /// What the recover command did.
    public typealias RecoverSummary = RecoveredSummary

    /// Lists the events Stripe created in [`since`, `until`) (Unix ms; `until` nil: now) of the types the
    /// relay maps, and appends each one the relay never processed, oldest first. Processed means events
    /// recorded for its id, or its id among its subscription's remembered notifications (an event that
    /// changed a state without events). Run again, it appends nothing more once the worker has caught up.
    public func recover(since: Int64, until: Int64?, progress: @escaping @Sendable (String) -> Void = { _ in }) async throws(Failure) -> RecoverSummary {
        let end = try HistoryRun.window(since: since, until: until, now: now(), days: Self.eventDays, what: "events Stripe keeps")
        var summary = RecoverSummary()
        // Stripe lists newest first: the missed ones are gathered, then appended in the order they happened.
        var missed: [(id: String, type: String, subject: String)] = []
        // Each subscription's state is read once a run, however many of its events are listed.
        var states: [String: SubscriptionState?] = [:]
        let loop = HistoryLoop(pacing: pacing, progress: progress)
        try await loop.pages("the events list") { cursor throws(StoreAPIError) in
            let page = try await client.events(createdFrom: since / 1000, createdBefore: (end + 999) / 1000, types: StripeEventTypes.mapped, startingAfter: cursor)
            return (page, page["has_more"]?.boolValue == true ? page["data"]?.arrayValue?.last?["id"]?.stringValue : nil)
        } failure: { error in
            Self.failure(error, done: "nothing was appended yet")
        } each: { page, number throws(Failure) in
            for event in page["data"]?.arrayValue ?? [] {
                guard let id = event["id"]?.stringValue, let type = event["type"]?.stringValue else { continue }
                summary.found += 1
                let subject = NotificationSubject.extract(store: .stripe, body: event.serialized())
                if try await processed(id, subject: subject, states: &states) {
                    summary.alreadyProcessed += 1
                } else {
                    missed.append((id, type, subject))
                }
            }
            loop.report(summary.found, "events", "page \(number), \(summary.alreadyProcessed) already processed, \(missed.count) missed")
        }
        let records = missed.reversed().map { event in
            RawNotification(
                store: .stripe, app: app.key, receivedAtMilliseconds: self.now(),
                body: JSON.object(["eventId": .string(event.id), "type": .string(event.type), "subject": .string(event.subject)]).serialized(), requestHeaders: [:],
                source: RawNotification.stripeAPISource
            ).record(topic: topic, subject: event.subject)
        }
        for batch in stride(from: 0, to: records.count, by: 500).map({ Array(records[$0..<min($0 + 500, records.count)]) }) {
            try await HistoryRun.append(batch, producer: producer, topic: topic, rerun: HistoryRun.recoverAgain)
            summary.reingested += batch.count
        }
        return summary
    }

    /// Whether the relay processed the event: events recorded for its id, or its id remembered by its
    /// subscription's state.
    private func processed(_ id: String, subject: String, states: inout [String: SubscriptionState?]) async throws(Failure) -> Bool {
        if try await backend.hasEvents(notificationId: id) { return true }
        guard subject.hasPrefix("sub_") || subject.hasPrefix("pi_") else { return false }
        if states[subject] == nil { states[subject] = .some(try await backend.subscription(store: .stripe, id: subject)) }
        return states[subject]??.recentNotifications.contains { $0.id == id } ?? false
    }

    static func failure(_ error: StoreAPIError, done: String) -> Failure {
        switch error.kind {
        case .configuration: Failure(.configuration, error.message)
        case .rejected: Failure(.configuration, "Stripe refused the request: \(error.message)")
        default: Failure(.unavailable, "reading Stripe's events failed (\(error.message)); \(done); run the same command again")
        }
    }
}
