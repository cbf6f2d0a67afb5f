public import CoreMetrics
public import Logging
public import RelayConfig
public import RelayCore

/// The worker's stages for one raw notification record, in order:
///
/// 1. **Envelope** (here): read the relay headers (`relay-store`, `relay-app`, `relay-received-at`)
///    of whichever producer wrote the record, and observe it (log and count by store and app).
/// 2. Verify (OpenSSL): accepted, or rejected to `relay.notifications.rejected` with a reason.
/// 3. Normalize into standardized events; update entitlements through the backend.
/// 4. Fan out: the events to `relay.events`, one delivery per matching endpoint to `relay.deliveries`.
///
/// Stages 2 to 4 arrive with their issues; each is a step in `process`, and the record is done only
/// when the last durable step returned.
public struct NotificationPipeline: NotificationProcessor {
    private let configuration: RelayConfiguration
    private let logger: Logger
    private let metrics: any MetricsFactory

    public init(configuration: RelayConfiguration, logger: Logger, metrics: any MetricsFactory) {
        self.configuration = configuration
        self.logger = logger
        self.metrics = metrics
    }

    public func process(_ record: ConsumedRecord) async throws {
        let notification: RawNotification
        do {
            notification = try RawNotification(record: record)
        } catch {
            // Not a relay record (a foreign producer without our headers). Verification will route these
            // to the rejected topic; until then they are counted and logged, never silently skipped.
            Counter(label: "relay_worker_invalid_records_total", dimensions: [], factory: metrics).increment()
            logger.warning(
                "record is not a raw notification",
                metadata: [
                    LogKey.kafkaTopic: "\(record.topic)", LogKey.kafkaPartition: "\(record.partition)",
                    LogKey.kafkaOffset: "\(record.offset)", LogKey.error: "\(error)",
                ])
            return
        }
        // App keys are bounded by the configuration; anything else is one label value.
        let appLabel = configuration.app(notification.app) != nil ? notification.app : "unknown"
        Counter(
            label: "relay_worker_notifications_total",
            dimensions: [("store", notification.store.rawValue), ("app", appLabel)], factory: metrics
        ).increment()
        logger.info(
            "notification received",
            metadata: [
                LogKey.notificationStore: "\(notification.store.rawValue)", LogKey.notificationApp: "\(appLabel)",
                LogKey.kafkaPartition: "\(record.partition)", LogKey.kafkaOffset: "\(record.offset)",
                "notification.bytes": "\(notification.body.count)",
            ])
    }
}
