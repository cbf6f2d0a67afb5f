import Foundation
import RelayCore

/// App Store Server Notifications V2 → standardized events and state. The decoded payload carries the
/// verified `signedTransactionInfo` and `signedRenewalInfo` in place (RelayVerification).
///
/// The store payloads are read from their `JSON` values, not decoded into Codable models: every
/// notification passes here, and decoding the verified payload with JSONDecoder (it has to be written
/// out and read again, since the verifier hands over a `JSON` value) took 10.7% of the relay's CPU in
/// the mixed end-to-end benchmark's profile (`perf`, commit 1678b2c with typed facts for every store),
/// where the relay needed 2.25 ms per notification against 1.16 ms before. Lenient reads (`text`,
/// `integer`) keep what the typed models did: a member of an unexpected type reads as absent.
enum AppleMapping {
    /// `notificationType` → what it means. Documented as docs/mappings/apple.md's table.
    static func map(_ input: MappingInput, prior: SubscriptionState?) -> StoreMapping {
        let payload = input.notification.payload
        let type = payload["notificationType"]?.stringValue ?? ""
        let subtype = payload["subtype"]?.stringValue
        let data = payload["data"] ?? .object([:])
        let transaction = data.present("signedTransactionInfo")
        let renewal = data.present("signedRenewalInfo")
        let environment = (data["environment"]?.stringValue ?? input.notification.environment) == "Production" ? "PRODUCTION" : "SANDBOX"
        let eventTime = payload.integer("signedDate") ?? input.receivedAt
        var mapping = StoreMapping(
            subject: transaction?.text("originalTransactionId"), environment: environment,
            appUserId: transaction?.text("appAccountToken"), bundleId: data.text("bundleId") ?? transaction?.text("bundleId"),
            eventTime: eventTime)
        guard let transaction else {
            // TEST, EXTERNAL_PURCHASE_TOKEN, RENEWAL_EXTENSION summaries: no transaction, nothing to apply.
            mapping.recognized = Self.known.contains(type)
            return mapping
        }
        guard let subject = mapping.subject, let productId = transaction.text("productId") else {
            // Every App Store transaction names both; without them there is no subscription to apply it to.
            mapping.recognized = Self.known.contains(type)
            mapping.malformed = "the \(type) notification's signedTransactionInfo has no \(mapping.subject == nil ? "originalTransactionId" : "productId")"
            return mapping
        }
        let facts = TransactionFacts(transaction, renewal: renewal)
        let isSubscription = facts.kind == "Auto-Renewable Subscription" || (facts.kind == nil && facts.expiresAt != nil && renewal != nil)

        // The state this notification shows, before the type's own status rules.
        var state = SubscriptionState(
            store: .apple, originalTransactionId: subject, applicationId: input.app.applicationId,
            originalAppUserId: mapping.appUserId ?? prior?.originalAppUserId, appUserIds: prior?.appUserIds ?? [],
            productId: productId, status: .active, periodType: facts.periodType, autoRenew: isSubscription ? (facts.autoRenew ?? prior?.autoRenew ?? true) : false,
            expiresAt: facts.expiresAt, gracePeriodExpiresAt: nil, environment: environment, lastTransactionId: facts.transactionId,
            sourceTimestamp: eventTime)
        if isSubscription, renewal?["isInBillingRetryPeriod"]?.boolValue == true {
            if let grace = renewal?.integer("gracePeriodExpiresDate"), grace > eventTime {
                state.status = .inGracePeriod
                state.gracePeriodExpiresAt = grace
            } else {
                state.status = .inBillingRetry
            }
        }
        if facts.revokedAt != nil { state.status = facts.isFamilyShare && facts.revocationReason == 0 ? .revoked : .refunded }

        var draft = facts.draft(type: .renewal)
        let priorProduct = prior?.productId
        switch (type, subtype) {
        case ("SUBSCRIBED", "RESUBSCRIBE"), ("OFFER_REDEEMED", "RESUBSCRIBE"):
            draft.type = .renewal
            draft.sdkEvents = SDKEvent.purchase(facts.periodType)
            mapping.events = [draft]
        case ("SUBSCRIBED", _), ("OFFER_REDEEMED", "INITIAL_BUY"):
            draft.type = .initialPurchase
            draft.sdkEvents = SDKEvent.purchase(facts.periodType)
            mapping.events = [draft]
        case ("DID_RENEW", _):
            // BILLING_RECOVERY too: the renewal that ends a billing retry or grace period.
            draft.type = .renewal
            draft.isTrialConversion = prior?.periodType == .trial && facts.periodType != .trial
            state.status = .active
            state.gracePeriodExpiresAt = nil
            mapping.events = [draft]
        case ("DID_CHANGE_RENEWAL_STATUS", _):
            let enabled = subtype.map { $0 == "AUTO_RENEW_ENABLED" } ?? (facts.autoRenew ?? true)
            state.autoRenew = enabled
            draft.type = enabled ? .uncancellation : .cancellation
            draft.cancelReason = enabled ? nil : Reason.unsubscribe
            draft.amount = nil
            mapping.events = [draft]
        case ("DID_CHANGE_RENEWAL_PREF", _), ("OFFER_REDEEMED", "UPGRADE"), ("OFFER_REDEEMED", "DOWNGRADE"):
            var change = draft
            change.type = .productChange
            change.amount = nil
            if subtype == "UPGRADE" {
                // Takes effect now: this transaction is already the new product's, charged now. The product
                // change moves no money (Superwall); the renewal beside it carries the charge (RevenueCat
                // sends RENEWAL with an App Store PRODUCT_CHANGE).
                // The notification names only the product changed to: the one changed from is the stored
                // state's. Without one (`inspect`, or a subscription bought before the relay ran) it is
                // unknown, so null, never the new product named twice.
                change.productId = priorProduct.flatMap { $0 == productId ? nil : $0 }
                change.newProductId = productId
                draft.type = .renewal
                draft.isTrialConversion = prior?.periodType == .trial && facts.periodType != .trial
                mapping.events = [change, draft]
            } else {
                // DOWNGRADE (or a reverted change, no subtype): the renewal product changes at the next renewal.
                change.newProductId = facts.autoRenewProductId ?? productId
                mapping.events = [change]
            }
        case ("OFFER_REDEEMED", _):
            // An offer for an active subscription that applies at its next renewal: state only.
            break
        case ("DID_FAIL_TO_RENEW", _):
            draft.type = .billingIssue
            draft.amount = nil
            if subtype == "GRACE_PERIOD", let grace = renewal?.integer("gracePeriodExpiresDate") {
                state.status = .inGracePeriod
                state.gracePeriodExpiresAt = grace
                draft.gracePeriodExpiresAt = grace
                mapping.events = [draft]
            } else {
                // No grace period: access ends now while Apple retries for up to 60 days, so the expiration
                // is now; a later EXPIRED BILLING_RETRY of the same lapse sends no second one.
                state.status = .inBillingRetry
                state.gracePeriodExpiresAt = nil
                var expiration = draft
                expiration.type = .expiration
                expiration.expirationReason = Reason.billingError
                mapping.events = [draft, expiration]
            }
        case ("GRACE_PERIOD_EXPIRED", _):
            // Still retrying, no longer entitled: RevenueCat's EXPIRATION with BILLING_ERROR "if the grace
            // period has ended without recovering the payment".
            state.status = .inBillingRetry
            state.gracePeriodExpiresAt = nil
            draft.type = .expiration
            draft.expirationReason = Reason.billingError
            draft.amount = nil
            mapping.events = [draft]
        case ("EXPIRED", _):
            state.status = facts.revokedAt == nil ? .expired : state.status
            state.autoRenew = false
            draft.type = .expiration
            draft.amount = nil
            draft.expirationReason = switch subtype {
            case "VOLUNTARY": Reason.unsubscribe
            case "BILLING_RETRY": Reason.billingError
            case "PRICE_INCREASE": Reason.priceIncrease
            case "PRODUCT_NOT_FOR_SALE": Reason.productUnavailable
            default: Reason.unknown
            }
            mapping.events = [draft]
        case ("REFUND", _):
            state.status = .refunded
            draft.type = .cancellation
            draft.cancelReason = Reason.customerSupport
            draft.amount = facts.amount?.negated
            mapping.events = [draft]
        case ("REFUND_REVERSED", _):
            state.status = (facts.expiresAt.map { $0 > eventTime } ?? true) ? .active : .expired
            draft.type = .refundReversed
            mapping.events = [draft]
        case ("REVOKE", _):
            // Family Sharing ended for this member (or the purchaser was refunded): access ends now.
            state.status = .revoked
            state.autoRenew = false
            draft.type = .expiration
            draft.amount = nil
            draft.expirationReason = facts.revocationReason == 1 ? Reason.customerSupport : Reason.unknown
            mapping.events = [draft]
        case ("RENEWAL_EXTENDED", _):
            draft.type = .subscriptionExtended
            draft.amount = nil
            mapping.events = [draft]
        case ("ONE_TIME_CHARGE", _):
            draft.type = .nonRenewingPurchase
            draft.sdkEvents = [SDKEvent.transactionComplete, SDKEvent.nonRecurringProductPurchase]
            mapping.events = [draft]
        case ("PRICE_INCREASE", _):
            // The customer was told of (or accepted) a price increase: state refresh only.
            break
        case ("REFUND_DECLINED", _), ("CONSUMPTION_REQUEST", _), ("RENEWAL_EXTENSION", _), ("TEST", _), ("EXTERNAL_PURCHASE_TOKEN", _):
            // Nothing changes for the subscriber.
            return mapping
        default:
            mapping.recognized = false
            return mapping
        }
        // A payment this subscription has already recorded, named again by another notification (an
        // import or reconciliation of what the live pipeline saw, or Apple's live retry of what they
        // brought, each with its own notification id), is not revenue twice: its state still applies,
        // its money event does not. A refund names a recorded payment on purpose and stays. Looked up
        // through `recorded` so that a repeat of this notification, mapped against the state it saw,
        // drops it too.
        if mapping.recorded(facts.transactionId, in: input.history) != nil {
            mapping.events.removeAll { [.initialPurchase, .renewal, .nonRenewingPurchase].contains($0.type) }
        }
        mapping.state = state
        return mapping
    }

