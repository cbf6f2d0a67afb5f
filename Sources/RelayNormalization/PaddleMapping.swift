import Foundation
import RelayBackend
import RelayCore

/// Paddle Billing events → standardized events and state. Paddle sends a subscription's whole current
/// form but not what changed, so `subscription.updated` is compared with the stored state.
enum PaddleMapping {
    static func map(_ input: MappingInput, prior: SubscriptionState?, environment: String) -> StoreMapping {
        let event = input.notification.payload
        let type = event.text("event_type") ?? ""
        let data = event["data"] ?? .object([:])
        let eventTime = Timestamp.milliseconds(event.text("occurred_at")) ?? input.receivedAt
        var mapping = StoreMapping(subject: nil, environment: environment, eventTime: eventTime)
        mapping.appUserId = data["custom_data"]?.text("app_user_id")
        switch type {
        case "subscription.created", "subscription.updated", "subscription.canceled", "subscription.paused", "subscription.resumed",
            "subscription.past_due", "subscription.activated", "subscription.trialing", "subscription.imported":
            subscriptionEvent(type, data, input, prior: prior, into: &mapping)
        case "transaction.completed":
            transaction(data, input, prior: prior, into: &mapping)
        case "adjustment.created", "adjustment.updated":
            adjustment(data, prior: prior, into: &mapping)
        default:
            mapping.recognized = false
        }
        return mapping
    }

    private static func subscriptionEvent(
        _ type: String, _ subscription: JSON, _ input: MappingInput, prior: SubscriptionState?, into mapping: inout StoreMapping
    ) {
        guard let id = subscription.text("id") else { return }
        mapping.subject = id
        let item = subscription["items"]?.arrayValue?.first
        guard let priceId = item?["price"]?.text("id") else { return }
        let paddleStatus = subscription.text("status") ?? ""
        let scheduled = subscription.present("scheduled_change")?.text("action")
        let status: SubscriptionState.Status = switch paddleStatus {
        case "active", "trialing": .active
        case "past_due": .inGracePeriod  // Paddle's dunning retries the payment
        case "paused": .paused
        default: .expired  // canceled
        }
        let periodType: SubscriptionState.PeriodType =
            paddleStatus == "trialing" ? .trial : subscription.present("discount") != nil ? .promotional : .normal
        let expiresAt = Timestamp.milliseconds(subscription["current_billing_period"]?.text("ends_at"))
            ?? Timestamp.milliseconds(subscription.text("canceled_at"))
        let autoRenew = paddleStatus != "canceled" && scheduled != "cancel"
        var amount: Amount?
        if let unit = item?["price"]?["unit_price"] {
            let quantity = item?.integer("quantity") ?? 1
            amount = Amount.paddleMinorUnits(unit.text("amount"), unit.text("currency_code") ?? subscription.text("currency_code"))
                .map { periodType == .trial ? Amount(0, $0.currency) : Amount($0.value * Decimal(quantity), $0.currency) }
        }
        mapping.state = SubscriptionState(
            store: .paddle, originalTransactionId: id, applicationId: input.app.applicationId,
            originalAppUserId: mapping.appUserId ?? prior?.originalAppUserId, appUserIds: prior?.appUserIds ?? [], productId: priceId,
            productGroupId: item?["price"]?.text("product_id") ?? item?["product"]?.text("id"), status: status, periodType: periodType,
            autoRenew: autoRenew, expiresAt: expiresAt, environment: mapping.environment, lastTransactionId: prior?.lastTransactionId,
            sourceTimestamp: mapping.eventTime)
        let draft = EventDraft(
            type: .renewal, periodType: periodType, productId: priceId, transactionId: prior?.lastTransactionId,
            purchasedAt: Timestamp.milliseconds(subscription.text("started_at")) ?? mapping.eventTime, expirationAt: expiresAt,
            offerCode: subscription["discount"]?.text("id"), amount: amount)
        func event(_ type: EventType, _ change: (inout EventDraft) -> Void = { _ in }) {
            var next = draft
            next.type = type
            if type != .initialPurchase { next.amount = nil }
            change(&next)
            mapping.events.append(next)
        }
        let wasDunning = prior?.status == .inGracePeriod || prior?.status == .inBillingRetry
        switch type {
        case "subscription.created":
            guard status == .active else { return }
            event(.initialPurchase) { $0.sdkEvents = SDKEvent.purchase(periodType) }
        case "subscription.updated":
            guard let prior else { return }  // nothing to compare with: state only
            if prior.productId != priceId {
                event(.productChange) {
                    $0.productId = prior.productId
                    $0.newProductId = priceId
                }
            }
            if prior.autoRenew, !autoRenew, paddleStatus != "canceled" {
                event(.cancellation) { $0.cancelReason = Reason.unsubscribe }
            } else if !prior.autoRenew, autoRenew, status == .active {
                event(.uncancellation)
            }
            if paddleStatus == "past_due", !wasDunning {
                event(.billingIssue)
            }
        case "subscription.past_due":
            if !wasDunning { event(.billingIssue) }
        case "subscription.canceled":
            event(.expiration) { $0.expirationReason = wasDunning ? Reason.billingError : Reason.unsubscribe }
        case "subscription.paused":
            event(.subscriptionPaused)
        default:
            // resumed (its transaction is the renewal), activated, trialing, imported: state only.
            break
        }
    }

