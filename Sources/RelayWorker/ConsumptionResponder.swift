public import CoreMetrics
public import Logging
public import RelayConfig
public import RelayCore

/// Answers Apple's `CONSUMPTION_REQUEST` notifications with Send Consumption Information (v2), for the
/// apps that configure `apple.consumption` (no call at all for the others). The answer is built from
/// the configuration and the state the relay holds:
///
/// - `customerConsented`, `sampleContentProvided`, `refundPreference`: from the configuration;
/// - `deliveryStatus`: `DELIVERED` when the stored subscription or purchase exists and was not revoked or
///   refunded before the request (its transaction not revoked by then either), else `UNDELIVERED_OTHER`;
/// - `consumptionPercentage`: only for products that are not auto-renewable subscriptions (Apple refuses
///   it for those): 100000 when delivered (the relay cannot see partial use, and what it delivered was
///   available in full), 0 when not.
///
/// Apple unreachable, a 429 or a 5xx: `NotificationEvaluator.Unavailable`, so the worker retries the
/// record. A refused key (401) or another refusal: logged with Apple's reason, counted, and the record
/// finishes: a broken key must not hold the subscription's lane forever. A repeat of the notification
/// answers again; Apple keeps the latest answer.
public struct ConsumptionResponder: Sendable {
    private let apps: [String: RelayConfiguration.App]
    private let senders: [String: any ConsumptionAnswers]
    private let stateStore: any SubscriptionStateStore
    private let logger: Logger
    private let answers: LabeledCounters

    /// - Parameter senders: by app key, for the apps with `apple.consumption` (RelayApp builds them).
    public init(
        apps: [RelayConfiguration.App], senders: [String: any ConsumptionAnswers], stateStore: any SubscriptionStateStore, logger: Logger,
        metrics: any MetricsFactory
    ) {
        self.apps = RelayConfiguration.appsByKey(apps)
        self.senders = senders
        self.stateStore = stateStore
        self.logger = logger
        self.answers = LabeledCounters(label: "relay_consumption_answers_total", factory: metrics)
    }

    /// Whether this responder answers anything at all (some app configures consumption answers).
    public var isEnabled: Bool { !senders.isEmpty }

    /// Answers `notification` when it is a verified Apple CONSUMPTION_REQUEST of an app that configures it.
    public func answer(_ notification: VerifiedNotification) async throws(NotificationEvaluator.Unavailable) {
        guard notification.store == .apple, notification.type == "CONSUMPTION_REQUEST", let app = apps[notification.app],
            let configuration = app.apple?.consumption, let sender = senders[app.key]
        else { return }
        // The key reaches one App Store environment; the other one's transactions are unknown there.
        if let serverEnvironment = app.apple?.serverApi?.environment, let environment = notification.environment, environment != serverEnvironment {
            count(app.key, "other_environment")
            logger.debug(
                "CONSUMPTION_REQUEST from another environment than serverApi's; not answered",
                metadata: [LogKey.notificationApp: "\(app.key)", "environment": "\(environment)"])
            return
        }
        let transaction = notification.payload["data"]?["signedTransactionInfo"]
        guard let transaction, let transactionId = transaction.idText("transactionId") else {
            count(app.key, "malformed")
            logger.warning(
                "CONSUMPTION_REQUEST without a transaction id; not answered",
                metadata: [LogKey.notificationApp: "\(app.key)", LogKey.notificationId: "\(notification.notificationId ?? "-")"])
            return
        }
        var stored: SubscriptionState?
        if let originalTransactionId = transaction.idText("originalTransactionId") {
            do {
                stored = try await stateStore.subscription(store: .apple, originalTransactionId: originalTransactionId)
            } catch {
                throw NotificationEvaluator.Unavailable(message: "\(error)")
            }
        }
        guard let stored else {
            // A purchase this deployment never saw (made before it ran, or not imported): the relay
            // cannot say whether it was delivered, and "not delivered" would argue for the refund.
            count(app.key, "unknown_purchase")
            logger.warning(
                "CONSUMPTION_REQUEST for a purchase the relay does not hold; not answered (import the customer's history to answer such requests)",
                metadata: [LogKey.notificationApp: "\(app.key)", LogKey.notificationId: "\(notification.notificationId ?? "-")", "transaction.id": "\(transactionId)"])
            return
        }
        let information = Self.information(
            configuration, transaction: transaction, stored: stored, requestedAt: notification.payload["signedDate"]?.int64Value)
        let metadata: Logger.Metadata = [
            LogKey.notificationApp: "\(app.key)", LogKey.notificationId: "\(notification.notificationId ?? "-")",
            "transaction.id": "\(transactionId)", "consumption.deliveryStatus": "\(information.deliveryStatus.rawValue)",
        ]
        do {
            try await sender.sendConsumptionInformation(transactionId: transactionId, information)
        } catch {
            switch error.kind {
            case .unavailable:
                count(app.key, "unavailable")
                throw NotificationEvaluator.Unavailable(message: error.description)
            case .rejected, .notFound, .configuration, .invalidResponse:
                let result = error.status == 401 ? "key_refused" : error.kind == .notFound ? "not_found" : "rejected"
                count(app.key, result)
                var failed = metadata
                failed[LogKey.error] = "\(error)"
                logger.error("Apple refused the consumption information; the request stays unanswered", metadata: failed)
                return
            }
        }
        count(app.key, "sent")
        logger.info("consumption information sent to Apple", metadata: metadata)
    }

    /// The answer for `transaction` (the request's verified signedTransactionInfo) and the state the relay
    /// holds (a purchase it does not hold is not answered at all).
    public static func information(
        _ configuration: RelayConfiguration.ConsumptionAnswer, transaction: JSON, stored: SubscriptionState, requestedAt: Int64?
    ) -> ConsumptionInformation {
        let requestedAt = requestedAt ?? Int64.max
        var delivered = true
        if stored.status == .revoked || stored.status == .refunded, stored.sourceTimestamp <= requestedAt {
            // Taken back before the customer asked; a refund after the request still means it was delivered.
            delivered = false
        }
        if let revokedAt = transaction["revocationDate"]?.int64Value, revokedAt <= requestedAt { delivered = false }
        let type = transaction["type"]?.stringValue
        let isSubscription = type.map { $0 == "Auto-Renewable Subscription" } ?? (transaction["expiresDate"]?.int64Value != nil)
        return ConsumptionInformation(
            customerConsented: configuration.customerConsented, deliveryStatus: delivered ? .delivered : .undeliveredOther,
            sampleContentProvided: configuration.sampleContentProvided, consumptionPercentage: isSubscription ? nil : (delivered ? 100_000 : 0),
            refundPreference: configuration.refundPreference)
    }

    private func count(_ app: String, _ result: String) {
        answers.increment([("app", app), ("result", result)])
    }
}

extension JSON {
    /// A member that is a string or an integer, as text (Apple's ids are strings; be lenient).
    fileprivate func idText(_ key: String) -> String? {
        guard let value = self[key] else { return nil }
        if let text = value.stringValue { return text.isEmpty ? nil : text }
        return value.int64Value.map(String.init)
    }
}
