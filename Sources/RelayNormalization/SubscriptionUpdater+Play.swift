import CoreMetrics
import Foundation
import Logging
import RelayConfig
import RelayCore

/// The Play Developer API as the updater uses it: a subscription's or product's state, acknowledgements,
/// voided purchases, and the API's failures.
extension SubscriptionUpdater {
    func fetchPlay(app: RelayConfiguration.App, notification: JSON, known: Bool) async throws(NormalizationError) -> StoreAPIData? {
        let fetch = GoogleMapping.fetch(for: notification)
        guard fetch != .none else { return nil }
        guard let client = play[app.key], let packageName = app.google?.packageName else {
            throw .rejected(Rejection(.storeAPIRejected, "app \(app.key) has no google.playApi configured; the subscription's state cannot be read"))
        }
        switch fetch {
        case .none:
            return nil
        case .subscription(let token):
            let purchase = try await playCall(app) { () async throws(StoreAPIError) in try await client.subscription(packageName: packageName, purchaseToken: token) }
            var data = StoreAPIData(subscription: purchase)
            if GoogleMapping.isPurchase(notification), let linked = purchase.text("linkedPurchaseToken") {
                if GoogleMapping.replacedProductId(purchase) == nil {
                    data.replacedProductId = try await replacedProduct(linked, client: client, packageName: packageName, app: app)
                }
                data.replacedOwner = try await backend { () async throws(BackendError) in
                    try await stateStore.subscription(store: .google, originalTransactionId: linked)
                }?.ownerAppUserId
            }
            // A token the relay has not seen may continue a subscription `import revenuecat` brought in, which the
            // export keys by its first order id (it carries no purchase token): the token takes it over.
            if !known, let base = GoogleMapping.firstOrderId(purchase), base != token,
                let imported = try await backend({ () async throws(BackendError) in try await stateStore.subscription(store: .google, originalTransactionId: base) })
            {
                // Only what the takeover reads: its key, its users and its payments.
                data.imported = SubscriptionState(
                    store: .google, originalTransactionId: imported.originalTransactionId, applicationId: imported.applicationId,
                    originalAppUserId: imported.originalAppUserId, productId: imported.productId, status: imported.status, environment: imported.environment,
                    sourceTimestamp: imported.sourceTimestamp, transactions: imported.transactions, ownerAppUserId: imported.ownerAppUserId
                ).json
            }
            return data
        case .product(let productId, let token):
            return StoreAPIData(
                product: try await playCall(app) { () async throws(StoreAPIError) in
                    try await client.product(packageName: packageName, productId: productId, purchaseToken: token)
                })
        }
    }

