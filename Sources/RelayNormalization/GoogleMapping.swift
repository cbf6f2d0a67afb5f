import Foundation
import RelayCore

/// Google Play Real-time developer notifications → standardized events and state. The notification
/// only names what happened; the subscription's real state comes from the Play Developer API
/// (`purchases.subscriptionsv2.get`, `purchases.products.get`), fetched by the normalizer into `StoreAPIData`.
enum GoogleMapping {
    /// What the normalizer must fetch for a DeveloperNotification.
    enum Fetch: Equatable {
        case none
        case subscription(purchaseToken: String)
        case product(productId: String, purchaseToken: String)
    }

    static func fetch(for notification: JSON) -> Fetch {
        switch DeveloperNotificationKind(notification) {
        case .subscription(let code):
            guard code != 20, let token = notification["subscriptionNotification"]?.text("purchaseToken") else { return .none }
            return .subscription(purchaseToken: token)
        case .oneTimeProduct(let code):
            guard code == 1, let one = notification["oneTimeProductNotification"], let token = one.text("purchaseToken"),
                let sku = one.text("sku")
            else { return .none }
            return .product(productId: sku, purchaseToken: token)
        case .voidedPurchase:
            let voided = notification["voidedPurchaseNotification"]
            guard voided?.integer("productType") == 1, let token = voided?.text("purchaseToken") else { return .none }
            return .subscription(purchaseToken: token)
        case .test, .unknown:
            return .none
        }
    }

    /// Whether the notification is SUBSCRIPTION_PURCHASED (4), whose `linkedPurchaseToken` names a replaced purchase.
    static func isPurchase(_ notification: JSON) -> Bool {
        DeveloperNotificationKind(notification) == .subscription(code: 4)
    }

    /// Whether Play's `subscriptionState` is still the one the `reconcile google` notification `code` stands for.
    static func reconcileFits(code: Int64, purchase: JSON) -> Bool {
        let state = purchase.text("subscriptionState") ?? ""
        return switch code {
        case 1, 7: state == "SUBSCRIPTION_STATE_ACTIVE"
        case 2: ["SUBSCRIPTION_STATE_ACTIVE", "SUBSCRIPTION_STATE_CANCELED"].contains(state)
        case 3: state == "SUBSCRIPTION_STATE_CANCELED"
        case 5: state == "SUBSCRIPTION_STATE_ON_HOLD"
        case 6: state == "SUBSCRIPTION_STATE_IN_GRACE_PERIOD"
        case 10: state == "SUBSCRIPTION_STATE_PAUSED"
        case 13: state == "SUBSCRIPTION_STATE_EXPIRED"
        default: false
        }
    }

    /// The first order id of a SubscriptionPurchaseV2: its latest order's (`latestOrderId`, else a line
    /// item's `latestSuccessfulOrderId`) without the renewal suffix (`GPA.1234-5678-9012-34567..2` →
    /// `GPA.1234-5678-9012-34567`), which RevenueCat's export names the subscription by.
    static func firstOrderId(_ purchase: JSON) -> String? {
        guard let order = purchase.text("latestOrderId") ?? purchase["lineItems"]?.arrayValue?.first?.text("latestSuccessfulOrderId") else { return nil }
        guard let range = order.range(of: "..", options: .backwards), order[range.upperBound...].allSatisfy(\.isNumber) else { return order }
        return String(order[..<range.lowerBound])
    }

    /// A SubscriptionPurchaseV2's `productId:basePlanId` (its first line item).
    static func productId(ofPurchase purchase: JSON) -> String? {
        SubscriptionFacts(purchase, eventTime: 0)?.productId
    }

    /// The `productId:basePlanId` a SubscriptionPurchaseV2 says it replaced (`lineItems[].itemReplacement`).
    static func replacedProductId(_ purchase: JSON) -> String? {
        SubscriptionFacts(purchase, eventTime: 0)?.replacedProductId
    }