    /// Every notification type of App Store Server Notifications V2 this mapping handles.
    static let known: Set<String> = [
        "SUBSCRIBED", "DID_RENEW", "DID_CHANGE_RENEWAL_STATUS", "DID_CHANGE_RENEWAL_PREF", "DID_FAIL_TO_RENEW", "GRACE_PERIOD_EXPIRED",
        "EXPIRED", "OFFER_REDEEMED", "REFUND", "REFUND_REVERSED", "REFUND_DECLINED", "CONSUMPTION_REQUEST", "RENEWAL_EXTENDED",
        "RENEWAL_EXTENSION", "REVOKE", "ONE_TIME_CHARGE", "PRICE_INCREASE", "TEST", "EXTERNAL_PURCHASE_TOKEN",
    ]
}

/// The fields of a decoded JWSTransactionDecodedPayload (and its renewal info) that events use.
private struct TransactionFacts {
    var kind: String?
    var transactionId: String?
    var purchasedAt: Int64?
    var expiresAt: Int64?
    var revokedAt: Int64?
    var revocationReason: Int64?
    var isFamilyShare: Bool
    var periodType: SubscriptionState.PeriodType
    var offerCode: String?
    var amount: Amount?
    var countryCode: String?
    var autoRenew: Bool?
    var autoRenewProductId: String?
    var productId: String?

