import Foundation
import RelayCore

/// Stripe Billing events → standardized events and state. Subscriptions are keyed by their id; a
/// Checkout payment (one-time purchase) by its PaymentIntent, which is what a refunded charge names.
enum StripeMapping {
    /// The charge a `charge.refunded` event is about, whose invoice names the subscription.
    static func refundedChargeId(_ event: JSON) -> String? {
        guard event.text("type") == "charge.refunded" else { return nil }
        return event["data"]?["object"]?.text("id")
    }

    /// What the refund mapping reads of Stripe's answer for a charge, and nothing else: the answer is
    /// recorded with the notification (so a repeat maps the same), and the charge's billing details,
    /// e-mail and card must not be.
    static func trimmedCharge(_ charge: JSON?) -> JSON? {
        guard let charge else { return nil }
        guard let invoice = charge.present("invoice"), case .object = invoice else { return ["id": charge["id"] ?? .null, "invoice": .null] }
        let lines = (invoice["lines"]?["data"]?.arrayValue ?? []).map { line -> JSON in
            ["price": ["id": SubscriptionFacts.price(of: line)?["id"] ?? .null], "proration": line["proration"] ?? .null]
        }
        return [
            "id": charge["id"] ?? .null,
            "invoice": [
                "id": invoice["id"] ?? .null, "subscription": invoice["subscription"] ?? .null, "lines": ["data": .array(lines)],
                "subscription_details": ["metadata": ["app_user_id": invoice["subscription_details"]?["metadata"]?["app_user_id"] ?? .null]],
            ],
        ]
    }

    static func map(_ input: MappingInput, prior: SubscriptionState?) -> StoreMapping {
        let event = input.notification.payload
        let type = event.text("type") ?? ""
        let object = event["data"]?["object"] ?? .object([:])
        let previous = event["data"]?["previous_attributes"]
        let environment = event["livemode"]?.boolValue == true ? "PRODUCTION" : "SANDBOX"
        let eventTime = event.milliseconds(fromSeconds: "created") ?? input.receivedAt
        var mapping = StoreMapping(subject: nil, environment: environment, eventTime: eventTime)
        switch type {
        case "customer.subscription.created", "customer.subscription.updated", "customer.subscription.deleted",
            "customer.subscription.paused", "customer.subscription.resumed", "customer.subscription.trial_will_end",
            "customer.subscription.pending_update_applied", "customer.subscription.pending_update_expired":
            subscriptionEvent(type, object, previous: previous, input, prior: prior, into: &mapping)
        case "invoice.paid", "invoice.payment_succeeded", "invoice.payment_failed":
            invoiceEvent(type, object, input, prior: prior, into: &mapping)
        case "charge.refunded":
            refund(object, previous: previous, event: event, input, prior: prior, into: &mapping)
        case "checkout.session.completed", "checkout.session.async_payment_succeeded":
            // A delayed payment method (bank debit, transfer) completes the session unpaid; the purchase
            // is async_payment_succeeded, with the same session now paid.
            checkout(object, input, prior: prior, into: &mapping)
        default:
            mapping.recognized = false
        }
        return mapping
    }

    // MARK: Subscriptions

