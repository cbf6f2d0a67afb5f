import Foundation
public import Logging
public import RelayConfig
public import RelayCore
import RelayGooglePlay
public import RelayHTTPClient

/// `revenue-relay recover google`: purchases Google refunded, charged back or revoked that the relay never
/// heard of (Play's voided-purchase notification lost in an outage, or never configured), from the Voided
/// Purchases API, re-ingested through the normal path so that a refund still takes access away and counts.
/// Each is appended as the DeveloperNotification Play would have pushed (`voidedPurchaseNotification`), with
/// `relay-source: play-api` and id `voided:<orderId>`; the worker finds it again in the Voided Purchases
/// API under the app's package before it applies it.
public struct GoogleHistoryCommands: Sendable {
    public typealias Failure = CommandFailure

    /// The days of voided purchases Google lists.
    public static let voidedDays: Int64 = 30

    public let app: RelayConfiguration.App
    let packageName: String
    let now: @Sendable () -> Int64
    let client: any PlayPurchases
    let producer: any RecordProducer
    let topic: String
    let backend: HistoryBackend
    /// How the commands wait out the Play Developer API's quotas and outages.
    public var pacing = HistoryLoop.Pacing.standard

    public init(
        configuration: RelayConfiguration, appKey: String, producer: any RecordProducer, backendURL: String? = nil,
        http: HTTPClient = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(30), maxConcurrentTransfers: 8), logger: Logger,
        now: (@Sendable () -> Int64)? = nil
    ) throws(Failure) {
        let (app, index) = try HistoryRun.app(configuration, key: appKey)
        guard let google = app.google else {
            throw Failure(.configuration, "app \(appKey) has no google section (apps[\(index)].google); the Google Play commands need one")
        }
        guard let playApi = google.playApi else {
            throw Failure(
                .configuration,
                "app \(appKey) has no Play Developer API: set apps[\(index)].google.playApi {serviceAccountKey} to a service account allowed to view financial data")
        }
        self.backend = try HistoryRun.backend(configuration, url: backendURL, http: http, logger: logger)
        do {
            client = try GooglePlayClient(configuration: playApi, http: http, logger: logger)
        } catch {
            throw Failure(.configuration, "apps[\(index)].google.playApi: \(error.message)")
        }
        self.app = app
        self.packageName = google.packageName
        self.producer = producer
        self.topic = configuration.topics.notifications
        self.now = HistoryRun.clock(now)
    }

    /// What the recover command did.
    public typealias RecoverSummary = RecoveredSummary

    /// Lists the voided purchases of [`since`, `until`) (Unix ms; `until` nil: now) and appends each the relay
    /// never recorded, oldest first. Recorded means a refund (a `cancellation` with reason CUSTOMER_SUPPORT)
    /// of the order among the purchase token's events, or `voided:<orderId>` remembered by its state.
    public func recover(since: Int64, until: Int64?, progress: @escaping @Sendable (String) -> Void = { _ in }) async throws(Failure) -> RecoverSummary {
        let now = self.now()
        let end = try HistoryRun.window(since: since, until: until, now: now, days: Self.voidedDays, what: "voided purchases Google lists")
        var summary = RecoverSummary()
        var missed: [(voided: JSON, time: Int64, state: SubscriptionState?)] = []
        let loop = HistoryLoop(pacing: pacing, progress: progress)
        try await loop.pages("the voided purchases") { pageToken throws(StoreAPIError) in
            let page = try await client.voidedPurchases(packageName: packageName, startTime: since, endTime: end, pageToken: pageToken)
            return (page, page["tokenPagination"]?["nextPageToken"]?.stringValue)
        } failure: { error in
            Self.failure(error)
        } each: { page, number throws(Failure) in
            for voided in page["voidedPurchases"]?.arrayValue ?? [] {
                guard let token = voided["purchaseToken"]?.stringValue, let order = voided["orderId"]?.stringValue else { continue }
                summary.found += 1
                if try await backend.recordedEvents(originalTransactionId: token, store: .google).revokedTransactionIds.contains(order) {
                    summary.alreadyProcessed += 1
                    continue
                }
                let state = try await backend.subscription(store: .google, id: token)
                if state?.recentNotifications.contains(where: { $0.id == "voided:\(order)" }) == true {
                    summary.alreadyProcessed += 1
                    continue
                }
                missed.append((voided, Self.milliseconds(voided["voidedTimeMillis"]) ?? now, state))
            }
            loop.report(summary.found, "voided purchases", "page \(number), \(summary.alreadyProcessed) already recorded, \(missed.count) missed")
        }
        var records: [OutgoingRecord] = []
        for (voided, time, state) in missed.sorted(by: { $0.time < $1.time }) {
            guard let token = voided["purchaseToken"]?.stringValue else { continue }
            let notification: JSON = [
                "version": "1.0", "packageName": .string(packageName), "eventTimeMillis": .string(String(time)),
                "voidedPurchaseNotification": [
                    "purchaseToken": .string(token), "orderId": voided["orderId"] ?? .null, "productType": .integer(try await productType(token, state: state, loop: loop)),
                    // A quantity-based partial refund names its quantity; anything else voids the whole order.
                    "refundType": .integer(voided["voidedQuantity"].map { $0.isNull ? 1 : 2 } ?? 1),
                ],
            ]
            records.append(
                RawNotification(
                    store: .google, app: app.key, receivedAtMilliseconds: self.now(), body: notification.serialized(), requestHeaders: [:],
                    source: RawNotification.playAPISource
                ).record(topic: topic, subject: token))
        }
        if !records.isEmpty {
            try await HistoryRun.append(records, producer: producer, topic: topic, rerun: HistoryRun.recoverAgain)
        }
        summary.reingested = records.count
        return summary
    }

    /// Play's `productType` of a voided purchase, which the Voided Purchases API does not say: 1 for a
    /// subscription (a stored state that expires, or one the Play API knows as a subscription), else 2. The
    /// worker decides it again from what it holds and Google answers; this only keys the record.
    /// `state`: the token's stored state, as the caller read it.
    private func productType(_ token: String, state: SubscriptionState?, loop: HistoryLoop) async throws(Failure) -> Int64 {
        if let state { return state.expiresAt == nil && !state.autoRenew ? 2 : 1 }
        do {
            _ = try await loop.call("a voided purchase's subscription") { () async throws(StoreAPIError) in
                try await client.subscription(packageName: packageName, purchaseToken: token)
            }
            return 1
        } catch {
            // Not a subscription's token: 404, or 400 for a one-time product's.
            if error.kind == .notFound || error.status == 400 { return 2 }
            throw Self.failure(error)
        }
    }

    static func milliseconds(_ value: JSON?) -> Int64? {
        value?.int64Value ?? value?.stringValue.flatMap { Int64($0) }
    }

    static func failure(_ error: StoreAPIError, reading what: String = "Google's voided purchases") -> Failure {
        switch error.kind {
        case .configuration, .rejected: Failure(.configuration, "the Play Developer API refused the request: \(error.message)")
        default: Failure(.unavailable, "reading \(what) failed (\(error.message)); run the same command again: what was done is skipped")
        }
    }
}
