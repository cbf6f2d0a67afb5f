import Logging
import RelayConfig
import RelayCore

/// The standardized events of one applied notification, from its mapping and the subscription's state
/// before and after: each drafted event as a payload (money in USD, the product's entitlements, the
/// user's status), and `subscription_status_did_change` when the user's access changed. Pure but for
/// its counters and the warning about a missing exchange rate; the normalizer's read-map-write loop
/// calls it once the state is durable.
struct EventBuilder: Sendable {
    let money: RelayConfiguration.Money
    let rates: ExchangeRates
    let counters: NormalizerCounters
    let logger: Logger


    func build(
        _ result: StoreMapping, input: MappingInput, subject: String?, prior: SubscriptionState?, after: SubscriptionState?, others: [String],
        othersAfter: [String]? = nil, sequence: Int64? = nil, appUser: AppUser? = nil, binding: PurchaseBinding? = nil, mapping: ProductMapping
    ) -> [StandardEvent] {
        let notification = input.notification
        let store = notification.store
        let storeName = ProductMapping.storeName(store)
        let base = notification.notificationId.map { "\(store.rawValue):\($0)" } ?? "\(store.rawValue):\(subject ?? "-"):\(result.eventTime)"
        let priorEntitlements = prior.map { $0.grantsAccess ? mapping.entitlements(of: $0) : [] } ?? []
        // A hand-over that gave the subscription to this user: before it, it fed someone else.
        let before = SubscriptionStatus(entitlements: others + (binding?.priorCounted == false ? [] : priorEntitlements))
        let transferredFrom = binding?.transferredFrom
        // `othersAfter`: without a subscription this notification replaced (a Google plan change).
        let status = SubscriptionStatus(entitlements: (othersAfter ?? others) + (after.map { $0.grantsAccess ? mapping.entitlements(of: $0) : [] } ?? []))
        let appUserId = after?.originalAppUserId ?? result.appUserId
        let source = EventSource(store: store, notificationId: notification.notificationId, type: notification.type, subtype: notification.subtype)
        let eventSubject = subject ?? after?.originalTransactionId ?? base
        // A notification that names neither a known subscription nor a user (a stand-alone Stripe
        // refund) cannot say the user's status: the SDK's UNKNOWN, not a made-up INACTIVE.
        let userStatus = after == nil && prior == nil && appUserId == nil ? SubscriptionStatus.unknown : status
        var events: [StandardEvent] = []
        for draft in result.events {
            let id = "\(draft.idBase ?? base):\(draft.type.rawValue)"
            let productEntitlements = entitlements(of: draft.productId, store: store, states: [after, prior], mapping: mapping)
            let money = MoneyFields.compute(
                amount: draft.amount ?? (draft.movesMoney ? nil : .some(Amount(0, "USD"))), earnings: draft.earnings,
                taxPercentage: draft.taxPercentage,
                storeName: storeName, money: money, rates: rates)
            if let missing = money.missingRate { countMissingRate(missing, event: id) }
            var data = StoreEventData(
                id: id, name: draft.type, cancelReason: draft.cancelReason, expirationReason: draft.expirationReason,
                exchangeRate: draft.amount == nil ? nil : money.exchangeRate?.number, isSmallBusiness: money.isSmallBusiness,
                periodType: draft.periodType, countryCode: draft.countryCode, price: money.price?.number, proceeds: money.proceeds?.number,
                priceInPurchasedCurrency: money.priceInPurchasedCurrency?.number, currencyCode: draft.amount == nil ? nil : money.currencyCode,
                taxPercentage: money.taxPercentage?.number, commissionPercentage: money.commissionPercentage.number,
                takehomePercentage: money.takehomePercentage.number, offerCode: draft.offerCode, isFamilyShare: draft.isFamilyShare,
                expirationAt: draft.expirationAt, transactionId: draft.transactionId, originalTransactionId: eventSubject,
                originalAppUserId: appUserId, store: storeName, purchasedAt: draft.purchasedAt, productId: draft.productId,
                environment: result.environment, isTrialConversion: draft.isTrialConversion, newProductId: draft.newProductId,
                bundleId: result.bundleId, ts: result.eventTime, sdkEvents: draft.sdkEvents,
                entitlements: productEntitlements.map(EntitlementReference.init(id:)), subscriptionStatus: userStatus,
                gracePeriodExpiresAt: draft.gracePeriodExpiresAt, source: source)
            data.sequence = sequence
            data.userAttributes = appUser?.attributes
            data.aliases = appUser?.aliases
            data.transferredFrom = transferredFrom?.user.appUserId
            events.append(event(draft.type, id: id, subject: eventSubject, environment: result.environment, app: input.app, receivedAt: input.receivedAt, data: .store(data)))
        }
        // The user whose status changed: the one an app linked the store's id to (`aliases`), else that id.
        if before != status, let user = appUser?.appUserId ?? (after ?? prior)?.entitlementUserIds.first ?? appUserId {
            let id = "\(base):\(EventType.subscriptionStatusDidChange.rawValue)"
            var data = StatusChangeData(
                id: id, appUserId: user, originalAppUserId: appUserId, from: before, to: status, store: storeName,
                environment: result.environment, originalTransactionId: eventSubject, productId: (after ?? prior)?.productId,
                ts: result.eventTime, sdkEvents: [SDKEvent.subscriptionStatusDidChange], source: source)
            data.sequence = sequence
            data.userAttributes = appUser?.attributes
            data.aliases = appUser?.aliases
            data.transferredFrom = transferredFrom?.user.appUserId
            events.append(
                event(.subscriptionStatusDidChange, id: id, subject: eventSubject, environment: result.environment, app: input.app, receivedAt: input.receivedAt, data: .statusChange(data)))
        }
        // A transfer: the user who had the subscription loses what it gave.
        if let from = transferredFrom {
            let fromBefore = SubscriptionStatus(entitlements: from.others + priorEntitlements)
            let fromAfter = SubscriptionStatus(entitlements: from.others)
            if fromBefore != fromAfter {
                let id = "\(base):\(EventType.subscriptionStatusDidChange.rawValue):transferred"
                var data = StatusChangeData(
                    id: id, appUserId: from.user.appUserId, originalAppUserId: appUserId, from: fromBefore, to: fromAfter, store: storeName,
                    environment: result.environment, originalTransactionId: eventSubject, productId: (after ?? prior)?.productId,
                    ts: result.eventTime, sdkEvents: [SDKEvent.subscriptionStatusDidChange], source: source)
                data.sequence = sequence
                data.userAttributes = from.user.attributes
                data.aliases = from.user.aliases
                data.transferredFrom = from.user.appUserId
                events.append(
                    event(.subscriptionStatusDidChange, id: id, subject: eventSubject, environment: result.environment, app: input.app, receivedAt: input.receivedAt, data: .statusChange(data)))
            }
        }
        for event in events {
            counters.events.increment([("store", store.rawValue), ("type", event.type.rawValue)])
        }
        return events
    }