    private static func subscriptionEvent(
        _ type: String, _ subscription: JSON, previous: JSON?, _ input: MappingInput, prior: SubscriptionState?, into mapping: inout StoreMapping
    ) {
        guard let id = subscription.text("id") else { return }
        mapping.subject = id
        let facts = SubscriptionFacts(subscription)
        mapping.appUserId = facts.appUserId
        guard let priceId = facts.priceId else { return }
        // An incomplete subscription has not been paid yet; it starts when it becomes active.
        guard facts.stripeStatus != "incomplete" else { return }
        // A trial that has ended stays TRIAL until the invoice paying the first period after it
        // (invoice.paid, subscription_cycle) reports the conversion: Stripe sends this update (trialing →
        // active, or past_due when that payment fails) before the invoice is paid.
        // The update itself says a trial just ended (previous status trialing), also when the trial's start
        // was never seen.
        let trialEnded = prior?.periodType == .trial || previous?["status"]?.stringValue == "trialing"
        let periodType = trialEnded && ["active", "past_due", "unpaid"].contains(facts.stripeStatus) ? .trial : facts.periodType
        // past_due: the failed invoice's notifications know the retry schedule (grace period, or none left);
        // the subscription only says it is past due, so what they recorded stays.
        var status = facts.status
        var gracePeriodExpiresAt: Int64?
        if facts.status == .inGracePeriod, let prior, prior.status == .inGracePeriod || prior.status == .inBillingRetry {
            status = prior.status
            gracePeriodExpiresAt = prior.gracePeriodExpiresAt
        }
        let state = SubscriptionState(
            store: .stripe, originalTransactionId: id, applicationId: input.app.applicationId,
            originalAppUserId: facts.appUserId ?? prior?.originalAppUserId, appUserIds: prior?.appUserIds ?? [], productId: priceId,
            productGroupId: facts.productId, status: status, periodType: periodType, autoRenew: facts.autoRenew,
            expiresAt: facts.expiresAt, gracePeriodExpiresAt: gracePeriodExpiresAt, environment: mapping.environment,
            lastTransactionId: facts.latestInvoice ?? prior?.lastTransactionId, sourceTimestamp: mapping.eventTime)
        mapping.state = state
        var draft = facts.draft()
        switch type {
        case "customer.subscription.created":
            guard facts.stripeStatus == "active" || facts.stripeStatus == "trialing" else { return }
            draft.type = .initialPurchase
            draft.purchasedAt = facts.startedAt ?? mapping.eventTime
            draft.sdkEvents = SDKEvent.purchase(facts.periodType)
            mapping.events = [draft]
        case "customer.subscription.updated":
            guard let previous else { return }
            if previous["status"]?.stringValue == "incomplete", facts.stripeStatus == "active" || facts.stripeStatus == "trialing" {
                draft.type = .initialPurchase
                draft.purchasedAt = facts.startedAt ?? mapping.eventTime
                draft.sdkEvents = SDKEvent.purchase(facts.periodType)
                mapping.events.append(draft)
            }
            if let oldPrice = previous["items"]?["data"]?.arrayValue?.first.flatMap({ SubscriptionFacts.price(of: $0)?.text("id") }),
                oldPrice != priceId
            {
                var change = draft
                change.type = .productChange
                change.productId = oldPrice
                change.newProductId = priceId
                change.amount = nil
                mapping.events.append(change)
            }
            // previous_attributes holds the old values of what changed (a key with null when it was null).
            var oldAutoRenew: Bool?
            if let flag = previous["cancel_at_period_end"]?.boolValue {
                oldAutoRenew = !flag
            } else if let cancelAt = previous["cancel_at"] {
                oldAutoRenew = cancelAt.isNull
            }
            if let oldAutoRenew, oldAutoRenew != facts.autoRenew, facts.stripeStatus != "canceled" {
                var change = draft
                change.type = facts.autoRenew ? .uncancellation : .cancellation
                change.cancelReason = facts.autoRenew ? nil : facts.cancelReason ?? Reason.unsubscribe
                change.amount = nil
                mapping.events.append(change)
            }
        case "customer.subscription.deleted":
            draft.type = .expiration
            draft.expirationReason = facts.cancelReason ?? Reason.unknown
            draft.amount = nil
            mapping.events = [draft]
        case "customer.subscription.paused":
            // Not billed, no access until resumed: an expiration, as RevenueCat treats it; Superwall never
            // sends subscription_paused for Stripe. Paused through the API on request (flexible billing's
            // pause, `status_details.paused.subscription.type` "requested") is the seller's doing; otherwise
            // Stripe pauses only a trial that ended without a payment method, a failure to pay.
            let requested = subscription["status_details"]?["paused"]?["subscription"]?.text("type") == "requested"
            draft.type = .expiration
            draft.expirationReason = requested ? Reason.developerInitiated : Reason.billingError
            draft.amount = nil
            mapping.events = [draft]
        default:
            // resumed (the next invoice is the renewal), trial_will_end, pending updates: state only.
            break
        }
    }