    static func map(_ input: MappingInput, prior: SubscriptionState?) -> StoreMapping {
        let notification = input.notification.payload
        let eventTime = notification.integer("eventTimeMillis") ?? input.receivedAt
        switch DeveloperNotificationKind(notification) {
        case .subscription(let code):
            return subscription(code: code, input, prior: prior, eventTime: eventTime)
        case .oneTimeProduct(let code):
            return oneTime(code: code, input, prior: prior, eventTime: eventTime)
        case .voidedPurchase:
            return voided(input, prior: prior, eventTime: eventTime)
        case .test:
            return StoreMapping(subject: nil, environment: "SANDBOX", eventTime: eventTime)
        case .unknown:
            var mapping = StoreMapping(subject: nil, environment: "PRODUCTION", eventTime: eventTime)
            mapping.recognized = false
            return mapping
        }
    }

    // MARK: Subscriptions

    private static func subscription(code: Int64, _ input: MappingInput, prior: SubscriptionState?, eventTime: Int64) -> StoreMapping {
        let token = input.notification.payload["subscriptionNotification"]?.text("purchaseToken")
        var mapping = StoreMapping(subject: token, environment: prior?.environment ?? "PRODUCTION", eventTime: eventTime)
        guard Self.subscriptionCodes.contains(code) else {
            mapping.recognized = false
            return mapping
        }
        guard let token, let purchase = input.api?.subscription, let facts = SubscriptionFacts(purchase, eventTime: eventTime) else {
            // SUBSCRIPTION_PENDING_PURCHASE_CANCELED: a purchase that never completed; nothing to apply.
            return mapping
        }
        mapping.environment = facts.environment
        mapping.appUserId = facts.appUserId
        mapping.bundleId = input.notification.payload.text("packageName")

        var state = facts.state(token: token, applicationId: input.app.applicationId, prior: prior, eventTime: eventTime)
        markReplacement(&mapping, purchase: purchase, token: token, facts: facts, api: input.api)
        // A plan change of a purchase an app bound to a user (a transfer) stays that user's.
        if code == 4, let owner = input.api?.replacedOwner { state.ownerAppUserId = owner }
        // The first notification of a token continuing an imported subscription: it replaces it, for its users.
        if prior == nil, let imported = input.api?.imported.flatMap({ try? SubscriptionState(json: $0) }), imported.originalTransactionId != token {
            mapping.replaces = imported.originalTransactionId
            state.ownerAppUserId = state.ownerAppUserId ?? imported.ownerAppUserId
            if facts.appUserId == nil, let user = imported.originalAppUserId {
                state.originalAppUserId = user
                mapping.appUserId = user
            }
        }

        var draft = facts.draft(.renewal, purchasedAt: eventTime)
        switch code {
        case 4:  // PURCHASED
            // A new purchase token, also when a plan change replaced an older one (`linkedPurchaseToken`): the
            // new subscription's initial purchase carries its price, as RevenueCat reports Play plan changes.
            draft.type = .initialPurchase
            draft.purchasedAt = facts.startedAt ?? eventTime
            draft.sdkEvents = SDKEvent.purchase(facts.periodType)
            if purchase.text("linkedPurchaseToken") != nil, facts.periodType == .normal {
                // What the change charged now, by Play's replacement mode: nothing with time proration or
                // without proration (the new price comes with the next renewal), an amount Play's answer does
                // not hold with a prorated charge; the full price with CHARGE_FULL_PRICE or DEFERRED (which
                // takes effect at a renewal), and when Play does not say.
                switch facts.replacementMode {
                case "WITH_TIME_PRORATION", "WITHOUT_PRORATION": draft.amount = facts.recurringPrice.map { Amount(0, $0.currency) }
                case "CHARGE_PRORATED_PRICE": draft.amount = nil
                default: break
                }
            }
            mapping.events = [draft]
            // The replaced product is `lineItems[].itemReplacement` when Play reports it, else the old token's
            // stored state or Play's answer for it (fetched by the normalizer). A product_change moves no money.
            if purchase.text("linkedPurchaseToken") != nil, let old = facts.replacedProductId ?? input.api?.replacedProductId, old != facts.productId {
                var change = facts.draft(.productChange, purchasedAt: draft.purchasedAt ?? eventTime)
                change.productId = old
                change.newProductId = facts.productId
                change.amount = nil
                mapping.events.append(change)
            }
        case 2, 1:  // RENEWED (also a resumed pause), RECOVERED (from account hold)
            draft.type = .renewal
            draft.isTrialConversion = code == 2 && prior?.periodType == .trial && facts.periodType != .trial
            mapping.events = [draft]
        case 3, 18:  // CANCELED, CANCELLATION_SCHEDULED
            guard !facts.replaced else { break }
            draft.type = .cancellation
            draft.cancelReason = facts.cancelReason ?? Reason.unsubscribe
            draft.amount = nil
            mapping.events = [draft]
        case 7:  // RESTARTED
            state.autoRenew = true
            draft.type = .uncancellation
            draft.amount = nil
            mapping.events = [draft]
        case 6:  // IN_GRACE_PERIOD
            state.status = .inGracePeriod
            state.gracePeriodExpiresAt = facts.expiresAt
            draft.type = .billingIssue
            draft.gracePeriodExpiresAt = facts.expiresAt
            draft.amount = nil
            mapping.events = [draft]
        case 5:  // ON_HOLD: access ends; a billing issue unless the grace period already reported it
            state.status = .inBillingRetry
            state.gracePeriodExpiresAt = nil
            if prior?.status != .inGracePeriod {
                var issue = draft
                issue.type = .billingIssue
                issue.amount = nil
                mapping.events.append(issue)
            }
            // Access ends now (Play's account hold), so receivers that revoke on expiration do; a later
            // SUBSCRIPTION_EXPIRED of the same lapse sends no second one.
            draft.type = .expiration
            draft.expirationReason = Reason.billingError
            draft.amount = nil
            mapping.events.append(draft)
        case 9:  // DEFERRED
            draft.type = .subscriptionExtended
            draft.amount = nil
            mapping.events = [draft]
        case 10:  // PAUSED: the pause takes effect and access ends until it is resumed
            state.status = .paused
            var paused = draft
            paused.type = .subscriptionPaused
            paused.amount = nil
            // RevenueCat's reason here is SUBSCRIPTION_PAUSED, which Superwall's reasons do not list: a Play
            // pause is the user's choice to stop paying for a while.
            draft.type = .expiration
            draft.expirationReason = Reason.unsubscribe
            draft.amount = nil
            mapping.events = [paused, draft]
        case 12:  // REVOKED: refunded and access removed now (the voided purchase carries the refund)
            state.status = .revoked
            state.autoRenew = false
            draft.type = .expiration
            draft.expirationReason = Reason.customerSupport
            draft.amount = nil
            mapping.events = [draft]
        case 13:  // EXPIRED
            state.status = .expired
            state.autoRenew = false
            if prior?.status == .revoked { state.status = .revoked }
            // Replaced by a plan change: the new token carries the access. After an account hold, a pause or
            // a revocation the normalizer sends no second expiration.
            guard !facts.replaced else { break }
            draft.type = .expiration
            draft.expirationReason = facts.cancelReason ?? Reason.unknown
            draft.amount = nil
            mapping.events = [draft]
        default:
            // PRICE_CHANGE_CONFIRMED, PAUSE_SCHEDULE_CHANGED, ITEMS_CHANGED, PRICE_CHANGE_UPDATED,
            // PRICE_STEP_UP_CONSENT_UPDATED: the state is refreshed, no event.
            break
        }
        mapping.state = state
        return mapping
    }

