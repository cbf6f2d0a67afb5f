import Foundation
import Logging

import RelayConfig
import RelayCore
import RelayHTTPClient

/// What every store history command shares: the app it runs for, the backend it reads, and the time
/// window it may ask its store for.
enum HistoryRun {
    /// The app with key `appKey` and its index in `apps` (for the keys errors name).
    static func app(_ configuration: RelayConfiguration, key appKey: String) throws(CommandFailure) -> (app: RelayConfiguration.App, index: Int) {
        guard let index = configuration.apps.firstIndex(where: { $0.key == appKey }) else {
            throw CommandFailure(
                .badArguments, "no app with key \(appKey) in the configuration; apps are \(configuration.apps.map(\.key).joined(separator: ", "))")
        }
        return (configuration.apps[index], index)
    }

    /// The backend the commands read (events, states) with `backend.apiKey`.
    static func backend(_ configuration: RelayConfiguration, url: String?, http: HTTPClient, logger: Logger) throws(CommandFailure) -> HistoryBackend {
        guard let apiKey = configuration.backend.clientKey, !apiKey.isEmpty else {
            throw CommandFailure(.configuration, "backend.apiKey is not set: the commands read the backend's events and subscriptions with it")
        }
        return HistoryBackend(configuration: configuration.backend, url: url ?? configuration.backend.url, http: http, logger: logger)
    }

    /// The end of the window [`since`, `until` or now), checked: `since` within the `days` the store keeps
    /// (`what` names them), and before the end.
    static func window(since: Int64, until: Int64?, now: Int64, days: Int64?, what: String) throws(CommandFailure) -> Int64 {
        if let days {
            let oldest = now - days * 86_400_000
            guard since >= oldest else {
                throw CommandFailure(
                    .badArguments,
                    "--since \(Timestamp.rfc3339(milliseconds: since)) is older than the \(days) days of \(what);"
                        + " use --since \(Timestamp.rfc3339(milliseconds: oldest + 60_000)) or later")
            }
        }
        let end = min(until ?? now, now)
        guard since < end else { throw CommandFailure(.badArguments, "--since must be before --until (and before now)") }
        return end
    }

    /// What to say when an append fails, for each kind of command: running it again is safe.
    static let importAgain = "run the same import again: what was imported is skipped"
    static let reconcileAgain = "run reconcile again: corrected subscriptions are in sync then"
    static let recoverAgain = "run the same recover again: what was appended is skipped once processed"

    /// Appends `records` to `topic` in one batch (one subscription's, in order, on one key), or fails saying
    /// what to do (`rerun`).
    static func append(_ records: [OutgoingRecord], producer: any RecordProducer, topic: String, rerun: String) async throws(CommandFailure) {
        do {
            _ = try await producer.produce(records)
        } catch {
            throw CommandFailure(.unavailable, "appending to \(topic) failed (\(error)); \(rerun)")
        }
    }

    static func clock(_ now: (@Sendable () -> Int64)?) -> @Sendable () -> Int64 {
        now ?? { Int64(Date().timeIntervalSince1970 * 1000) }
    }
}

/// What a recover command that appends records did (`recover stripe`, `recover google`).
public struct RecoveredSummary: Sendable, Equatable {
    /// What the store listed for the period (events, voided purchases).
    public var found = 0
    /// Of those, what the relay already processed (or recorded).
    public var alreadyProcessed = 0
    /// Appended to the notifications topic for the worker.
    public var reingested = 0

    public init(found: Int = 0, alreadyProcessed: Int = 0, reingested: Int = 0) {
        self.found = found
        self.alreadyProcessed = alreadyProcessed
        self.reingested = reingested
    }
}

/// One subscription whose stored state differed from the store's, and what `reconcile` appended for it
/// (every store's).
public struct ReconcileCorrection: Sendable, Equatable {
    /// The subscription's key (`originalTransactionId`: Apple's, a purchase token, a `sub_` id).
    public var originalTransactionId: String
    public var stored: String
    /// What the store says, in the same words.
    public var found: String
    /// What was appended: the notification (`DID_RENEW`, `SUBSCRIPTION_RENEWED`) or the events the records
    /// stand for (`invoice.paid, customer.subscription.updated`).
    public var action: String
    /// The store, for the line (`Apple`, `Google`, `Stripe`, `Paddle`).
    public var storeName: String

    public init(originalTransactionId: String, stored: String, found: String, action: String, storeName: String) {
        self.originalTransactionId = originalTransactionId
        self.stored = stored
        self.found = found
        self.action = action
        self.storeName = storeName
    }

    public var line: String { "\(originalTransactionId): \(stored) → \(storeName) \(found): \(action) appended" }

    /// A side of the line: `ACTIVE price_pro (not renewing) until 2026-12-01T00:00:00.000Z`; without `price`
    /// (Google's states name no price) `ACTIVE until …`.
    static func describe(_ status: String, autoRenew: Bool, until: Int64?, price: String? = nil) -> String {
        let expiry = until.map { " until \(Timestamp.rfc3339(milliseconds: $0))" } ?? ""
        return "\(status)\(price.map { " \($0)" } ?? "")\(autoRenew ? "" : " (not renewing)")\(expiry)"
    }
}

/// What `reconcile stripe` and `reconcile paddle` compare of a store's subscription.
protocol ObservedWebSubscription {
    var status: String { get }
    /// Unix milliseconds.
    var periodEnd: Int64? { get }
    var autoRenew: Bool { get }
    var priceId: String? { get }
}

extension ObservedWebSubscription {
    /// The `reconcile` value of the subscription's record: what the store answered, so that a run repeated
    /// before the worker caught up appends the same record id.
    var reconcileKey: String { "\(status):\(periodEnd ?? 0):\(autoRenew):\(priceId ?? "-")" }

    /// `state` corrected by `records` (doing `actions`), or in sync when there are none.
    func check(_ state: SubscriptionState, records: [OutgoingRecord], actions: [String], storeName: String) -> ReconcileCheck {
        guard !records.isEmpty else { return .inSync }
        return .corrected(
            records,
            ReconcileCorrection(
                originalTransactionId: state.originalTransactionId,
                stored: ReconcileCorrection.describe(state.status.rawValue, autoRenew: state.autoRenew, until: state.expiresAt, price: state.productId),
                found: ReconcileCorrection.describe(status, autoRenew: autoRenew, until: periodEnd, price: priceId ?? "-"),
                action: actions.joined(separator: ", "), storeName: storeName))
    }
}

/// What a `reconcile` command did.
public struct ReconcileSummary: Sendable, Equatable {
    public var checked = 0
    public var inSync = 0
    public var corrections: [ReconcileCorrection] = []
    /// App Store subscriptions of the other environment than `serverApi`'s: not checked.
    public var otherEnvironment = 0
    /// Subscriptions the store could not answer for, with the reason.
    public var failures: [String] = []

    public init() {}
}

/// What `import stripe` or `import paddle` did.
public struct SubscriptionImportSummary: Sendable, Equatable {
    /// Subscriptions the store listed for the app.
    public var subscriptions = 0
    /// Of those, subscriptions the relay holds (from the store's notifications, or an earlier run): only their
    /// unrecorded payments and refunds are brought in.
    public var alreadyKnown = 0
    /// Subscriptions imported, and the renewals and refunds appended.
    public var imported = 0
    public var renewals = 0
    public var refunds = 0
    /// Subscriptions of prices the app does not list: another app's.
    public var otherApps = 0

    public init() {}
}
