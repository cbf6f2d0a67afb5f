import RelayCore

/// Builds the entitlements route's answer (SDK customer info, docs/contracts.md) from stored states.
///
/// - A state is a one-time purchase (a `nonSubscriptions` entry) when it does not renew and has no
///   expiry: what the normalizer writes for Apple ONE_TIME_CHARGE (Non-Consumable, Consumable,
///   Non-Renewing Subscription), Google one-time products, Stripe one-time checkouts and Paddle one-time
///   transactions. Every other state is a subscription, canceled or expired ones too (they keep their
///   expiry).
/// - A subscription entry's `transactionId` is its latest transaction (`lastTransactionId`, else the
///   original one), what the SDK's device-side history names too; `purchaseDate` is that payment's time as
///   recorded in the state, else the latest recorded payment's, else the newest notification's time.
struct CustomerInfoBuilder {
    /// The application's product mapping (from the configuration).
    let mapping: (Int) -> ProductMapping?
    /// Unix milliseconds.
    let now: Int64

    func document(_ states: [SubscriptionState]) -> UserEntitlements {
        var subscriptions: [(SubscriptionState, SubscriptionTransaction)] = []
        var purchases: [(SubscriptionState, NonSubscriptionTransaction)] = []
        var unlocking: [String: [SubscriptionState]] = [:]
        var productIds: [String: Set<String>] = [:]
        for state in states {
            let products = mapping(state.applicationId) ?? ProductMapping(products: [])
            let entitlements = products.entitlements(of: state)
            for identifier in entitlements {
                unlocking[identifier, default: []].append(state)
                // Every configured product that unlocks it (the SDK's `productIds`), and the one bought (a
                // Stripe price when the mapping names its product).
                productIds[identifier, default: []].formUnion(products.products.filter { $0.entitlements.contains(identifier) }.map(\.productId))
                productIds[identifier, default: []].insert(state.productId)
            }
            if state.isOneTimePurchase {
                purchases.append((state, nonSubscription(state, entitlements: entitlements)))
            } else {
                subscriptions.append((state, subscription(state, entitlements: entitlements)))
            }
        }
        let entitlements = unlocking.keys.sorted().map { identifier in
            entitlement(identifier, states: unlocking[identifier]!, productIds: productIds[identifier, default: []].sorted())
        }
        return UserEntitlements(
            entitlements: entitlements.filter(\.isActive).map { EntitlementIdentifier($0.identifier) },
            customerInfo: CustomerInfo(
                subscriptions: subscriptions.sorted { Self.older($0.0, $1.0) }.map(\.1),
                nonSubscriptions: purchases.sorted { Self.older($0.0, $1.0) }.map(\.1),
                entitlements: entitlements))
    }

    private func subscription(_ state: SubscriptionState, entitlements: [String]) -> SubscriptionTransaction {
        let active = state.isActive(at: now)
        let latest = sdkState(state)
        return SubscriptionTransaction(
            transactionId: state.lastTransactionId ?? state.originalTransactionId, productId: state.productId, purchaseDate: state.purchaseDate,
            willRenew: state.willRenew, isRevoked: state.isRevoked, isInGracePeriod: latest == .inGracePeriod,
            isInBillingRetryPeriod: latest == .inBillingRetryPeriod, isActive: active, expirationDate: state.expiresAt, offerType: state.offerType,
            subscriptionGroupId: state.productGroupId, store: ProductStore(state.store), entitlements: entitlements, state: state)
    }

    private func nonSubscription(_ state: SubscriptionState, entitlements: [String]) -> NonSubscriptionTransaction {
        NonSubscriptionTransaction(
            transactionId: state.lastTransactionId ?? state.originalTransactionId, productId: state.productId, purchaseDate: state.purchaseDate,
            isRevoked: state.isRevoked, store: ProductStore(state.store), isActive: state.isActive(at: now), entitlements: entitlements,
            state: state)
    }