    /// Acknowledges a new purchase Play still holds unacknowledged (`playApi.acknowledgePurchases`), once
    /// its state is stored: a subscription's purchase (SUBSCRIPTION_PURCHASED, also an app's hand-over) or a
    /// one-time product's, when it gives access (an active or grace-period subscription, a purchased
    /// product) and a user has it: a purchase nobody has is left to Play's automatic refund.
    ///
    /// It reads the purchase fresh first, because Play refuses a second acknowledgement and a repeat of the
    /// record must not fail on it; a refusal is read again (acknowledged meanwhile is done). Only a Play
    /// API that cannot be reached makes the record be tried again; a refusal (permissions, a state Play
    /// will not acknowledge) is logged and counted, and the record goes on: its state and events are
    /// already stored, and an acknowledgement is no reason to hold up the partition.
    func acknowledge(_ notification: VerifiedNotification, app: RelayConfiguration.App) async throws(NormalizationError) {
        guard let client = play[app.key], let packageName = app.google?.packageName else { return }
        let subscription: Bool
        let token: String
        var productId: String?
        switch GoogleMapping.fetch(for: notification.payload) {
        case .subscription(let purchaseToken) where GoogleMapping.isPurchase(notification.payload):
            (subscription, token) = (true, purchaseToken)
        case .product(let product, let purchaseToken):
            (subscription, token, productId) = (false, purchaseToken, product)
        default:
            return
        }
        let state = try await backend { () async throws(BackendError) in try await stateStore.subscription(store: .google, originalTransactionId: token) }
        guard let state, AppPurchase.holder(of: state) != nil else { return }
        func refused(_ error: StoreAPIError) throws(NormalizationError) {
            counters.storeAPIError(error)
            if error.kind == .unavailable { throw .unavailable(error.message) }
            logger.error(
                "Play did not let the relay acknowledge a purchase; the app must acknowledge it within three days",
                metadata: [LogKey.notificationApp: "\(app.key)", LogKey.notificationId: "\(notification.notificationId ?? "-")", LogKey.error: "\(error)"])
        }
        func pending() async throws(NormalizationError) -> String? {
            let purchase: JSON
            do {
                purchase = subscription
                    ? try await client.subscription(packageName: packageName, purchaseToken: token)
                    : try await client.product(packageName: packageName, productId: productId ?? "", purchaseToken: token)
            } catch {
                if error.kind != .notFound { try refused(error) }
                return nil
            }
            if subscription {
                let givesAccess = ["SUBSCRIPTION_STATE_ACTIVE", "SUBSCRIPTION_STATE_IN_GRACE_PERIOD"].contains(purchase.text("subscriptionState") ?? "")
                guard givesAccess, purchase.text("acknowledgementState") == "ACKNOWLEDGEMENT_STATE_PENDING" else { return nil }
                // `purchases.subscriptions.acknowledge` names the subscription's product, not its base plan.
                return purchase["lineItems"]?.arrayValue?.first?.text("productId")
            }
            return purchase.integer("acknowledgementState") == 0 && purchase.integer("purchaseState") == 0 ? productId : nil
        }
        guard let product = try await pending() else { return }
        do {
            try await client.acknowledge(packageName: packageName, productId: product, purchaseToken: token, subscription: subscription)
            counters.acknowledged.increment()
        } catch {
            // Acknowledged meanwhile (by the app, or an earlier try whose answer was lost) is done.
            if try await pending() != nil { try refused(error) }
        }
    }

