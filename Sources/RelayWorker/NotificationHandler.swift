public import CoreMetrics
public import Logging
public import RelayConfig
public import RelayCore
public import RelayNormalization
public import RelayVerification

/// The worker's stages for one raw notification record, in order:
///
/// 1. **Envelope:** read the relay headers (`relay-store`, `relay-app`, `relay-received-at`) of
///    whichever producer wrote the record.
/// 2. **Verify** (OpenSSL): accepted, or rejected to `relay.notifications.rejected` with the original
///    key, value and headers plus `relay-reject-reason` and `relay-reject-detail`. A record that is not
///    a raw notification at all (stage 1 failed) is rejected as `malformed` the same way.
/// 3. Normalize into standardized events, updating the subscription's state in the backend
///    (`SubscriptionUpdater`). A Google purchase the Play Developer API does not know is rejected like a forged one.
/// 4. Produce the events to `relay.events` (key: the subscription's subject), and for each event one
///    delivery record per matching endpoint to `relay.deliveries`, all at once, each acknowledged. A
///    record with `relay-historical: true` gives its events records the same header; one with
///    `relay-deliver: false` gets no delivery records.
/// 5. An Apple `CONSUMPTION_REQUEST` of an app with `apple.consumption` is answered to Apple
///    (`ConsumptionResponder`), after its events are durable.
///
/// `process` returns only when what the record caused is durable (events or the rejected record
/// acknowledged, state written), so the worker may then store its offset. It throws when that cannot
/// happen yet (Google's keys or the backend unreachable, the log not acknowledging): the worker retries
/// the record, and the repeat yields the same event ids.
public struct NotificationHandler: WorkerRecordHandler {
    private let topics: RelayConfiguration.Topics
    private let appKeys: Set<String>
    private let evaluator: NotificationEvaluator
    private let fanOut: DeliveryFanOut
    private let producer: any RecordProducer
    private let logger: Logger
    private let accepted: LabeledCounters
    private let rejectedCounter: LabeledCounters
    private let consumption: ConsumptionResponder?

    /// The pipeline of `configuration`'s topics, apps and endpoints.
    /// - Parameter consumption: answers CONSUMPTION_REQUESTs; nil answers none.
    public init(
        configuration: RelayConfiguration, verifier: NotificationVerifier, normalizer: SubscriptionUpdater, producer: any RecordProducer,
        logger: Logger, metrics: any MetricsFactory, consumption: ConsumptionResponder? = nil
    ) {
        self.init(
            topics: configuration.topics, apps: configuration.apps, endpoints: configuration.endpoints, verifier: verifier,
            normalizer: normalizer, producer: producer, logger: logger, metrics: metrics, consumption: consumption)
    }

    public init(
        topics: RelayConfiguration.Topics, apps: [RelayConfiguration.App], endpoints: [RelayConfiguration.Endpoint],
        verifier: NotificationVerifier, normalizer: SubscriptionUpdater, producer: any RecordProducer, logger: Logger, metrics: any MetricsFactory,
        consumption: ConsumptionResponder? = nil
    ) {
        self.consumption = consumption
        self.topics = topics
        self.appKeys = Set(apps.map(\.key))
        self.evaluator = NotificationEvaluator(verifier: verifier, normalizer: normalizer)
        self.fanOut = DeliveryFanOut(endpoints: endpoints, topic: topics.deliveries)
        self.producer = producer
        self.logger = logger
        self.accepted = LabeledCounters(label: "relay_notifications_accepted_total", factory: metrics)
        self.rejectedCounter = LabeledCounters(label: "relay_notifications_rejected_total", factory: metrics)
    }