    // MARK: Invoices

    private static func invoiceEvent(_ type: String, _ invoice: JSON, _ input: MappingInput, prior: SubscriptionState?, into mapping: inout StoreMapping) {
        let subscriptionId = invoice.text("subscription") ?? invoice["subscription"]?.text("id")
            ?? invoice["parent"]?["subscription_details"]?.text("subscription")
        guard let subscriptionId else { return }  // a one-off invoice: not a subscription event
        mapping.subject = subscriptionId
        let details = invoice.present("subscription_details") ?? invoice["parent"]?.present("subscription_details")
        mapping.appUserId = details?["metadata"]?.text("app_user_id") ?? prior?.originalAppUserId
        // The line of the subscription's current price. A product change's proration invoice credits the
        // unused time on the old price (a negative line, often listed first) next to the remaining time on
        // the new one; a cycle invoice may carry such prorations beside its own line.
        let lines = invoice["lines"]?["data"]?.arrayValue ?? []
        let priced = lines.filter { $0.present("price") != nil || $0["pricing"]?.present("price_details") != nil }
        let line = priced.first { !isProration($0) } ?? priced.first { ($0.integer("amount") ?? 0) > 0 } ?? priced.first ?? lines.first
        let price = line.flatMap { SubscriptionFacts.price(of: $0) }
        let priceId = price?.text("id") ?? line?["pricing"]?["price_details"]?.text("price") ?? prior?.productId
        let productId = SubscriptionFacts.productId(of: price) ?? line?["pricing"]?["price_details"]?.text("product") ?? prior?.productGroupId
        let periodEnd = line?["period"]?.milliseconds(fromSeconds: "end")
        let currency = invoice.text("currency") ?? "usd"
        // Decimal sums: a store-supplied integer can be anything, and Int64 arithmetic on it can trap.
        let tax = invoice.integer("tax").map { Decimal($0) }
            ?? invoice["total_taxes"]?.arrayValue.map { $0.reduce(Decimal(0)) { $0 + Decimal($1.integer("amount") ?? 0) } }
        let reason = invoice.text("billing_reason")
        guard let priceId else { return }
        // The first invoice of a subscription: customer.subscription.created (or its update from incomplete
        // to active) is the purchase. While that invoice is unpaid the subscription is incomplete, which is
        // neither a purchase nor a billing issue, and paying it adds nothing before the subscription starts.
        if reason == "subscription_create", type == "invoice.payment_failed" || prior == nil { return }

        var state = prior ?? SubscriptionState(
            store: .stripe, originalTransactionId: subscriptionId, applicationId: input.app.applicationId, productId: priceId,
            status: .active, sourceTimestamp: mapping.eventTime)
        state.productId = priceId
        state.productGroupId = productId ?? state.productGroupId
        state.originalAppUserId = mapping.appUserId
        state.environment = mapping.environment
        state.sourceTimestamp = mapping.eventTime
        var draft = EventDraft(
            type: .renewal, periodType: .normal, productId: priceId, transactionId: invoice.text("id"), purchasedAt: mapping.eventTime,
            expirationAt: periodEnd ?? prior?.expiresAt, countryCode: invoice["customer_address"]?.text("country"))
        if type == "invoice.payment_failed" {
            // While Stripe retries (next_payment_attempt set) the subscription is past_due and access
            // continues until that attempt; after the last one nothing is scheduled and access ends until
            // the invoice is paid (or Stripe cancels the subscription).
            let nextAttempt = invoice.milliseconds(fromSeconds: "next_payment_attempt")
            state.status = nextAttempt == nil ? .inBillingRetry : .inGracePeriod
            state.gracePeriodExpiresAt = nextAttempt
            // One billing_issue per failing invoice, on its first attempt; each retry sends
            // invoice.payment_failed again and only moves the grace period.
            if (invoice.integer("attempt_count") ?? 1) <= 1 {
                var issue = draft
                issue.type = .billingIssue
                issue.gracePeriodExpiresAt = state.gracePeriodExpiresAt
                mapping.events = [issue]
            }
            // No retry left: access ends now, whatever Stripe does with the subscription next (cancel it,
            // mark it unpaid, or leave it past due); its later deletion sends no second expiration.
            if nextAttempt == nil {
                draft.type = .expiration
                draft.expirationReason = Reason.billingError
                mapping.events.append(draft)
            }
            mapping.state = state
            return
        }
        // invoice.paid (and its older twin invoice.payment_succeeded, which Stripe sends for the same payment)
        guard type == "invoice.paid" else { return }
        state.status = .active
        state.gracePeriodExpiresAt = nil
        state.lastTransactionId = invoice.text("id")
        if let periodEnd { state.expiresAt = max(periodEnd, state.expiresAt ?? periodEnd) }
        let paid = invoice.integer("amount_paid") ?? 0
        // A paid subscription_update invoice is money for a change made now: a plan change's proration
        // (the product_change beside it moves none), or ending a trial early (trial_end now), which bills the
        // first paid period; during a trial a plan change costs nothing, so a paid one is the conversion.
        if reason == "subscription_cycle" || (reason == "subscription_update" && paid > 0) {
            draft.amount = Amount.stripeMinorUnits(Decimal(paid), currency)
            if let tax, Decimal(paid) - tax > 0 { draft.taxPercentage = tax / (Decimal(paid) - tax) }
            draft.isTrialConversion = prior?.periodType == .trial
            // A coupon still applying to this invoice makes the period PROMOTIONAL, as at the purchase.
            if invoice.present("discount") != nil || !(invoice["discounts"]?.arrayValue ?? []).isEmpty {
                draft.periodType = .promotional
                draft.offerCode = invoice["discount"]?["coupon"]?.text("id")
            }
            state.periodType = draft.periodType
            mapping.events = [draft]
        }
        // subscription_create: customer.subscription.created is the initial purchase; an unpaid (credited)
        // subscription_update: nothing was charged. Both update the state only.
        mapping.state = state
    }