    /// As SuperwallKit's `EntitlementProcessor` builds it from transactions: a lifetime purchase (a one-time
    /// purchase not refunded nor revoked) wins; otherwise the latest subscription (by purchase date) says
    /// the product, store, renewal, state and offer, and the latest expiry of those not revoked says when
    /// access ends (the grace period's end during one).
    private func entitlement(_ identifier: String, states: [SubscriptionState], productIds: [String]) -> CustomerEntitlement {
        let lifetime = states.filter { $0.isOneTimePurchase && $0.isActive(at: now) }.min { Self.older($0, $1) }
        let renewables = states.filter { !$0.isOneTimePurchase }
        let latestRenewable = renewables.max { Self.older($0, $1) }
        let latest = lifetime ?? latestRenewable ?? states.max { Self.older($0, $1) }
        let current = lifetime == nil ? latestRenewable : nil
        // A replaced subscription's dates say nothing of the access the user has (its replacement does).
        let kept = renewables.filter { !$0.isRevoked && $0.replacedBy == nil }
        return CustomerEntitlement(
            identifier: identifier, isActive: states.contains { $0.isActive(at: now) }, productIds: productIds, latestProductId: latest?.productId,
            store: latest.map { ProductStore($0.store) }, startsAt: states.map(\.firstPurchaseDate).min(),
            renewedAt: kept.compactMap(\.renewedAt).max(), expiresAt: lifetime == nil ? kept.compactMap(\.accessEndsAt).max() : nil,
            isLifetime: lifetime != nil, willRenew: current?.willRenew ?? false, state: current.flatMap(sdkState), offerType: current?.offerType)
    }

    /// SuperwallKit's `LatestSubscription.State`; nil while paused (it has no such state). A period
    /// past its end without a notification saying so reads as what the store does next.
    private func sdkState(_ state: SubscriptionState) -> LatestSubscriptionState? {
        if state.replacedBy != nil { return .expired }
        let active = state.isActive(at: now)
        switch state.status {
        case .active: return active ? .subscribed : .expired
        case .inGracePeriod: return active ? .inGracePeriod : .inBillingRetryPeriod
        case .inBillingRetry: return .inBillingRetryPeriod
        case .paused: return nil
        case .expired: return .expired
        case .revoked, .refunded: return .revoked
        }
    }

    /// By purchase date, then by key: a stable order.
    private static func older(_ a: SubscriptionState, _ b: SubscriptionState) -> Bool {
        (a.purchaseDate, a.store.rawValue, a.originalTransactionId) < (b.purchaseDate, b.store.rawValue, b.originalTransactionId)
    }
}

extension SubscriptionState {
    /// Bought once: it does not renew and has no expiry (the rule above).
    var isOneTimePurchase: Bool { !autoRenew && expiresAt == nil }

    var isRevoked: Bool { status == .revoked || status == .refunded }

    /// Auto-renew is on and the subscription has not ended (billing retry and pauses resume).
    var willRenew: Bool {
        // A replaced subscription never renews: the one that replaced it does.
        guard replacedBy == nil else { return false }
        return switch status {
        case .active, .inGracePeriod, .inBillingRetry, .paused: autoRenew
        case .expired, .revoked, .refunded: false
        }
    }

    /// The latest payment's time (Unix milliseconds), else the newest notification's.
    var purchaseDate: Int64 {
        transaction(lastTransactionId)?.purchasedAt ?? transactions.last { $0.purchasedAt != nil }?.purchasedAt ?? sourceTimestamp
    }

    /// The earliest recorded payment's time (the list is bounded: the oldest kept).
    var firstPurchaseDate: Int64 {
        transactions.compactMap(\.purchasedAt).min() ?? purchaseDate
    }

    /// The latest payment's time once there has been more than one.
    var renewedAt: Int64? {
        let times = transactions.compactMap(\.purchasedAt)
        return times.count > 1 ? times.max() : nil
    }

    /// When access ends: the grace period's end during one, else the expiry.
    var accessEndsAt: Int64? {
        status == .inGracePeriod ? gracePeriodExpiresAt ?? expiresAt : expiresAt
    }

    /// SuperwallKit's offer type for the current period: StoreKit's introductory offers (free or paid)
    /// are its `trial`.
    var offerType: SubscriptionOfferType? {
        switch periodType {
        case .trial, .intro: .trial
        case .promotional: .promotional
        case .normal: nil
        }
    }
}
