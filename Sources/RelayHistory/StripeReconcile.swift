import Foundation
public import RelayCore

/// `revenue-relay reconcile stripe`: each Stripe subscription the backend lists as active or changed since
/// `since` is read from Stripe (`GET /v1/subscriptions/{id}`); where Stripe's status, period end, auto-renewal
/// or price differs from the stored state, a `relay-source: stripe-api` record `{"objectId", "subject",
/// "reconcile"}` is appended. A period that moved on with an invoice the state never recorded appends
/// that paid invoice first (the missed renewal, with its money), then the subscription. The worker reads
/// each from Stripe again and applies it as the event Stripe would have sent (`invoice.paid`,
/// `customer.subscription.updated` or `.deleted`), delivered like a live one. Ids are
/// `reconcile:<objectId>:<what Stripe answered>`: a repeat before the worker caught up is absorbed.
extension StripeHistoryCommands {
    public typealias Correction = ReconcileCorrection

    /// Checks each of the app's Stripe subscriptions that the backend lists as active (or able to regain
    /// access) or changed at or after `since` (Unix ms; nil: active ones only), as the type's comment says.
    public func reconcile(
        since: Int64?, progress: @escaping @Sendable (String) -> Void = { _ in }, corrected: @Sendable (Correction) -> Void = { _ in }
    ) async throws(Failure) -> ReconcileSummary {
        let loop = HistoryLoop(pacing: pacing, progress: progress)
        return try await loop.reconcile(
            backend, store: .stripe, applicationId: app.applicationId, since: since, producer: producer, topic: topic, corrected: corrected
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
            let stripe = Self.Observed(subscription)
            guard stripe.status != "incomplete" else { return .inSync }
            var records: [OutgoingRecord] = []
            var actions: [String] = []
            // A renewal whose payment the state never recorded (its invoice.paid lost, whatever else arrived):
            // the latest invoice, when Stripe says it is a paid renewal.
            if let invoiceId = stripe.latestInvoice, state.transaction(invoiceId) == nil {
                let invoice: JSON
                do throws(StoreAPIError) {
                    invoice = try await loop.call("an invoice") { () async throws(StoreAPIError) in try await client.invoice(invoiceId) }
                } catch {
                    throw Self.failure(error, done: done)
                }
                let reason = invoice["billing_reason"]?.stringValue
                if invoice["status"]?.stringValue == "paid",
                    reason == "subscription_cycle" || (reason == "subscription_update" && (invoice["amount_paid"]?.int64Value ?? 0) > 0)
                {
                    records.append(record(objectId: invoiceId, subject: state.originalTransactionId, field: "reconcile", value: "paid"))
                    actions.append("invoice.paid")
                }
            }
            if !Self.agrees(state, stripe) {
                records.append(record(objectId: state.originalTransactionId, subject: state.originalTransactionId, field: "reconcile", value: stripe.reconcileKey))
                actions.append(["canceled", "incomplete_expired"].contains(stripe.status) ? "customer.subscription.deleted" : "customer.subscription.updated")
            }
            return stripe.check(state, records: records, actions: actions, storeName: "Stripe")
        }
    }

    /// What reconcile compares of a Stripe Subscription (API version 2024-06-20, which the client pins).
    struct Observed: ObservedWebSubscription {
        var status: String
        var periodEnd: Int64?
        var autoRenew: Bool
        var priceId: String?
        var latestInvoice: String?

        init(_ subscription: JSON) {
            status = subscription["status"]?.stringValue ?? ""
            let item = subscription["items"]?["data"]?.arrayValue?.first
            periodEnd = (subscription["current_period_end"] ?? item?["current_period_end"])?.int64Value.map { $0 * 1000 }
            autoRenew = subscription["cancel_at_period_end"]?.boolValue != true && (subscription["cancel_at"]?.isNull ?? true)
            priceId = item?["price"]?["id"]?.stringValue ?? item?["price"]?.stringValue
            latestInvoice = subscription["latest_invoice"]?.stringValue ?? subscription["latest_invoice"]?["id"]?.stringValue
        }

        /// The stored status Stripe's status maps to (as `StripeMapping` maps it).
        var relayStatus: SubscriptionState.Status {
            switch status {
            case "trialing", "active": .active
            case "past_due": .inGracePeriod
            case "unpaid": .inBillingRetry
            case "paused": .paused
            default: .expired
            }
        }
    }

    /// Whether the stored state says what Stripe says: status, period end, auto-renewal and price. A stored
    /// refund or revocation is the relay's own knowledge: Stripe's `canceled` agrees with it.
    static func agrees(_ state: SubscriptionState, _ stripe: Observed) -> Bool {
        if stripe.relayStatus == .expired { return [.expired, .revoked, .refunded].contains(state.status) }
        return state.status == stripe.relayStatus && state.expiresAt == stripe.periodEnd && state.autoRenew == stripe.autoRenew
            && (stripe.priceId == nil || stripe.priceId == state.productId)
    }
}