    /// Whether an invoice line is a proration (older API versions: `proration`; newer ones:
    /// `parent.subscription_item_details.proration`).
    private static func isProration(_ line: JSON) -> Bool {
        line["proration"]?.boolValue == true || line["parent"]?["subscription_item_details"]?["proration"]?.boolValue == true
    }

    // MARK: Refunds and one-time purchases

    private static func refund(
        _ charge: JSON, previous: JSON?, event: JSON, _ input: MappingInput, prior: SubscriptionState?, into mapping: inout StoreMapping
    ) {
        // A charge names neither the subscription nor the product, but it names its PaymentIntent: the key of
        // a one-time purchase (see `checkout`). A subscription's payment is found through the charge's
        // invoice, which Stripe's API answers (`StoreAPIData.charge`, fetched by the normalizer when
        // `stripe.api` is configured); without it the refund stands alone and changes no state.
        let paymentIntent = charge.text("payment_intent") ?? charge["payment_intent"]?.text("id")
        let invoice = input.api?.charge?.present("invoice")
        let subscriptionId = invoice.flatMap { $0.text("subscription") ?? $0["subscription"]?.text("id") }
        mapping.subject = subscriptionId ?? paymentIntent ?? NotificationSubject.extract(store: .stripe, document: event)
        let purchase = prior.flatMap { !$0.autoRenew && $0.originalTransactionId == paymentIntent ? $0 : nil }
        let subscription = prior.flatMap { subscriptionId != nil && $0.originalTransactionId == subscriptionId ? $0 : nil }
        // What was refunded: the invoice as the relay recorded it when it was paid, else the invoice's own line.
        let invoiceId = invoice?.text("id")
        let paid = mapping.recorded(invoiceId, in: input.history)
        let line = invoice?["lines"]?["data"]?.arrayValue?.first { !isProration($0) } ?? invoice?["lines"]?["data"]?.arrayValue?.first
        let linePrice = line.flatMap { SubscriptionFacts.price(of: $0)?.text("id") }
        let details = invoice?.present("subscription_details")
        mapping.appUserId = charge["metadata"]?.text("app_user_id") ?? purchase?.originalAppUserId ?? subscription?.originalAppUserId
            ?? details?["metadata"]?.text("app_user_id")
        // amount_refunded is cumulative: this refund is what it grew by.
        let refunded = Decimal(charge.integer("amount_refunded") ?? 0) - Decimal(previous?.integer("amount_refunded") ?? 0)
        let currency = charge.text("currency") ?? "usd"
        mapping.events = [
            EventDraft(
                type: .cancellation, periodType: paid?.periodType ?? .normal,
                productId: paid?.productId ?? linePrice ?? purchase?.productId ?? subscription?.productId,
                transactionId: invoiceId ?? charge.text("id"),
                // When the refunded payment was made: the charge's own creation, not the refund's.
                purchasedAt: paid?.purchasedAt ?? charge.milliseconds(fromSeconds: "created"),
                expirationAt: subscription?.expiresAt, cancelReason: Reason.customerSupport,
                countryCode: charge["billing_details"]?["address"]?.text("country"),
                amount: refunded > 0 ? Amount.stripeMinorUnits(refunded, currency).negated : nil)
        ]
        // A fully refunded one-time purchase no longer gives access; a partial refund leaves it. A
        // subscription keeps its status: Stripe ends it with its own events if the merchant cancels it.
        if var state = purchase, charge["refunded"]?.boolValue == true {
            state.status = .refunded
            state.sourceTimestamp = max(state.sourceTimestamp, mapping.eventTime)
            mapping.state = state
        }
    }

