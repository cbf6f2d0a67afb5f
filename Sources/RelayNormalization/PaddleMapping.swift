import Foundation
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
            adjustment(data, input, prior: prior, into: &mapping)
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
        // A trial that has ended stays TRIAL until the transaction paying the first period after it
        // (transaction.completed, subscription_recurring) reports the conversion: subscription.activated and
        // subscription.updated (or past_due when that payment fails) come before it completes.
        // subscription.activated of a subscription with a trial (its item's price has a trial period, or the
        // item still names its trial dates) says the trial elapsed and was billed, also when the trial's start
        // was never seen (unless that payment came first). Paddle sends activated for a subscription without a
        // trial too: that is no conversion.
        let hasTrial = item?.present("trial_dates") != nil || item?["price"]?.present("trial_period") != nil
        let trialEnded = prior?.periodType == .trial || (type == "subscription.activated" && hasTrial && prior == nil && !input.late)
        let statePeriodType = trialEnded && ["active", "past_due"].contains(paddleStatus) ? .trial : periodType
        let expiresAt = Timestamp.milliseconds(subscription["current_billing_period"]?.text("ends_at"))
            ?? Timestamp.milliseconds(subscription.text("canceled_at"))
        let autoRenew = paddleStatus != "canceled" && scheduled != "cancel"
        var amount: Amount?
        // The subscription names its discount but neither its amount nor the discounted price (only the
        // transactions do), so a discounted purchase's amount is unknown rather than the list price.
        if let unit = item?["price"]?["unit_price"], periodType != .promotional {
            let quantity = item?.integer("quantity") ?? 1
            amount = Amount.paddleMinorUnits(unit.text("amount"), unit.text("currency_code") ?? subscription.text("currency_code"))
                .map { periodType == .trial ? Amount(0, $0.currency) : Amount($0.value * Decimal(quantity), $0.currency) }
        }
        // subscription.created names the transaction that created it (its checkout); other events do not.
        let lastTransactionId = subscription.text("transaction_id") ?? prior?.lastTransactionId
        mapping.state = SubscriptionState(
            store: .paddle, originalTransactionId: id, applicationId: input.app.applicationId,
            originalAppUserId: mapping.appUserId ?? prior?.originalAppUserId, appUserIds: prior?.appUserIds ?? [], productId: priceId,
            productGroupId: item?["price"]?.text("product_id") ?? item?["product"]?.text("id"), status: status, periodType: statePeriodType,
            autoRenew: autoRenew, expiresAt: expiresAt, environment: mapping.environment, lastTransactionId: lastTransactionId,
            sourceTimestamp: mapping.eventTime)
        let draft = EventDraft(
            type: .renewal, periodType: periodType, productId: priceId, transactionId: lastTransactionId,
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
            guard let prior else {
                // Nothing to compare with, but a scheduled cancellation says itself that renewal is off: the
                // first update the relay sees of it is its cancellation (a late update is not).
                if !input.late, scheduled == "cancel", paddleStatus != "canceled" { event(.cancellation) { $0.cancelReason = Reason.unsubscribe } }
                return
            }
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
            // The scheduled pause took effect: not billed, no access until resumed. An expiration, since
            // Superwall sends subscription_paused only for the Play Store; a Paddle pause is made by the seller
            // through its API or dashboard.
            event(.expiration) { $0.expirationReason = Reason.developerInitiated }
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
        var draft = EventDraft(
            type: .renewal, periodType: .normal, productId: priceId ?? prior?.productId, transactionId: id,
            purchasedAt: Timestamp.milliseconds(transaction.text("billed_at")) ?? mapping.eventTime, expirationAt: periodEnd, amount: amount,
            taxPercentage: taxPercentage)
        // What the seller keeps after tax and Paddle's fee.
        draft.earnings = Amount.paddleMinorUnits(totals?.text("earnings"), currency)
        if let subscriptionId = transaction.text("subscription_id") {
            mapping.subject = subscriptionId
            mapping.appUserId = mapping.appUserId ?? prior?.originalAppUserId
            // The $0 transaction of a payment-method change on an active subscription pays for nothing (a
            // past-due subscription's new method pays the past-due transaction itself).
            guard origin != "subscription_payment_method_change" else { return }
            if origin == "subscription_charge" {
                charges(transaction, draft: draft, currency: currency, input, prior: prior, into: &mapping)
                return
            }
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
            // A recurring payment, or a charge for a change made now (origin subscription_update: a plan
            // change's proration, which the product_change beside it does not carry).
            if origin == "subscription_recurring" || (origin == "subscription_update" && (amount?.value ?? 0) > 0) {
                var renewal = draft
                renewal.isTrialConversion = prior?.periodType == .trial
                // A discount still applying to this payment makes the period PROMOTIONAL, as at the purchase.
                if let discount = transaction.text("discount_id") {
                    renewal.periodType = .promotional
                    renewal.offerCode = discount
                }
                state.periodType = renewal.periodType
                mapping.events = [renewal]
            }
            // web/api: the first payment of a subscription whose subscription.created is the initial
            // purchase; the rest (a credited update, subscription_charge): state only.
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

    /// A `subscription_charge` transaction: one-time charges billed to a subscription (Paddle's "create a
    /// one-time charge" for a subscription). Real money for something bought once, so each line is a
    /// `non_renewing_purchase` of its price, with the line's total and the subscription's user. The
    /// subscription is not renewed by it: its product, period and status stay; the payment is recorded on
    /// it, so a later refund of the charge finds what it was.
    private static func charges(
        _ transaction: JSON, draft: EventDraft, currency: String?, _ input: MappingInput, prior: SubscriptionState?, into mapping: inout StoreMapping
    ) {
        let lines = transaction["details"]?["line_items"]?.arrayValue ?? []
        var charge = draft
        charge.type = .nonRenewingPurchase
        charge.expirationAt = nil
        charge.sdkEvents = [SDKEvent.transactionComplete, SDKEvent.nonRecurringProductPurchase]
        if lines.count <= 1 {
            if let line = lines.first { charge.productId = line.text("price_id") ?? charge.productId }
            mapping.events = [charge]
        } else {
            // Several charges at once: one event a line, each with its own price and total (the seller's
            // earnings are reported for the whole transaction only, so each line's proceeds come from the
            // configured commission).
            let base = input.notification.notificationId.map { "paddle:\($0)" } ?? "paddle:\(transaction.text("id") ?? "-")"
            mapping.events = lines.enumerated().map { index, line in
                var item = charge
                item.productId = line.text("price_id") ?? charge.productId
                item.amount = Amount.paddleMinorUnits(line["totals"]?.text("total"), currency)
                item.earnings = nil
                let tax = Amount.paddleMinorUnits(line["totals"]?.text("tax"), currency)
                item.taxPercentage = nil
                if let amount = item.amount, let tax, amount.value - tax.value > 0 { item.taxPercentage = tax.value / (amount.value - tax.value) }
                item.idBase = "\(base):\(index)"
                // Each line recorded on its own (a refund names its line through `items[].item_id`).
                item.transactionId = line.text("id") ?? charge.transactionId
                return item
            }
        }
        // Recorded on the subscription the relay holds; without one the events stand for themselves.
        guard var state = prior else { return }
        state.sourceTimestamp = max(state.sourceTimestamp, mapping.eventTime)
        mapping.state = state
    }

    private static func adjustment(_ adjustment: JSON, _ input: MappingInput, prior: SubscriptionState?, into mapping: inout StoreMapping) {
        guard let id = adjustment.text("id") else { return }
        mapping.subject = adjustment.text("subscription_id") ?? adjustment.text("transaction_id")
        // Only an approved refund or chargeback moves money back, and an approved chargeback_reverse (Paddle
        // won the dispute) brings it in again; credits, chargeback warnings and pending requests move none.
        let action = adjustment.text("action") ?? ""
        guard adjustment.text("status") == "approved", ["refund", "chargeback", "chargeback_reverse"].contains(action) else { return }
        let reversal = action == "chargeback_reverse"
        mapping.appUserId = mapping.appUserId ?? prior?.originalAppUserId
        let totals = adjustment["totals"]
        let currency = totals?.text("currency_code") ?? adjustment.text("currency_code")
        let amount = Amount.paddleMinorUnits(totals?.text("total"), currency)
        let tax = Amount.paddleMinorUnits(totals?.text("tax"), currency)
        let earnings = Amount.paddleMinorUnits(totals?.text("earnings"), currency)
        // The adjusted transaction as the relay recorded it when it was paid: its product and time.
        let paid = mapping.recorded(adjustment["items"]?.arrayValue?.first?.text("item_id"), in: input.history)
            ?? mapping.recorded(adjustment.text("transaction_id"), in: input.history)
        var draft = EventDraft(
            type: reversal ? .refundReversed : .cancellation, periodType: paid?.periodType ?? .normal, productId: paid?.productId ?? prior?.productId,
            transactionId: adjustment.text("transaction_id"), purchasedAt: paid?.purchasedAt, expirationAt: prior?.autoRenew == true ? prior?.expiresAt : nil,
            cancelReason: reversal ? nil : Reason.customerSupport, amount: reversal ? amount : amount?.negated)
        draft.earnings = reversal ? earnings : earnings?.negated
        if let amount, let tax, amount.value - tax.value > 0 { draft.taxPercentage = tax.value / (amount.value - tax.value) }
        draft.idBase = "paddle:\(id)"
        mapping.events = [draft]
        // A refunded one-time purchase no longer gives access (a partial refund leaves it), and gets it back
        // when the chargeback is reversed; a subscription keeps its own status.
        guard var state = prior, !state.autoRenew, state.originalTransactionId == adjustment.text("transaction_id") else { return }
        if reversal, state.status == .refunded {
            state.status = .active
        } else if !reversal, adjustment.text("type") != "partial" {
            state.status = .refunded
        } else {
            return
        }
        state.sourceTimestamp = max(state.sourceTimestamp, mapping.eventTime)
        mapping.state = state
    }
}

extension PaddleMapping {
    /// The event Paddle would have sent for an object `reconcile paddle` found out of step with `prior`, the
    /// stored state, or `import paddle` brings in (`kind`), named `id`:
    /// - a completed transaction: `transaction.completed` at its billing time (a payment the relay missed);
    /// - an approved adjustment: `adjustment.updated` at its last change (a refund or chargeback, or its reversal);
    /// - an imported subscription's purchase (`kind` "created"): `subscription.created` at its start, as it
    ///   was then (trialing when it began with a trial, else active, renewing);
    /// - a subscription Paddle canceled: `subscription.canceled` at its cancellation;
    /// - otherwise `subscription.updated` now, which the mapping compares with the stored state (a missed
    ///   cancellation, uncancellation, product change or billing issue).
    static func storeObjectEvent(_ object: JSON, prior: SubscriptionState?, id: String, kind: String? = nil) -> JSON {
        var event: [String: JSON] = ["event_id": .string(id), "notification_id": .string(id)]
        if object.text("id")?.hasPrefix("adj_") == true {
            event["event_type"] = "adjustment.updated"
            event["occurred_at"] = object["updated_at"] ?? object["created_at"] ?? .null
            event["data"] = object
            return .object(event)
        }
        if object.text("id")?.hasPrefix("txn_") == true {
            event["event_type"] = "transaction.completed"
            event["occurred_at"] = object["billed_at"] ?? object["created_at"] ?? .null
            event["data"] = object
            return .object(event)
        }
        if kind == "created", case .object(var then) = object {
            let trial = object["items"]?.arrayValue?.first?.present("trial_dates") != nil
            then["status"] = .string(trial ? "trialing" : "active")
            then["scheduled_change"] = .null
            then["canceled_at"] = .null
            event["event_type"] = "subscription.created"
            event["occurred_at"] = object["started_at"] ?? object["created_at"] ?? .null
            event["data"] = .object(then)
            return .object(event)
        }
        if object.text("status") == "canceled" {
            event["event_type"] = "subscription.canceled"
            event["occurred_at"] = object["canceled_at"] ?? object["updated_at"] ?? .null
        } else {
            event["event_type"] = "subscription.updated"
            // An import's current state: as of Paddle's last change of it, not the import's day.
            if kind == "current" { event["occurred_at"] = object["updated_at"] ?? .null }
        }
        event["data"] = object
        return .object(event)
    }
}

extension PaddleMapping {
    /// What the adjustment mapping reads of an adjustment, and nothing else (its reason is free text a
    /// customer or seller wrote).
    static func trimmedAdjustment(_ adjustment: JSON) -> JSON {
        var kept: [String: JSON] = [:]
        for key in ["id", "action", "type", "status", "subscription_id", "transaction_id", "customer_id", "currency_code", "totals", "created_at", "updated_at"] {
            if let value = adjustment[key] { kept[key] = value }
        }
        if let items = adjustment["items"]?.arrayValue {
            kept["items"] = .array(items.map { ["item_id": $0["item_id"] ?? .null, "type": $0["type"] ?? .null, "amount": $0["amount"] ?? .null] })
        }
        return .object(kept)
    }
}