    private static func transaction(_ transaction: JSON, _ input: MappingInput, prior: SubscriptionState?, into mapping: inout StoreMapping) {
        guard let id = transaction.text("id") else { return }
        let item = transaction["items"]?.arrayValue?.first
        let priceId = item?["price"]?.text("id") ?? item?.text("price_id")
        let totals = transaction["details"]?["totals"]
        let currency = totals?.text("currency_code") ?? transaction.text("currency_code")
        let amount = Amount.paddleMinorUnits(totals?.text("total") ?? totals?.text("grand_total"), currency)
        let tax = Amount.paddleMinorUnits(totals?.text("tax"), currency)
        var taxPercentage: Decimal?
        if let amount, let tax, amount.value - tax.value > 0 { taxPercentage = tax.value / (amount.value - tax.value) }
        let periodEnd = Timestamp.milliseconds(transaction["billing_period"]?.text("ends_at"))
        let origin = transaction.text("origin")
        let draft = EventDraft(
            type: .renewal, periodType: .normal, productId: priceId ?? prior?.productId, transactionId: id, purchasedAt: mapping.eventTime,
            expirationAt: periodEnd, amount: amount, taxPercentage: taxPercentage)
        if let subscriptionId = transaction.text("subscription_id") {
            mapping.subject = subscriptionId
            mapping.appUserId = mapping.appUserId ?? prior?.originalAppUserId
            guard var state = prior ?? priceId.map({
                SubscriptionState(
                    store: .paddle, originalTransactionId: subscriptionId, applicationId: input.app.applicationId, productId: $0,
                    productGroupId: item?["price"]?.text("product_id"), status: .active, environment: mapping.environment, sourceTimestamp: mapping.eventTime)
            }) else { return }
            state.status = .active
            state.gracePeriodExpiresAt = nil
            state.lastTransactionId = id
            state.originalAppUserId = mapping.appUserId
            state.sourceTimestamp = mapping.eventTime
            if let periodEnd { state.expiresAt = max(periodEnd, state.expiresAt ?? periodEnd) }
            if origin == "subscription_recurring" {
                var renewal = draft
                renewal.isTrialConversion = prior?.periodType == .trial
                state.periodType = .normal
                mapping.events = [renewal]
            }
            // web/api: the first payment of a subscription whose subscription.created is the initial
            // purchase; subscription_update and the rest: state only.
            mapping.state = state
            return
        }
        // No subscription: a one-time purchase, keyed by its transaction.
        mapping.subject = id
        var purchase = draft
        purchase.type = .nonRenewingPurchase
        purchase.sdkEvents = [SDKEvent.transactionComplete, SDKEvent.nonRecurringProductPurchase]
        purchase.expirationAt = nil
        mapping.events = [purchase]
        if let priceId {
            mapping.state = SubscriptionState(
                store: .paddle, originalTransactionId: id, applicationId: input.app.applicationId,
                originalAppUserId: mapping.appUserId ?? prior?.originalAppUserId, productId: priceId,
                productGroupId: item?["price"]?.text("product_id"), status: .active, autoRenew: false, environment: mapping.environment,
                lastTransactionId: id, sourceTimestamp: mapping.eventTime)
        }
    }

    private static func adjustment(_ adjustment: JSON, prior: SubscriptionState?, into mapping: inout StoreMapping) {
        guard let id = adjustment.text("id") else { return }
        mapping.subject = adjustment.text("subscription_id") ?? adjustment.text("transaction_id")
        // Only an approved refund or chargeback moves money back; credits and pending requests do not.
        guard adjustment.text("status") == "approved", ["refund", "chargeback"].contains(adjustment.text("action") ?? "") else { return }
        mapping.appUserId = mapping.appUserId ?? prior?.originalAppUserId
        let totals = adjustment["totals"]
        let amount = Amount.paddleMinorUnits(totals?.text("total"), totals?.text("currency_code") ?? adjustment.text("currency_code"))
        let tax = Amount.paddleMinorUnits(totals?.text("tax"), totals?.text("currency_code") ?? adjustment.text("currency_code"))
        var draft = EventDraft(
            type: .cancellation, productId: prior?.productId, transactionId: adjustment.text("transaction_id"), purchasedAt: mapping.eventTime,
            cancelReason: Reason.customerSupport, amount: amount?.negated)
        if let amount, let tax, amount.value - tax.value > 0 { draft.taxPercentage = tax.value / (amount.value - tax.value) }
        draft.idBase = "paddle:\(id)"
        mapping.events = [draft]
        // A refunded one-time purchase no longer gives access; a subscription keeps its own status.
        if var state = prior, !state.autoRenew, state.originalTransactionId == adjustment.text("transaction_id") {
            state.status = .refunded
            state.sourceTimestamp = max(state.sourceTimestamp, mapping.eventTime)
            mapping.state = state
        }
    }
}