    init(_ transaction: JSON, renewal: JSON?) {
        kind = transaction.text("type")
        transactionId = transaction.text("transactionId")
        productId = transaction.text("productId")
        purchasedAt = transaction.integer("purchaseDate")
        expiresAt = transaction.integer("expiresDate")
        revokedAt = transaction.integer("revocationDate")
        revocationReason = transaction.integer("revocationReason")
        isFamilyShare = transaction.text("inAppOwnershipType") == "FAMILY_SHARED"
        let offerType = transaction.integer("offerType")
        let discount = transaction.text("offerDiscountType")
        let price = transaction.integer("price")
        if discount == "FREE_TRIAL" || (offerType == 1 && price == 0) {
            periodType = .trial
        } else if offerType == 1 {
            periodType = .intro
        } else if offerType != nil {
            periodType = .promotional
        } else {
            periodType = .normal
        }
        offerCode = offerType == 3 ? transaction.text("offerIdentifier") : nil
        if let currency = transaction.text("currency") {
            // Family members pay nothing; the purchaser's transaction carries the money.
            amount = isFamilyShare ? Amount(0, currency) : price.map { Amount.milliunits($0, currency) }
        }
        countryCode = CountryCodes.alpha2(transaction.text("storefront"))
        autoRenew = renewal?.integer("autoRenewStatus").map { $0 == 1 }
        autoRenewProductId = renewal?.text("autoRenewProductId")
    }

    func draft(type: EventType) -> EventDraft {
        EventDraft(
            type: type, periodType: periodType, productId: productId, transactionId: transactionId, purchasedAt: purchasedAt,
            expirationAt: expiresAt, isFamilyShare: isFamilyShare, offerCode: offerCode, countryCode: countryCode, amount: amount)
    }
}