    private static func checkout(_ session: JSON, _ input: MappingInput, prior: SubscriptionState?, into mapping: inout StoreMapping) {
        // Subscriptions bought through Checkout arrive as customer.subscription.created.
        guard session.text("mode") == "payment", session.text("payment_status") == "paid", let id = session.text("id") else { return }
        // Keyed by the PaymentIntent (a paid session in payment mode has one), which the charge of a later
        // refund names.
        let paymentIntent = session.text("payment_intent") ?? session["payment_intent"]?.text("id")
        let subject = paymentIntent ?? id
        mapping.subject = subject
        mapping.appUserId = session["metadata"]?.text("app_user_id") ?? session.text("client_reference_id")
        let productId = session["metadata"]?.text("price_id") ?? session["metadata"]?.text("product_id")
        let total = session.integer("amount_total") ?? 0
        let tax = session["total_details"]?.integer("amount_tax").map { Decimal($0) }
        var draft = EventDraft(
            type: .nonRenewingPurchase, productId: productId, transactionId: subject,
            purchasedAt: mapping.eventTime, countryCode: session["customer_details"]?["address"]?.text("country"),
            amount: Amount.stripeMinorUnits(Decimal(total), session.text("currency") ?? "usd"),
            sdkEvents: [SDKEvent.transactionComplete, SDKEvent.nonRecurringProductPurchase])
        if let tax, Decimal(total) - tax > 0 { draft.taxPercentage = tax / (Decimal(total) - tax) }
        mapping.events = [draft]
        if let productId {
            mapping.state = SubscriptionState(
                store: .stripe, originalTransactionId: subject, applicationId: input.app.applicationId,
                originalAppUserId: mapping.appUserId ?? prior?.originalAppUserId, productId: productId,
                productGroupId: session["metadata"]?.text("product_id"), status: .active, autoRenew: false, environment: mapping.environment,
                lastTransactionId: draft.transactionId, sourceTimestamp: mapping.eventTime)
        }
    }
}

/// The fields of a Stripe Subscription object that events and state use.
private struct SubscriptionFacts {
    var stripeStatus: String
    var priceId: String?
    var productId: String?
    var amount: Amount?
    var status: SubscriptionState.Status
    var periodType: SubscriptionState.PeriodType
    var autoRenew: Bool
    var expiresAt: Int64?
    var startedAt: Int64?
    var appUserId: String?
    var latestInvoice: String?
    var offerCode: String?
    var cancelReason: Reason?

