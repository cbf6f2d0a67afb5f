import CoreMetrics
import Foundation
import Logging
import RelayBackend
import RelayConfig
import RelayCore
import RelayHTTPClient

/// The backend as the store history commands read it: the events store (what was recorded of a
/// subscription or a notification) and the subscriptions list, each failure said for the command line.
struct HistoryBackend: Sendable {
    let client: BackendClient
    let url: String

    init(configuration: RelayConfiguration.Backend, url: String, http: HTTPClient, logger: Logger) {
        var url = url
        while url.hasSuffix("/") { url.removeLast() }
        self.url = url
        client = BackendClient(configuration: configuration, address: BackendAddress(url), http: http, logger: logger, metrics: NOOPMetricsHandler.instance)
    }

    /// Whether any event was recorded for this notification id.
    func hasEvents(notificationId: String) async throws(CommandFailure) -> Bool {
        do {
            return try await client.hasEvents(notificationId: notificationId)
        } catch {
            throw CommandFailure(error, backendURL: url)
        }
    }

    /// What the events store holds of one Apple subscription, live or imported.
    struct RecordedEvents {
        /// The store notification ids of its events (`import:<transactionId>` for an import's).
        var notificationIds = Set<String>()
        /// Transactions with a money event: initial_purchase, renewal or non_renewing_purchase.
        var paidTransactionIds = Set<String>()
        /// Transactions taken back: a REFUND's cancellation (CUSTOMER_SUPPORT) or a REVOKE's expiration.
        var revokedTransactionIds = Set<String>()

        /// Whether the live pipeline already recorded what this import record stands for: the payment of
        /// a purchase record (SUBSCRIBED, DID_RENEW, ONE_TIME_CHARGE) or the refund or revocation of a
        /// revocation record (REFUND, REVOKE).
        func covers(_ record: AppleHistoryCommands.ImportRecord) -> Bool {
            switch record.type {
            case "REFUND", "REVOKE": revokedTransactionIds.contains(record.transactionId)
            default: paidTransactionIds.contains(record.transactionId)
            }
        }

        mutating func add(_ event: JSON) {
            let data = event["data"]
            if let id = data?["source"]?["notificationId"]?.stringValue { notificationIds.insert(id) }
            guard let transactionId = data?["transactionId"]?.stringValue, let type = event["type"]?.stringValue else { return }
            switch type {
            case EventType.initialPurchase.rawValue, EventType.renewal.rawValue, EventType.nonRenewingPurchase.rawValue:
                paidTransactionIds.insert(transactionId)
            case EventType.cancellation.rawValue where data?["cancelReason"]?.stringValue == Reason.customerSupport.rawValue:
                // What the Apple mapping makes of a REFUND.
                revokedTransactionIds.insert(transactionId)
            case EventType.expiration.rawValue
            where data?["source"]?["type"]?.stringValue == "REVOKE" || data?["expirationReason"]?.stringValue == Reason.customerSupport.rawValue:
                // What the Apple mapping makes of a REVOKE (CUSTOMER_SUPPORT, or UNKNOWN for a family share ended).
                revokedTransactionIds.insert(transactionId)
            default:
                break
            }
        }
    }

    /// Every recorded event of a subscription (every page), live and historical, in every environment.
    func recordedEvents(originalTransactionId: String, store: Store = .apple) async throws(CommandFailure) -> RecordedEvents {
        var recorded = RecordedEvents()
        do {
            try await client.events([("originalTransactionId", originalTransactionId), ("store", store.rawValue), ("environment", "ALL")]) { page in
                for event in page { recorded.add(event) }
            }
        } catch {
            throw CommandFailure(error, backendURL: url)
        }
        return recorded
    }

    /// Links `aliases` to `user` (false: an alias belongs to another user, and the app keeps ownership).
    func linkAliases(_ aliases: [String], to user: String, applicationId: Int) async throws(CommandFailure) -> Bool {
        do {
            return try await client.linkAliases(aliases, to: user, applicationId: applicationId)
        } catch {
            throw CommandFailure(error, backendURL: url)
        }
    }

    /// The purchase token of each Google subscription the events store holds events of, by its first order id
    /// (an order id without its renewal suffix `..N`): what `import revenuecat` keys a Play subscription by
    /// when the relay knows its token already.
    func googleTokensByFirstOrder(app: String) async throws(CommandFailure) -> [String: String] {
        var tokens: [String: String] = [:]
        do {
            try await client.events([("app", app), ("store", Store.google.rawValue), ("environment", "ALL")]) { page in
                for event in page {
                    guard let order = event["data"]?["transactionId"]?.stringValue, let token = event["data"]?["originalTransactionId"]?.stringValue else { continue }
                    let base = Self.firstOrderId(order)
                    if base != token { tokens[base] = token }
                }
            }
        } catch {
            throw CommandFailure(error, backendURL: url)
        }
        return tokens
    }

    /// `GPA.1234-5678-9012-34567..3` → `GPA.1234-5678-9012-34567`.
    static func firstOrderId(_ order: String) -> String {
        guard let range = order.range(of: "..", options: .backwards), order[range.upperBound...].allSatisfy(\.isNumber) else { return order }
        return String(order[..<range.lowerBound])
    }

    /// A subscription's stored state, or nil.
    func subscription(store: Store, id: String) async throws(CommandFailure) -> SubscriptionState? {
        do {
            return try await client.subscription(store: store, originalTransactionId: id)
        } catch {
            throw CommandFailure(error, backendURL: url)
        }
    }

    /// One page of the backend's list of the application's subscriptions of `store`.
    func subscriptions(store: Store, applicationId: Int, activeOrChangedSince since: Int64?, cursor: String?) async throws(CommandFailure)
        -> (states: [SubscriptionState], next: String?)
    {
        do {
            return try await client.subscriptions(store: store, applicationId: applicationId, activeOrChangedSince: since, cursor: cursor)
        } catch {
            throw CommandFailure(error, backendURL: url)
        }
    }
}