    /// Subscription notification codes this mapping handles (all that Google documents).
    static let subscriptionCodes: Set<Int64> = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 17, 18, 19, 20, 22]

    // MARK: One-time products

    private static func oneTime(code: Int64, _ input: MappingInput, prior: SubscriptionState?, eventTime: Int64) -> StoreMapping {
        let one = input.notification.payload["oneTimeProductNotification"] ?? .object([:])
        let token = one.text("purchaseToken")
        var mapping = StoreMapping(subject: token, environment: prior?.environment ?? "PRODUCTION", eventTime: eventTime)
        guard code == 1 || code == 2 else {
            mapping.recognized = false
            return mapping
        }
        // ONE_TIME_PRODUCT_CANCELED: a pending purchase was canceled; it never gave access.
        guard code == 1, let token, let purchase = input.api?.product else { return mapping }
        guard purchase.integer("purchaseState") == 0 else { return mapping }  // pending or canceled
        let productId = purchase.text("productId") ?? one.text("sku") ?? ""
        let environment = purchase.integer("purchaseType") == 0 ? "SANDBOX" : "PRODUCTION"
        mapping.environment = environment
        mapping.appUserId = purchase.text("obfuscatedExternalAccountId")
        mapping.bundleId = input.notification.payload.text("packageName")
        let orderId = purchase.text("orderId")
        mapping.state = SubscriptionState(
            store: .google, originalTransactionId: token, applicationId: input.app.applicationId,
            originalAppUserId: mapping.appUserId ?? prior?.originalAppUserId, appUserIds: prior?.appUserIds ?? [], productId: productId,
            status: .active, periodType: .normal, autoRenew: false, expiresAt: nil, environment: environment, lastTransactionId: orderId,
            sourceTimestamp: eventTime)
        mapping.events = [
            EventDraft(
                type: .nonRenewingPurchase, productId: productId, transactionId: orderId,
                purchasedAt: purchase.integer("purchaseTimeMillis") ?? eventTime, countryCode: purchase.text("regionCode"),
                sdkEvents: [SDKEvent.transactionComplete, SDKEvent.nonRecurringProductPurchase])
        ]
        return mapping
    }

    /// After a plan change the new token names the old one in every answer: the old one stops giving
    /// access now, even while Play still shows it active (Android Developers, "Implementing
    /// linkedPurchaseToken correctly to prevent duplicate subscriptions"). A DEFERRED change takes effect at
    /// the renewal: the old token keeps its access until Play ends it then (with a replacement
    /// cancellation, which sends nothing). One rule for every notification that reads the subscription.
    private static func markReplacement(
        _ mapping: inout StoreMapping, purchase: JSON, token: String, facts: SubscriptionFacts, api: StoreAPIData?
    ) {
        guard let linked = purchase.text("linkedPurchaseToken"), linked != token, facts.replacementMode != "DEFERRED" else { return }
        mapping.replaces = linked
        mapping.replacedProductId = facts.replacedProductId ?? api?.replacedProductId
    }

    // MARK: Voided purchases (refunds, chargebacks)

    private static func voided(_ input: MappingInput, prior: SubscriptionState?, eventTime: Int64) -> StoreMapping {
        let voided = input.notification.payload["voidedPurchaseNotification"] ?? .object([:])
        let token = voided.text("purchaseToken")
        var mapping = StoreMapping(subject: token, environment: prior?.environment ?? "PRODUCTION", eventTime: eventTime)
        mapping.appUserId = prior?.originalAppUserId
        mapping.bundleId = input.notification.payload.text("packageName")
        let orderId = voided.text("orderId")
        let partial = voided.integer("refundType") == 2
        // The voided order as the relay recorded it when it was paid: its product, time and price. A partial
        // (quantity-based) refund's amount is not reported: null.
        let paid = mapping.recorded(orderId, in: input.history)
        var draft = EventDraft(
            type: .cancellation, periodType: paid?.periodType ?? .normal, productId: paid?.productId ?? prior?.productId, transactionId: orderId,
            purchasedAt: paid?.purchasedAt, cancelReason: Reason.customerSupport)
        if !partial { draft.amount = Amount(paid)?.negated }
        // A full refund is one per order: its events are named by the order, so Play's notification and
        // `recover google`'s record of the same refund are one event (the events store keeps it once).
        if !partial, let orderId { draft.idBase = "google:voided:\(orderId)" }
        if voided.integer("productType") == 1, let purchase = input.api?.subscription, let facts = SubscriptionFacts(purchase, eventTime: eventTime) {
            mapping.environment = facts.environment
            mapping.appUserId = facts.appUserId ?? mapping.appUserId
            draft.productId = paid?.productId ?? facts.productId
            draft.periodType = paid?.periodType ?? facts.periodType
            draft.expirationAt = facts.expiresAt
            draft.countryCode = facts.countryCode
            // An order id without a `..N` renewal suffix is the subscription's first order.
            if draft.purchasedAt == nil, let orderId, !orderId.contains("..") { draft.purchasedAt = facts.startedAt }
            // Not recorded (paid before the relay ran): the current order's price in a normal period is
            // known; an intro or promotional order's, or an older order's (the price may have changed), is not.
            if paid == nil, !partial, orderId == facts.orderId { draft.amount = facts.amount?.negated }
            // Access is removed by SUBSCRIPTION_REVOKED when Google revokes it; a refund alone keeps it.
            // The state is refreshed from subscriptionsv2 as for any subscription notification, which
            // also records this notification: a redelivery then replays the events as first built.
            if let token {
                var state = facts.state(token: token, applicationId: input.app.applicationId, prior: prior, eventTime: eventTime)
                markReplacement(&mapping, purchase: purchase, token: token, facts: facts, api: input.api)
                if prior?.status == .revoked, !state.grantsAccess { state.status = .revoked }
                mapping.state = state
            }
        } else if voided.integer("productType") == 2, var state = prior {
            // A refunded one-time product no longer gives access.
            state.status = .refunded
            state.sourceTimestamp = eventTime
            mapping.state = state
        }
        mapping.events = [draft]
        return mapping
    }
}