    init(_ subscription: JSON) {
        stripeStatus = subscription.text("status") ?? ""
        let item = subscription["items"]?["data"]?.arrayValue?.first
        let price = item.flatMap { Self.price(of: $0) }
        priceId = price?.text("id")
        productId = Self.productId(of: price)
        let quantity = item?.integer("quantity") ?? 1
        switch stripeStatus {
        case "trialing", "active": status = .active
        case "past_due": status = .inGracePeriod  // Stripe is retrying the payment
        case "unpaid": status = .inBillingRetry
        case "paused": status = .paused
        default: status = .expired  // canceled, incomplete_expired
        }
        let discounts = subscription["discounts"]?.arrayValue ?? []
        if stripeStatus == "trialing" {
            periodType = .trial
        } else if subscription.present("discount") != nil || !discounts.isEmpty {
            periodType = .promotional
        } else {
            periodType = .normal
        }
        // The customer pays in the subscription's currency. A multi-currency price bills it from its
        // currency_options, which events carry only when expanded; without them the amount is unknown.
        let currency = subscription.text("currency") ?? price?.text("currency")
        var unit = price?.integer("unit_amount")
        if let currency, let priceCurrency = price?.text("currency"), currency.lowercased() != priceCurrency.lowercased() {
            unit = price?["currency_options"]?[currency.lowercased()]?.integer("unit_amount")
        }
        if let currency, periodType == .trial {
            amount = Amount(0, currency)
        } else if let currency, let unit {
            let discount = subscription.present("discount") ?? discounts.first { $0.objectValue != nil }
            amount = periodType == .promotional
                ? Self.discounted(Decimal(unit) * Decimal(quantity), currency: currency, discount: discount).map { Amount.stripeMinorUnits($0, currency) }
                : Amount.stripeMinorUnits(Decimal(unit) * Decimal(quantity), currency)
        }
        autoRenew = stripeStatus != "canceled" && subscription["cancel_at_period_end"]?.boolValue != true && subscription.present("cancel_at") == nil
        let periodEnd = subscription.milliseconds(fromSeconds: "current_period_end") ?? item?.milliseconds(fromSeconds: "current_period_end")
        expiresAt = stripeStatus == "trialing" ? subscription.milliseconds(fromSeconds: "trial_end") ?? periodEnd : periodEnd
        if stripeStatus == "canceled", let ended = subscription.milliseconds(fromSeconds: "ended_at") { expiresAt = ended }
        startedAt = subscription.milliseconds(fromSeconds: "start_date")
        appUserId = subscription["metadata"]?.text("app_user_id") ?? subscription["customer"]?["metadata"]?.text("app_user_id")
        latestInvoice = subscription.text("latest_invoice") ?? subscription["latest_invoice"]?.text("id")
        offerCode = subscription["discount"]?["coupon"]?.text("id") ?? subscription["discount"]?.text("promotion_code")
        cancelReason = switch subscription["cancellation_details"]?.text("reason") {
        case "cancellation_requested": Reason.unsubscribe
        case "payment_failed": Reason.billingError
        case "payment_disputed": Reason.customerSupport
        default: nil
        }
    }

    /// What a discounted subscription costs (minor units): its coupon's `percent_off` (rounded to the minor
    /// unit, as Stripe does) or `amount_off`. Nil when the discount's value is not in the event: newer API
    /// versions list the discounts' ids only, and a list price would overstate what was paid.
    static func discounted(_ total: Decimal, currency: String, discount: JSON?) -> Decimal? {
        let coupon = discount?.present("coupon") ?? discount?["source"]?.present("coupon")
        if let percent = coupon?["percent_off"]?.doubleValue, (0...100).contains(percent), let fraction = Decimal(string: "\(percent)") {
            return max(0, total - MoneyFields.round(total * fraction / 100, 0))
        }
        if let off = coupon?.integer("amount_off"), coupon?.text("currency")?.lowercased() == currency.lowercased() {
            return max(0, total - Decimal(off))
        }
        return nil
    }

    /// A subscription item's or invoice line's price object.
    static func price(of item: JSON) -> JSON? {
        if let price = item.present("price"), case .object = price { return price }
        return item["plan"].flatMap { $0.isNull ? nil : $0 }
    }

    static func productId(of price: JSON?) -> String? {
        price?.text("product") ?? price?["product"]?.text("id")
    }

