import CoreMetrics
import Foundation
import Logging
import RelayConfig
import RelayCore

/// Purchases apps hand over (Stripe, Paddle), and the Stripe objects the updater reads through the API.
extension SubscriptionUpdater {
    // MARK: Purchases apps hand over (Stripe, Paddle)

    /// What the store's API answers for a Stripe or Paddle purchase an app handed over (its ids in the
    /// record): `{"subscription"}`, `{"checkoutSession"}` or `{"transaction", "subscription"?}`. A purchase the
    /// store does not know is rejected (`purchase_not_found`); an app without the API is rejected too.
    func fetchPurchase(_ notification: VerifiedNotification, app: RelayConfiguration.App) async throws(NormalizationError) -> JSON {
        let record = notification.payload
        func call(_ body: () async throws(StoreAPIError) -> JSON) async throws(NormalizationError) -> JSON {
            do {
                return try await body()
            } catch {
                throw storeAPIFailure(error, app: app) ?? .rejected(Rejection(.purchaseNotFound, error.message))
            }
        }
        if notification.store == .stripe {
            guard let client = stripe[app.key] else {
                throw .rejected(Rejection(.storeAPIRejected, "app \(app.key) has no stripe.api configured; the purchase cannot be read"))
            }
            if let id = record.text("subscriptionId") {
                return ["subscription": try await call { () async throws(StoreAPIError) in try await client.subscription(id) }]
            }
            guard let id = record.text("checkoutSessionId") else { throw .rejected(Rejection(.malformed, "the purchase names no Stripe object")) }
            let session = try await call { () async throws(StoreAPIError) in try await client.checkoutSession(id) }
            if session.text("mode") == "subscription", let subscriptionId = session.text("subscription") ?? session["subscription"]?.text("id") {
                return ["subscription": try await call { () async throws(StoreAPIError) in try await client.subscription(subscriptionId) }]
            }
            return ["checkoutSession": HandedOverPurchase.trimmedSession(session)]
        }
        guard let client = paddle[app.key] else {
            throw .rejected(Rejection(.storeAPIRejected, "app \(app.key) has no paddle.api configured; the purchase cannot be read"))
        }
        guard let id = record.text("transactionId") else { throw .rejected(Rejection(.malformed, "the purchase names no Paddle transaction")) }
        let transaction = HandedOverPurchase.trimmedTransaction(try await call { () async throws(StoreAPIError) in try await client.transaction(id) })
        guard let subscriptionId = transaction.text("subscription_id") else { return ["transaction": transaction] }
        return [
            "transaction": transaction, "subscription": try await call { () async throws(StoreAPIError) in try await client.subscription(subscriptionId) },
        ]
    }

    // MARK: Stripe API

    /// The event `recover stripe` named, read from Stripe's API with the app's key, as the notification
    /// its webhook would have been. Stripe not knowing it (for this key) rejects the record.
    func stripeEvent(_ id: String, _ notification: VerifiedNotification, app: RelayConfiguration.App) async throws(NormalizationError)
        -> VerifiedNotification
    {
        guard let client = stripe[app.key] else {
            throw .rejected(Rejection(.storeAPIRejected, "app \(app.key) has no stripe.api configured; the re-ingested event cannot be read"))
        }
        let event: JSON
        do {
            event = try await client.event(id)
        } catch {
            throw storeAPIFailure(error, app: app) ?? .rejected(Rejection(.purchaseNotFound, error.message))
        }
        guard event["id"]?.stringValue == id else { throw .rejected(Rejection(.malformed, "Stripe answered another event for \(id)")) }
        var verified = VerifiedNotification(
            store: .stripe, app: notification.app, payload: event, notificationId: id, type: event["type"]?.stringValue,
            environment: event["livemode"]?.boolValue.map { $0 ? "PRODUCTION" : "SANDBOX" })
        verified.stripeEventId = nil
        return verified
    }

