import Foundation
import RelayAppStoreAPI
import RelayConfig
import RelayCore
import RelayVerification

extension AppleHistoryCommands {
    public typealias Correction = ReconcileCorrection

    /// For each of the app's Apple subscriptions the backend lists as active or changed since `since`,
    /// Get All Subscription Statuses; where Apple's status or expiry differs from the stored state, an
    /// apple-api record (delivered, not historical: these are missed events) with the type that brings
    /// the state to Apple's, notificationUUID `reconcile:<Apple's last transactionId>:<Apple's status>`:
    /// the same on every run until Apple's answer changes (Apple signs each answer when it answers), so a
    /// run repeated before the worker caught up yields the same event ids and is absorbed.
    public func reconcile(
        since: Int64?, progress: @escaping @Sendable (String) -> Void = { _ in }, corrected: @Sendable (Correction) -> Void = { _ in }
    ) async throws(Failure) -> ReconcileSummary {
        let loop = HistoryLoop(pacing: pacing, progress: progress)
        let environment = client.environment == .production ? "PRODUCTION" : "SANDBOX"
        return try await loop.reconcile(
            backend, store: .apple, applicationId: app.applicationId, since: since, producer: producer, topic: topic, corrected: corrected
        ) { state, _ throws(Failure) in
            // A grandfathering grant is no App Store subscription: Apple has no status for it. Nor has
            // a one-time purchase (no renewal, no expiry; the backend no longer lists them).
            if state.productId.hasPrefix(AppTransactionGrant.productPrefix) { return .skipped }
            if !state.autoRenew, state.expiresAt == nil { return .skipped }
            guard state.environment == environment else { return .otherEnvironment }
            let statuses: SubscriptionStatusesResponse
            do throws(AppStoreAPIError) {
                statuses = try await loop.call("the subscription's statuses") { () async throws(AppStoreAPIError) in
                    try await client.subscriptionStatuses(transactionId: state.originalTransactionId)
                }
            } catch {
                if error.kind == .keyRefused || error.kind == .configuration { throw Failure(.configuration, error.message) }
                return .failed(error.message)
            }
            guard let last = statuses.data.flatMap(\.lastTransactions).first(where: { $0.originalTransactionId == state.originalTransactionId })
            else { return .failed("Apple lists no status for this subscription") }
            let transaction: JSON
            var renewal: JSON?
            do {
                transaction = try verifier.verifySignedData(last.signedTransactionInfo)
                if let signed = last.signedRenewalInfo { renewal = try verifier.verifySignedData(signed) }
            } catch {
                return .failed("Apple's signed status was rejected (\(error))")
            }
            guard let (type, subtype) = Self.correction(stored: state, appleStatus: last.status, transaction: transaction, renewal: renewal) else {
                return .inSync
            }
            let transactionId = transaction["transactionId"]?.stringValue ?? state.originalTransactionId
            let record = apiRecord(
                subject: state.originalTransactionId, type: type, subtype: subtype, uuid: "reconcile:\(transactionId):\(last.status)",
                signedTransaction: last.signedTransactionInfo, signedRenewal: last.signedRenewalInfo, historical: false, deliver: true)
            return .corrected(
                [record],
                Correction(
                    originalTransactionId: state.originalTransactionId, stored: Self.describe(status: state.status.rawValue, expiresAt: state.expiresAt),
                    found: Self.describe(apple: last.status, expiresAt: transaction["expiresDate"]?.int64Value),
                    action: subtype.map { "\(type)/\($0)" } ?? type, storeName: "Apple"))
        }
    }

    /// The notification type (and subtype) that makes the normalizer reach Apple's `status`, or nil when
    /// the stored state already agrees.
    static func correction(stored: SubscriptionState, appleStatus: Int, transaction: JSON, renewal: JSON?) -> (String, String?)? {
        let expires = transaction["expiresDate"]?.int64Value
        switch SubscriptionStatus(rawValue: appleStatus) {
        case .active:
            if stored.status == .active, (expires ?? 0) <= (stored.expiresAt ?? 0) { return nil }
            // A transaction the state already holds was paid for already: Apple extended it (or the state
            // only lags). RENEWAL_EXTENDED moves no money; DID_RENEW would record a renewal that never was.
            if let id = transaction["transactionId"]?.stringValue, id == stored.lastTransactionId || stored.transaction(id) != nil {
                return ("RENEWAL_EXTENDED", nil)
            }
            return ("DID_RENEW", nil)
        case .expired:
            if [.expired, .revoked, .refunded].contains(stored.status) { return nil }
            let subtype: String? =
                switch renewal?["expirationIntent"]?.int64Value {
                case 1: "VOLUNTARY"
                case 2: "BILLING_RETRY"
                case 3: "PRICE_INCREASE"
                case 4: "PRODUCT_NOT_FOR_SALE"
                default: nil
                }
            return ("EXPIRED", subtype)
        case .billingRetry:
            return stored.status == .inBillingRetry ? nil : ("DID_FAIL_TO_RENEW", nil)
        case .billingGracePeriod:
            return stored.status == .inGracePeriod ? nil : ("DID_FAIL_TO_RENEW", "GRACE_PERIOD")
        case .revoked:
            if [.revoked, .refunded].contains(stored.status) { return nil }
            // A family member's access ends with REVOKE; the purchaser's refund is a REFUND.
            return transaction["inAppOwnershipType"]?.stringValue == "FAMILY_SHARED" ? ("REVOKE", nil) : ("REFUND", nil)
        case nil:
            return nil
        }
    }
}