    func draft() -> EventDraft {
        EventDraft(
            type: .renewal, periodType: periodType, productId: priceId, transactionId: latestInvoice, purchasedAt: nil,
            expirationAt: expiresAt, offerCode: offerCode, amount: amount)
    }
}


extension StripeMapping {
    /// The event Stripe would have sent for an object `reconcile stripe` found out of step with `prior`, the
    /// stored state, or `import stripe` brings in (`kind`), named `id`:
    /// - a paid invoice: `invoice.paid` at its payment time (a renewal the relay missed);
    /// - a refunded charge: `charge.refunded` of its whole refunded amount, at its last refund;
    /// - an imported subscription's purchase (`kind` "created"): `customer.subscription.created` at its start,
    ///   as it was then (trialing when it began with a trial, else active);
    /// - a subscription Stripe ended (`canceled`, `incomplete_expired`): `customer.subscription.deleted`;
    /// - otherwise `customer.subscription.updated`, whose `previous_attributes` hold what the stored state
    ///   says of what changed (auto-renewal, the price), so the mapping sends the missed cancellation,
    ///   uncancellation or product change; status and period end are taken from Stripe's answer.
    static func storeObjectEvent(_ object: JSON, prior: SubscriptionState?, id: String, kind: String? = nil, firstInvoice: JSON? = nil) -> JSON {
        var event: [String: JSON] = ["id": .string(id), "object": "event", "livemode": object["livemode"] ?? true]
        switch object.text("object") {
        case "invoice":
            event["type"] = "invoice.paid"
            event["created"] = object["status_transitions"]?["paid_at"] ?? object["created"] ?? .null
            event["data"] = ["object": object]
            return .object(event)
        case "charge":
            event["type"] = "charge.refunded"
            let refunds = object["refunds"]?["data"]?.arrayValue ?? []
            event["created"] = refunds.compactMap { $0["created"]?.int64Value }.max().map(JSON.integer) ?? object["created"] ?? .null
            event["data"] = ["object": object, "previous_attributes": ["amount_refunded": 0]]
            return .object(event)
        default:
            break
        }
        let facts = SubscriptionFacts(object)
        if kind == "created", case .object(var then) = object {
            let trial = object["trial_start"]?.int64Value != nil && object["trial_start"]?.int64Value == object["start_date"]?.int64Value
            then["status"] = .string(trial ? "trialing" : "active")
            if trial, let end = object["trial_end"], !end.isNull { then["current_period_end"] = end }
            then["cancel_at_period_end"] = false
            then["cancel_at"] = .null
            // Its payment is the first invoice, for the first invoice's period (not today's latest).
            then["latest_invoice"] = firstInvoice?["id"] ?? .null
            let firstEnd = firstInvoice?["lines"]?["data"]?.arrayValue?.first?["period"]?["end"]
            if !trial, let firstEnd, !firstEnd.isNull { then["current_period_end"] = firstEnd }
            event["type"] = "customer.subscription.created"
            event["created"] = object["start_date"] ?? object["created"] ?? .null
            event["data"] = ["object": .object(then)]
            return .object(event)
        }
        if ["canceled", "incomplete_expired"].contains(facts.stripeStatus) {
            event["type"] = "customer.subscription.deleted"
            event["created"] = object["ended_at"] ?? object["canceled_at"] ?? .null
            event["data"] = ["object": object]
            return .object(event)
        }
        var previous: [String: JSON] = [:]
        if let prior {
            if prior.autoRenew != facts.autoRenew { previous["cancel_at_period_end"] = .bool(!prior.autoRenew) }
            if let price = facts.priceId, !prior.productId.isEmpty, prior.productId != price {
                previous["items"] = ["data": [["price": ["id": .string(prior.productId)]]]]
            }
        }
        event["type"] = "customer.subscription.updated"
        // An import's current state: a cancellation when it was made, not on the import's day.
        if kind == "current", !facts.autoRenew { event["created"] = object["canceled_at"] ?? .null }
        event["data"] = ["object": object, "previous_attributes": .object(previous)]
        return .object(event)
    }
}
