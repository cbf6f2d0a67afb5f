import Foundation
public import RelayCore

/// `revenue-relay reconcile google`: the Play Developer API has no list of an app's purchases, so the
/// relay re-reads its own: each Google subscription the backend lists as active or changed since `since`
/// is read with `subscriptionsv2.get`, and where Play's state differs from the stored one, a
/// `relay-source: play-api` record `{"purchaseToken", "productId", "kind": "subscription", "notificationType",
/// "reconcile"}` is appended: the Real-time Developer Notification Play would have pushed for that change.
/// The worker reads the subscription from Play again and applies it as that notification (the state as
/// Play has it now, and the missed event), delivered like any live one. Its id,
/// `reconcile:<token>:<notificationType>:<Play's expiry>`, is the same on every run until Play's answer
/// changes, so a run repeated before the worker caught up is absorbed.
extension GoogleHistoryCommands {
    public typealias Correction = ReconcileCorrection

    /// Checks each of the app's Google subscriptions that the backend lists as active (or able to regain
    /// access) or changed at or after `since` (Unix ms; nil: active ones only), as the type's comment says.
    public func reconcile(
        since: Int64?, progress: @escaping @Sendable (String) -> Void = { _ in }, corrected: @Sendable (Correction) -> Void = { _ in }
    ) async throws(Failure) -> ReconcileSummary {
        let loop = HistoryLoop(pacing: pacing, progress: progress)
        return try await loop.reconcile(
            backend, store: .google, applicationId: app.applicationId, since: since, producer: producer, topic: topic, corrected: corrected
        ) { state, _ throws(Failure) in
            // A one-time product has no Play subscription; a token a plan change replaced is Play's
            // EXPIRED by design, its access carried by the new token.
            if state.replacedBy != nil || (!state.autoRenew && state.expiresAt == nil) { return .skipped }
            let purchase: JSON
            do throws(StoreAPIError) {
                purchase = try await loop.call("a subscription") { () async throws(StoreAPIError) in
                    try await client.subscription(packageName: packageName, purchaseToken: state.originalTransactionId)
                }
            } catch {
                if error.kind == .configuration || error.kind == .unavailable || (error.kind == .rejected && [401, 403].contains(error.status ?? 0)) {
                    throw Self.failure(error, reading: "the subscription")
                }
                return .failed(error.message)
            }
            guard let fix = Self.correction(stored: state, play: purchase) else { return .inSync }
            let expiry = Self.lineItem(purchase, productId: state.productId).flatMap { Timestamp.milliseconds($0["expiryTime"]?.stringValue) } ?? 0
            let productId = state.productId.split(separator: ":").first.map(String.init) ?? state.productId
            let body: JSON = [
                "purchaseToken": .string(state.originalTransactionId), "productId": .string(productId), "kind": "subscription",
                "notificationType": .integer(fix.code), "reconcile": .string("\(fix.code):\(expiry)"),
            ]
            let record = RawNotification(
                store: .google, app: app.key, receivedAtMilliseconds: now(), body: body.serialized(), requestHeaders: [:],
                source: RawNotification.playAPISource
            ).record(topic: topic, subject: state.originalTransactionId)
            return .corrected(
                [record],
                Correction(
                    originalTransactionId: state.originalTransactionId,
                    stored: Correction.describe(state.status.rawValue, autoRenew: state.autoRenew, until: state.expiresAt),
                    found: Correction.describe(
                        purchase["subscriptionState"]?.stringValue ?? "?", autoRenew: Self.autoRenew(purchase, productId: state.productId),
                        until: expiry == 0 ? nil : expiry),
                    action: fix.name, storeName: "Google"))
        }
    }

    /// The Real-time Developer Notification that brings `stored` to what Play answers (`SubscriptionPurchaseV2`),
    /// or nil when they agree. Play's state decides; within ACTIVE, a later expiry is a renewal and a changed
    /// auto-renew flag a restart or cancellation.
    static func correction(stored: SubscriptionState, play: JSON) -> (code: Int64, name: String)? {
        let item = lineItem(play, productId: stored.productId)
        let expiry = item.flatMap { Timestamp.milliseconds($0["expiryTime"]?.stringValue) }
        let autoRenew = autoRenew(play, productId: stored.productId)
        let later = (expiry ?? 0) > (stored.expiresAt ?? 0)
        switch play["subscriptionState"]?.stringValue {
        case "SUBSCRIPTION_STATE_ACTIVE":
            if stored.status == .inBillingRetry || stored.status == .inGracePeriod { return (1, "SUBSCRIPTION_RECOVERED") }
            if stored.status != .active || later { return (2, "SUBSCRIPTION_RENEWED") }
            if autoRenew, !stored.autoRenew { return (7, "SUBSCRIPTION_RESTARTED") }
            return nil
        case "SUBSCRIPTION_STATE_CANCELED":
            // Auto-renewal off, access until the expiry.
            if stored.status != .active || later { return (2, "SUBSCRIPTION_RENEWED") }
            return stored.autoRenew ? (3, "SUBSCRIPTION_CANCELED") : nil
        case "SUBSCRIPTION_STATE_IN_GRACE_PERIOD":
            return stored.status == .inGracePeriod ? nil : (6, "SUBSCRIPTION_IN_GRACE_PERIOD")
        case "SUBSCRIPTION_STATE_ON_HOLD":
            return stored.status == .inBillingRetry ? nil : (5, "SUBSCRIPTION_ON_HOLD")
        case "SUBSCRIPTION_STATE_PAUSED":
            return stored.status == .paused ? nil : (10, "SUBSCRIPTION_PAUSED")
        case "SUBSCRIPTION_STATE_EXPIRED":
            return [.expired, .revoked, .refunded].contains(stored.status) ? nil : (13, "SUBSCRIPTION_EXPIRED")
        default:
            // PENDING, PENDING_PURCHASE_CANCELED, UNSPECIFIED: nothing a notification would change.
            return nil
        }
    }

    /// The line item of the stored product (`productId:basePlanId` or the product id), else the first.
    static func lineItem(_ play: JSON, productId: String) -> JSON? {
        let items = play["lineItems"]?.arrayValue ?? []
        let product = productId.split(separator: ":").first.map(String.init) ?? productId
        return items.first { $0["productId"]?.stringValue == product } ?? items.first
    }

    static func autoRenew(_ play: JSON, productId: String) -> Bool {
        lineItem(play, productId: productId)?["autoRenewingPlan"]?["autoRenewEnabled"]?.boolValue ?? false
    }
}
