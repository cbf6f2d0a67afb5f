public import CoreMetrics
public import Logging
public import RelayConfig
public import RelayCore
public import RelayVerification

/// The worker's stages for one raw notification record, in order:
///
/// 1. **Envelope:** read the relay headers (`relay-store`, `relay-app`, `relay-received-at`) of
///    whichever producer wrote the record.
/// 2. **Verify** (OpenSSL): accepted, or rejected to `relay.notifications.rejected` with the original
///    key, value and headers plus `relay-reject-reason` and `relay-reject-detail`. A record that is not
///    a raw notification at all (stage 1 failed) is rejected as `malformed` the same way.
/// 3. Normalize into standardized events; update entitlements through the backend (next issue).
/// 4. Fan out: the events to `relay.events`, one delivery per matching endpoint to `relay.deliveries`.
///
/// `process` returns only when what the record caused is durable (the rejected record acknowledged),
/// so the worker may then store its offset. It throws when a verdict cannot be reached yet (Google's
/// keys unreachable) or the rejected topic did not acknowledge: the worker retries the record.
public struct NotificationPipeline: NotificationProcessor {
    private let configuration: RelayConfiguration
    private let verifier: NotificationVerifier
    private let producer: any RecordProducer
    private let logger: Logger
    private let metrics: any MetricsFactory

    public init(
        configuration: RelayConfiguration, verifier: NotificationVerifier, producer: any RecordProducer, logger: Logger,
        metrics: any MetricsFactory
    ) {
        self.configuration = configuration
        self.verifier = verifier
        self.producer = producer
        self.logger = logger
        self.metrics = metrics
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
        let appLabel = configuration.app(notification.app) != nil ? notification.app : "unknown"
        let verdict = try await verifier.verify(notification)
        switch verdict {
        case .accepted(let verified):
            Counter(
                label: "relay_notifications_accepted_total",
                dimensions: [("store", notification.store.rawValue), ("app", appLabel)], factory: metrics
            ).increment()
            logger.info(
                "notification verified",
                metadata: [
                    LogKey.notificationStore: "\(notification.store.rawValue)", LogKey.notificationApp: "\(appLabel)",
                    "notification.type": "\(verified.type ?? "-")", "notification.id": "\(verified.notificationId ?? "-")",
                    LogKey.kafkaPartition: "\(record.partition)", LogKey.kafkaOffset: "\(record.offset)",
                ])
        case .rejected(let rejection):
            try await reject(record, store: notification.store.rawValue, app: appLabel, rejection)
        }
    }

    /// Produces the record, as it came, to the rejected topic with the reason, and awaits the ack.
    private func reject(_ record: ConsumedRecord, store: String, app: String, _ rejection: Rejection) async throws {
        var headers = record.headers.filter { $0.name != RelayHeaderName.rejectReason && $0.name != RelayHeaderName.rejectDetail }
        headers.append(RecordHeader(name: RelayHeaderName.rejectReason, value: rejection.reason.rawValue))
        headers.append(RecordHeader(name: RelayHeaderName.rejectDetail, value: rejection.detail))
        let rejected = OutgoingRecord(topic: configuration.kafka.topics.rejected, key: record.key, value: record.value, headers: headers)
        _ = try await producer.produce(rejected)
        // Label values stay bounded: known stores, configured apps, the fixed reason codes.
        let storeLabel = Store(rawValue: store) != nil ? store : "unknown"
        Counter(
            label: "relay_notifications_rejected_total",
            dimensions: [("store", storeLabel), ("app", app), ("reason", rejection.reason.rawValue)], factory: metrics
        ).increment()
        logger.warning(
            "notification rejected",
            metadata: [
                LogKey.notificationStore: "\(storeLabel)", LogKey.notificationApp: "\(app)",
                "reject.reason": "\(rejection.reason.rawValue)", "reject.detail": "\(rejection.detail)",
                LogKey.kafkaTopic: "\(record.topic)", LogKey.kafkaPartition: "\(record.partition)", LogKey.kafkaOffset: "\(record.offset)",
            ])
    }
}