/// The fields of a SubscriptionPurchaseV2 that events and state use.
private struct SubscriptionFacts {
    /// `productId:basePlanId` (or the subscription id alone when there is no base plan).
    var productId: String
    /// The subscription's `productId`.
    var subscriptionId: String
    var expiresAt: Int64?
    var startedAt: Int64?
    var autoRenew: Bool
    var status: SubscriptionState.Status
    var pending: Bool
    var periodType: SubscriptionState.PeriodType
    var recurringPrice: Amount?
    var amount: Amount?
    var countryCode: String?
    var appUserId: String?
    var environment: String
    var orderId: String?
    var offerCode: String?
    var cancelReason: Reason?
    /// Canceled because a plan change replaced it (no cancellation or expiration event).
    var replaced: Bool
    /// The `productId:basePlanId` this purchase replaced (`lineItems[].itemReplacement`), when Play says.
    var replacedProductId: String?
    /// How the replacement was billed (`itemReplacement.replacementMode`), when Play says.
    var replacementMode: String?

    init?(_ purchase: JSON, eventTime: Int64) {
        guard let line = purchase["lineItems"]?.arrayValue?.first, let product = line.text("productId") else { return nil }
        let basePlan = line["offerDetails"]?.text("basePlanId")
        productId = basePlan.map { "\(product):\($0)" } ?? product
        subscriptionId = product
        if let replacement = line.present("itemReplacement"), let replacedProduct = replacement.text("productId") {
            replacedProductId = replacement.text("basePlanId").map { "\(replacedProduct):\($0)" } ?? replacedProduct
            replacementMode = replacement.text("replacementMode")
        }
        expiresAt = Timestamp.milliseconds(line.text("expiryTime"))
        startedAt = Timestamp.milliseconds(purchase.text("startTime"))
        autoRenew = line["autoRenewingPlan"]?["autoRenewEnabled"]?.boolValue ?? false
        let state = purchase.text("subscriptionState") ?? ""
        pending = state == "SUBSCRIPTION_STATE_PENDING"
        switch state {
        case "SUBSCRIPTION_STATE_IN_GRACE_PERIOD": status = .inGracePeriod
        case "SUBSCRIPTION_STATE_ON_HOLD": status = .inBillingRetry
        case "SUBSCRIPTION_STATE_PAUSED": status = .paused
        case "SUBSCRIPTION_STATE_EXPIRED", "SUBSCRIPTION_STATE_PENDING_PURCHASE_CANCELED": status = .expired
        case "SUBSCRIPTION_STATE_CANCELED": status = (expiresAt.map { $0 > eventTime } ?? false) ? .active : .expired
        default: status = .active
        }
        // `offerPhase` says which phase the current period is in; a signup promotion is a promotional period.
        let phase = line["offerPhase"]
        if phase?.present("freeTrial") != nil {
            periodType = .trial
        } else if phase?.present("introductoryPrice") != nil {
            periodType = .intro
        } else if line.present("signupPromotion") != nil || purchase.present("signupPromotion") != nil {
            periodType = .promotional
        } else {
            periodType = .normal
        }
        recurringPrice = Amount.googleMoney(line["autoRenewingPlan"]?["recurringPrice"])
        switch periodType {
        case .trial: amount = Amount(0, recurringPrice?.currency ?? "")  // free, whatever the currency
        case .normal: amount = recurringPrice
        case .intro, .promotional: amount = nil  // the discounted price is not in the API's answer
        }
        countryCode = purchase.text("regionCode")
        appUserId = purchase["externalAccountIdentifiers"]?.text("obfuscatedExternalAccountId")
        environment = purchase.present("testPurchase") != nil ? "SANDBOX" : "PRODUCTION"
        orderId = line.text("latestSuccessfulOrderId") ?? purchase.text("latestOrderId")
        // The code a customer redeemed (Play's vanity promotion code), as Apple's offer codes; not
        // `offerDetails.offerId`, which names any offer of the base plan (a free trial, an intro price).
        let promotion = line.present("signupPromotion") ?? purchase.present("signupPromotion")
        offerCode = promotion?["vanityCode"]?.text("promotionCode")
        let canceled = purchase["canceledStateContext"]
        replaced = canceled?.present("replacementCancellation") != nil
        if canceled?.present("userInitiatedCancellation") != nil {
            cancelReason = Reason.unsubscribe
        } else if canceled?.present("systemInitiatedCancellation") != nil {
            cancelReason = Reason.billingError
        } else if canceled?.present("developerInitiatedCancellation") != nil {
            cancelReason = Reason.developerInitiated
        } else {
            cancelReason = nil
        }
    }

    /// The subscription state this purchase shows (before a notification type's own rules).
    func state(token: String, applicationId: Int, prior: SubscriptionState?, eventTime: Int64) -> SubscriptionState {
        SubscriptionState(
            store: .google, originalTransactionId: token, applicationId: applicationId,
            originalAppUserId: appUserId ?? prior?.originalAppUserId, appUserIds: prior?.appUserIds ?? [], productId: productId,
            productGroupId: subscriptionId, status: pending ? .inBillingRetry : status, periodType: periodType, autoRenew: autoRenew,
            expiresAt: expiresAt, gracePeriodExpiresAt: status == .inGracePeriod ? expiresAt : nil, environment: environment,
            lastTransactionId: orderId, sourceTimestamp: eventTime)
    }

    func draft(_ type: EventType, purchasedAt: Int64) -> EventDraft {
        EventDraft(
            type: type, periodType: periodType, productId: productId, transactionId: orderId, purchasedAt: purchasedAt,
            expirationAt: expiresAt, offerCode: offerCode, countryCode: countryCode, amount: amount)
    }
}