    private func event(
        _ type: EventType, id: String, subject: String, environment: String, app: RelayConfiguration.App, receivedAt: Int64, data: EventData
    ) -> StandardEvent {
        StandardEvent(
            type: type, id: id, subject: subject, environment: environment,
            payload: EventPayload(type: type, projectId: app.projectId, applicationId: app.applicationId, timestamp: receivedAt, data: data))
    }

    /// The entitlements of an event's product: a state's (after, then before the notification) when it
    /// is that product, so its product group counts too (a product change's old price mapped through
    /// its product); else the product's own mapping entry.
    private func entitlements(of productId: String?, store: Store, states: [SubscriptionState?], mapping: ProductMapping) -> [String] {
        guard let productId else { return [] }
        if let state = states.compactMap({ $0 }).first(where: { $0.productId == productId }) { return mapping.entitlements(of: state).sorted() }
        if store == .google, let colon = productId.firstIndex(of: ":") {
            // `productId:basePlanId`: the specific entry wins over the subscription's.
            return mapping.entitlements(
                store: store, productId: String(productId[..<colon]), basePlanId: String(productId[productId.index(after: colon)...])
            ).sorted()
        }
        return mapping.entitlements(store: store, productId: productId).sorted()
    }

    private func countMissingRate(_ currency: String, event: String) {
        // The label comes from the payload: only currency-shaped codes become label values.
        let label = currency.count == 3 && currency.allSatisfy { $0.isASCII && $0.isUppercase } ? currency : "other"
        counters.exchangeRateMissing.increment([("currency", label)])
        logger.warning(
            "no exchange rate for the purchase currency; price, proceeds and exchangeRate are null",
            metadata: ["currency": "\(currency)", "event.id": "\(event)"])
    }
}

extension SubscriptionState {
    /// Whether the state gives access, judged by its status alone: transitions come from the store's
    /// notifications, so a renewal a few seconds after the old period's end is not an outage.
    var grantsAccess: Bool { replacedBy == nil && (status == .active || status == .inGracePeriod) }
}