    /// Finds a re-ingested voided purchase in the Voided Purchases API under the app's package (within
    /// Google's 30 days, from a day before its voided time, at most 20 pages), or rejects the record
    /// (`purchase_not_found`). The notification is then what Google and the stored state say, not what the
    /// record says: the voided time and whether the refund was partial from Google's entry; the product type
    /// from the stored state, else the Play Developer API (a subscription, else a one-time product).
    func confirmVoided(_ notification: VerifiedNotification, state: SubscriptionState?, app: RelayConfiguration.App)
        async throws(NormalizationError) -> VerifiedNotification
    {
        let voided = notification.payload["voidedPurchaseNotification"]
        guard let client = play[app.key], let packageName = app.google?.packageName else {
            throw .rejected(Rejection(.storeAPIRejected, "app \(app.key) has no google.playApi configured; the voided purchase cannot be confirmed"))
        }
        guard let order = voided?.text("orderId"), let token = voided?.text("purchaseToken"), let voidedAt = notification.payload.integer("eventTimeMillis")
        else {
            throw .rejected(Rejection(.malformed, "the voided purchase names no order, purchase token or time"))
        }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let start = max(voidedAt - 86_400_000, now - 30 * 86_400_000 + 60_000)
        // Google answers a refusal (a start it no longer lists) with 400: the record cannot be confirmed.
        func listed(_ body: () async throws(StoreAPIError) -> JSON) async throws(NormalizationError) -> JSON {
            do {
                return try await body()
            } catch {
                if error.kind == .unavailable { throw storeAPIFailure(error, app: app) ?? .unavailable(error.message) }
                counters.storeAPIError(error)
                throw .rejected(Rejection(.purchaseNotFound, "Google's Voided Purchases API did not answer for order \(order): \(error.message)"))
            }
        }
        var pageToken: String?
        var entry: JSON?
        for _ in 0..<20 where start < now {
            let page = try await listed { () async throws(StoreAPIError) in
                try await client.voidedPurchases(packageName: packageName, startTime: start, endTime: now, pageToken: pageToken)
            }
            entry = page["voidedPurchases"]?.arrayValue?.first { $0.text("orderId") == order && $0.text("purchaseToken") == token }
            pageToken = page["tokenPagination"]?.text("nextPageToken")
            if entry != nil || pageToken == nil { break }
        }
        guard let entry else {
            throw .rejected(Rejection(.purchaseNotFound, "Google's Voided Purchases API does not list order \(order) of this purchase"))
        }
        let productType: Int64
        if let state {
            productType = state.expiresAt == nil && !state.autoRenew ? 2 : 1
        } else {
            do {
                _ = try await client.subscription(packageName: packageName, purchaseToken: token)
                productType = 1
            } catch {
                guard error.kind == .notFound || error.status == 400 else { throw storeAPIFailure(error, app: app) ?? .unavailable(error.message) }
                productType = 2
            }
        }
        var confirmed = notification
        let voidedTime = entry.integer("voidedTimeMillis") ?? voidedAt
        let quantity = entry["voidedQuantity"].map { !$0.isNull } ?? false
        confirmed.payload = [
            "version": "1.0", "packageName": .string(packageName), "eventTimeMillis": .string(String(voidedTime)),
            "voidedPurchaseNotification": [
                "purchaseToken": .string(token), "orderId": .string(order), "productType": .integer(productType), "refundType": .integer(quantity ? 2 : 1),
            ],
        ]
        return confirmed
    }

    /// The product of the purchase a plan change replaced: its stored state's, else the Play Developer
    /// API's; nil when Google no longer knows it (the new purchase still counts).
    func replacedProduct(_ token: String, client: any PlayPurchases, packageName: String, app: RelayConfiguration.App)
        async throws(NormalizationError) -> String?
    {
        let stored = try await backend { () async throws(BackendError) in try await stateStore.subscription(store: .google, originalTransactionId: token) }
        if let stored { return stored.productId }
        do {
            let purchase = try await playCall(app) { () async throws(StoreAPIError) in try await client.subscription(packageName: packageName, purchaseToken: token) }
            return GoogleMapping.productId(ofPurchase: purchase)
        } catch {
            if case .rejected(let rejection) = error, rejection.reason == .purchaseNotFound { return nil }
            throw error
        }
    }

    /// A Play Developer API call: a purchase Google does not know is rejected; anything else as `storeAPIFailure` says.
    func playCall(_ app: RelayConfiguration.App, _ body: () async throws(StoreAPIError) -> JSON) async throws(NormalizationError) -> JSON {
        do {
            return try await body()
        } catch {
            throw storeAPIFailure(error, app: app) ?? .rejected(Rejection(.purchaseNotFound, error.message))
        }
    }

    /// One classification of store API failures for every store: nil when the store does not know the
    /// object (the caller decides what that means); our side (credentials, console permissions) or a broken
    /// answer is retried, in order, until fixed (rejecting would lose the notification's place in its
    /// subscription's history); an unreachable API is tried again later.
    func storeAPIFailure(_ error: StoreAPIError, app: RelayConfiguration.App) -> NormalizationError? {
        counters.storeAPIError(error)
        switch error.kind {
        case .notFound:
            return nil
        case .rejected, .configuration, .invalidResponse:
            logger.error(
                "the \(error.api.rawValue) refused the request; retrying until it is fixed",
                metadata: [LogKey.notificationApp: "\(app.key)", LogKey.error: "\(error)"])
            return .unavailable(error.message)
        case .unavailable:
            return .unavailable(error.message)
        }
    }
}