    /// The object `reconcile` or `import` named (`VerifiedNotification.reconcileObject`), read from the
    /// store's API with the app's key, as the event the store would have sent for it: a Stripe subscription,
    /// paid invoice or refunded charge (`StripeMapping.storeObjectEvent`), a Paddle subscription or completed
    /// transaction (`PaddleMapping.storeObjectEvent`), with the refunded charge's trimmed answer for the refund
    /// mapping. The store not knowing it (for this key), or an object of another subscription or not in the
    /// state its record says (an unpaid invoice), rejects the record.
    func storeObject(_ id: String, _ notification: VerifiedNotification, prior: SubscriptionState?, app: RelayConfiguration.App)
        async throws(NormalizationError) -> (VerifiedNotification, charge: JSON?)
    {
        let subject = notification.payload.text("subject")
        let kind = notification.payload.text("import")
        func read(id wanted: String? = nil, _ call: () async throws(StoreAPIError) -> JSON) async throws(NormalizationError) -> JSON {
            let object: JSON
            do {
                object = try await call()
            } catch {
                throw storeAPIFailure(error, app: app) ?? .rejected(Rejection(.purchaseNotFound, error.message))
            }
            let wanted = wanted ?? id
            guard object["id"]?.stringValue == wanted else { throw .rejected(Rejection(.malformed, "the store answered another object for \(wanted)")) }
            return object
        }
        var firstInvoice: JSON?
        func refuse(_ what: String) -> NormalizationError { .rejected(Rejection(.malformed, "\(id) is not \(what) of \(subject ?? "-")")) }
        let event: JSON
        var charge: JSON?
        var environment: String?
        if notification.store == .paddle {
            guard let client = paddle[app.key] else {
                throw .rejected(Rejection(.storeAPIRejected, "app \(app.key) has no paddle.api configured; \(id) cannot be read"))
            }
            if id.hasPrefix("txn_") {
                let transaction = try await read { () async throws(StoreAPIError) in try await client.transaction(id) }
                guard transaction.text("subscription_id") == subject, transaction.text("status") == "completed" else { throw refuse("a completed transaction") }
                event = PaddleMapping.storeObjectEvent(HandedOverPurchase.trimmedTransaction(transaction), prior: prior, id: notification.notificationId ?? id, kind: kind)
            } else if id.hasPrefix("adj_") {
                let adjustment = try await read { () async throws(StoreAPIError) in try await client.adjustment(id) }
                guard adjustment.text("subscription_id") == subject, adjustment.text("status") == "approved" else { throw refuse("an approved adjustment") }
                event = PaddleMapping.storeObjectEvent(PaddleMapping.trimmedAdjustment(adjustment), prior: prior, id: notification.notificationId ?? id, kind: kind)
            } else {
                guard id == subject else { throw refuse("the subscription") }
                let subscription = try await read { () async throws(StoreAPIError) in try await client.subscription(id) }
                event = PaddleMapping.storeObjectEvent(subscription, prior: prior, id: notification.notificationId ?? id, kind: kind)
            }
        } else {
            guard let client = stripe[app.key] else {
                throw .rejected(Rejection(.storeAPIRejected, "app \(app.key) has no stripe.api configured; \(id) cannot be read"))
            }
            let object: JSON
            if id.hasPrefix("in_") {
                object = try await read { () async throws(StoreAPIError) in try await client.invoice(id) }
                guard (object.text("subscription") ?? object["subscription"]?.text("id")) == subject, object.text("status") == "paid" else {
                    throw refuse("a paid invoice")
                }
            } else if id.hasPrefix("ch_") {
                object = try await read { () async throws(StoreAPIError) in try await client.charge(id) }
                let invoice = object.present("invoice")
                guard (invoice?.text("subscription") ?? invoice?["subscription"]?.text("id")) == subject, (object.integer("amount_refunded") ?? 0) > 0 else {
                    throw refuse("a refunded charge")
                }
                charge = StripeMapping.trimmedCharge(object)
            } else {
                guard id == subject else { throw refuse("the subscription") }
                object = try await read { () async throws(StoreAPIError) in try await client.subscription(id) }
                // An imported purchase is its first invoice's payment, for that invoice's period.
                if kind == "created", let first = notification.payload.text("firstInvoice") {
                    let invoice = try await read(id: first) { () async throws(StoreAPIError) in try await client.invoice(first) }
                    guard (invoice.text("subscription") ?? invoice["subscription"]?.text("id")) == subject else { throw refuse("the first invoice") }
                    firstInvoice = invoice
                }
            }
            event = StripeMapping.storeObjectEvent(object, prior: prior, id: notification.notificationId ?? id, kind: kind, firstInvoice: firstInvoice)
            environment = object["livemode"]?.boolValue.map { $0 ? "PRODUCTION" : "SANDBOX" }
        }
        var verified = VerifiedNotification(
            store: notification.store, app: notification.app, payload: event, notificationId: notification.notificationId,
            type: event["type"]?.stringValue ?? event["event_type"]?.stringValue, environment: environment)
        verified.reconcileObject = nil
        return (verified, charge)
    }

    /// The refunded charge with its invoice; nil when Stripe does not know it (the refund then stands alone).
    func fetchCharge(_ id: String, client: any StripeCharges, app: RelayConfiguration.App) async throws(NormalizationError) -> JSON? {
        do {
            return try await client.charge(id)
        } catch {
            if let failure = storeAPIFailure(error, app: app) { throw failure }
            return nil
        }
    }
}
