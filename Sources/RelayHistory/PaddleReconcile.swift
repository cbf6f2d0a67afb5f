import Foundation
public import RelayCore

/// `revenue-relay reconcile paddle`: each Paddle subscription the backend lists as active or changed since
/// `since` is read from Paddle (`GET /subscriptions/{id}`); where Paddle's status, billing period end,
/// scheduled cancellation or price differs from the stored state, `relay-source: paddle-api` records
/// `{"objectId", "subject", "reconcile"}` are appended: the latest completed transaction when the period moved
/// on without it (the missed renewal, with its money), then the subscription. The worker reads each from
/// Paddle again and applies it as the event Paddle would have sent (`transaction.completed`,
/// `subscription.updated` compared with the stored state, or `subscription.canceled`), delivered like a live
/// one. Ids are `reconcile:<id>:<what Paddle answered>`: a repeat before the worker caught up is absorbed.
extension PaddleHistoryCommands {
    public typealias Correction = ReconcileCorrection

    /// Checks each of the app's Paddle subscriptions that the backend lists as active (or able to regain
    /// access) or changed at or after `since` (Unix ms; nil: active ones only), as the type's comment says.
    public func reconcile(
        since: Int64?, progress: @escaping @Sendable (String) -> Void = { _ in }, corrected: @Sendable (Correction) -> Void = { _ in }
    ) async throws(Failure) -> ReconcileSummary {
        let producer = try appender()
        let loop = HistoryLoop(pacing: pacing, progress: progress)
        return try await loop.reconcile(
            backend, store: .paddle, applicationId: app.applicationId, since: since, producer: producer, topic: topic, corrected: corrected
        ) { state, correctedSoFar throws(Failure) in
            // One-time purchases (keyed by their payment) have no subscription to compare.
            guard state.originalTransactionId.hasPrefix("sub_") else { return .skipped }
            let done = "\(correctedSoFar) subscriptions were corrected before"
            let subscription: JSON
            do throws(StoreAPIError) {
                subscription = try await loop.call("a subscription") { () async throws(StoreAPIError) in try await client.subscription(state.originalTransactionId) }
            } catch {
                if error.kind == .notFound { return .failed(error.message) }
                throw Self.failure(error, done: done)
            }
            let paddle = Observed(subscription)
            var records: [OutgoingRecord] = []
            var actions: [String] = []
            // A renewal whose payment the state never recorded (its transaction.completed lost, whatever else
            // arrived): the latest completed transaction, when it is a charged renewal.
            let latest: JSON?
            do throws(StoreAPIError) {
                latest = try await loop.call("a subscription's transactions") { () async throws(StoreAPIError) in
                    try await client.transactions(subscriptionId: state.originalTransactionId, newestFirst: true, perPage: 1, after: nil)
                }["data"]?.arrayValue?.first
            } catch {
                throw Self.failure(error, done: done)
            }
            if let latest, let id = latest["id"]?.stringValue, state.transaction(id) == nil, Self.isRenewal(latest) {
                records.append(record(objectId: id, subject: state.originalTransactionId, field: "reconcile", value: "completed"))
                actions.append("transaction.completed")
            }
            if !Self.agrees(state, paddle) {
                records.append(record(objectId: state.originalTransactionId, subject: state.originalTransactionId, field: "reconcile", value: paddle.reconcileKey))
                actions.append(paddle.status == "canceled" ? "subscription.canceled" : "subscription.updated")
            }
            return paddle.check(state, records: records, actions: actions, storeName: "Paddle")
        }
    }

    /// A completed transaction that pays a renewal: a recurring one, or a charged change of plan.
    static func isRenewal(_ transaction: JSON) -> Bool {
        let origin = transaction["origin"]?.stringValue
        let charged = (Int64(transaction["details"]?["totals"]?["total"]?.stringValue ?? "") ?? 0) > 0
        return origin == "subscription_recurring" || (origin == "subscription_update" && charged)
    }

    /// The producer `reconcile` and `import` append with.
    func appender() throws(Failure) -> any RecordProducer {
        guard let producer else { throw Failure(.configuration, "no log to append to was given") }
        return producer
    }

    func record(objectId: String, subject: String, field: String, value: String, historical: Bool = false, deliver: Bool = true) -> OutgoingRecord {
        RawNotification(
            store: .paddle, app: app.key, receivedAtMilliseconds: now(),
            body: JSON.object(["objectId": .string(objectId), "subject": .string(subject), field: .string(value)]).serialized(), requestHeaders: [:],
            source: RawNotification.paddleAPISource, historical: historical, deliver: deliver
        ).record(topic: topic, subject: subject)
    }

    /// What reconcile compares of a Paddle Subscription.
    struct Observed: ObservedWebSubscription {
        var status: String
        var periodEnd: Int64?
        var autoRenew: Bool
        var priceId: String?

        init(_ subscription: JSON) {
            status = subscription["status"]?.stringValue ?? ""
            periodEnd = Timestamp.milliseconds(subscription["current_billing_period"]?["ends_at"]?.stringValue)
                ?? Timestamp.milliseconds(subscription["canceled_at"]?.stringValue)
            autoRenew = status != "canceled" && subscription["scheduled_change"]?["action"]?.stringValue != "cancel"
            priceId = subscription["items"]?.arrayValue?.first?["price"]?["id"]?.stringValue
        }

        /// The stored status Paddle's status maps to (as `PaddleMapping` maps it).
        var relayStatus: SubscriptionState.Status {
            switch status {
            case "active", "trialing": .active
            case "past_due": .inGracePeriod
            case "paused": .paused
            default: .expired
            }
        }
    }

    /// Whether the stored state says what Paddle says. A stored refund or revocation agrees with `canceled`.
    static func agrees(_ state: SubscriptionState, _ paddle: Observed) -> Bool {
        if paddle.relayStatus == .expired { return [.expired, .revoked, .refunded].contains(state.status) }
        return state.status == paddle.relayStatus && state.autoRenew == paddle.autoRenew && (paddle.priceId == nil || paddle.priceId == state.productId)
            && (paddle.periodEnd == nil || state.expiresAt == paddle.periodEnd)
    }
}