    public func process(_ record: ConsumedRecord) async throws {
        let notification: RawNotification
        do {
            notification = try RawNotification(record: record)
        } catch {
            // Not a relay record (a foreign producer without our headers): nothing is silently skipped.
            try await reject(record, store: record.headers.first(named: RelayHeaderName.store)?.stringValue ?? "unknown", app: "unknown",
                             Rejection(.malformed, "not a raw notification record: \(error)"))
            return
        }
        // App keys are bounded by the configuration; anything else is one label value.
        let appLabel = appKeys.contains(notification.app) ? notification.app : "unknown"
        // Unavailable (Google's keys, the backend, a store API): thrown, so the worker tries the record again.
        switch try await evaluator.evaluate(notification) {
        case .rejected(let rejection, let verified):
            if verified != nil { accepted.increment([("store", notification.store.rawValue), ("app", appLabel)]) }
            try await reject(record, store: notification.store.rawValue, app: appLabel, rejection)
        case .accepted(let verified, let events):
            accepted.increment([("store", notification.store.rawValue), ("app", appLabel)])
            // Every event and delivery record queued in order (one key's records keep theirs), the
            // acknowledgements awaited together: one round trip to the log per notification, not one per record.
            var outgoing: [OutgoingRecord] = []
            for event in events {
                var headers = [
                    RecordHeader(name: RelayHeaderName.eventId, value: event.id),
                    RecordHeader(name: RelayHeaderName.eventType, value: event.type.rawValue),
                    RecordHeader(name: RelayHeaderName.app, value: notification.app),
                ]
                // An import's events are recorded as historical (EventRecorder reads the header).
                if notification.historical { headers.append(RecordHeader(name: RelayHeaderName.historical, value: "true")) }
                // Encoded once: the events record and every delivery carry the same bytes.
                let body = event.body
                outgoing.append(OutgoingRecord(topic: topics.events, key: Array(event.subject.utf8), value: body, headers: headers))
                // `relay-deliver: false` (an import without --deliver): recorded, never sent.
                if notification.deliver { outgoing.append(contentsOf: fanOut.records(for: event, app: notification.app, body: body)) }
            }
            _ = try await producer.produce(outgoing)
            // Debug, not info: at thousands a second one line per notification is a flood (and 4% of the
            // relay's CPU); the counters and the events routes say what was processed.
            logger.debug(
                "notification normalized",
                metadata: [
                    LogKey.notificationStore: "\(notification.store.rawValue)", LogKey.notificationApp: "\(appLabel)",
                    LogKey.notificationType: "\(verified.type ?? "-")", LogKey.notificationId: "\(verified.notificationId ?? "-")",
                    "events": "\(events.map(\.type.rawValue).joined(separator: ","))",
                    LogKey.logPartition: "\(record.partition)", LogKey.logOffset: "\(record.offset)",
                ])
            // After the events are durable: a retry for an unreachable Apple repeats only what is idempotent.
            try await consumption?.answer(verified)
        }
    }

    /// Produces the record, as it came, to the rejected topic with the reason, and awaits the ack.
    private func reject(_ record: ConsumedRecord, store: String, app: String, _ rejection: Rejection) async throws {
        var headers = record.headers.filter { $0.name != RelayHeaderName.rejectReason && $0.name != RelayHeaderName.rejectDetail }
        headers.append(RecordHeader(name: RelayHeaderName.rejectReason, value: rejection.reason.rawValue))
        headers.append(RecordHeader(name: RelayHeaderName.rejectDetail, value: rejection.detail))
        let rejected = OutgoingRecord(topic: topics.rejected, key: record.key, value: record.value, headers: headers)
        _ = try await producer.produce(rejected)
        // Label values stay bounded: known stores, configured apps, the fixed reason codes.
        let storeLabel = Store(rawValue: store) != nil ? store : "unknown"
        rejectedCounter.increment([("store", storeLabel), ("app", app), ("reason", rejection.reason.rawValue)])
        logger.warning(
            "notification rejected",
            metadata: [
                LogKey.notificationStore: "\(storeLabel)", LogKey.notificationApp: "\(app)",
                "reject.reason": "\(rejection.reason.rawValue)", "reject.detail": "\(rejection.detail)",
                LogKey.logTopic: "\(record.topic)", LogKey.logPartition: "\(record.partition)", LogKey.logOffset: "\(record.offset)",
            ])
    }
}
