public import CoreMetrics
import Foundation
public import Logging
public import RelayBackend
public import RelayConfig
public import RelayCore
public import RelayGooglePlay
public import RelayVerification

/// Why a verified notification produced no events.
public enum NormalizationError: Error, Sendable, CustomStringConvertible {
    /// The notification cannot be normalized as it is (Google: the Play Developer API does not know the
    /// purchase, or refuses us). It goes to the rejected topic with this reason.
    case rejected(Rejection)
    /// The backend or a store API is unreachable: try the record again later.
    case unavailable(String)

    public var description: String {
        switch self {
        case .rejected(let rejection): "rejected: \(rejection)"
        case .unavailable(let message): "unavailable: \(message)"
        }
    }
}

/// Verified store notifications → standardized events (DESIGN section 5), with the subscription's
/// state kept in the backend:
///
/// 1. Google: fetch the subscription's real state from the Play Developer API.
/// 2. Map the notification with the store's table (`AppleMapping`, `GoogleMapping`, `StripeMapping`,
///    `PaddleMapping`) against the stored state.
/// 3. Write the new state with If-Match (a 412 reads and maps again); a notification older than the
///    stored state leaves it as it is (`sourceTimestamp` never goes back) but still yields its events.
/// 4. The user's `subscriptionStatus` before and after (this subscription plus the user's other active
///    ones, through the product mapping); `subscription_status_did_change` when it differs.
///
/// A notification id already in the state's `recentNotifications` changes nothing and yields the same
/// events as the first time, from what was recorded then.
public final class Normalizer: Sendable {
    /// How many applied notification ids a state remembers.
    public static let recentNotificationLimit = 16

    private let configuration: RelayConfiguration
    private let stateStore: any SubscriptionStateStore
    private let rates: ExchangeRates
    private let play: [String: GooglePlayClient]
    private let logger: Logger
    private let metrics: any MetricsFactory

    /// Reads the exchange rates and builds a Play Developer API client per app that configures one.
    public init(
        configuration: RelayConfiguration, stateStore: any SubscriptionStateStore, logger: Logger, metrics: any MetricsFactory,
        playClient: ((RelayConfiguration.PlayAPI) throws(PlayAPIError) -> GooglePlayClient)? = nil
    ) throws(ConfigurationError) {
        self.configuration = configuration
        self.stateStore = stateStore
        self.rates = try ExchangeRates.load(path: configuration.money.exchangeRates)
        var play: [String: GooglePlayClient] = [:]
        for (index, app) in configuration.apps.enumerated() {
            guard let api = app.google?.playApi else { continue }
            do throws(PlayAPIError) {
                if let playClient {
                    play[app.key] = try playClient(api)
                } else {
                    play[app.key] = try GooglePlayClient(configuration: api, logger: logger)
                }
            } catch {
                throw ConfigurationError(key: "apps[\(index)].google.playApi", message: error.message)
            }
        }
        self.play = play
        self.logger = logger
        self.metrics = metrics
    }

    /// The standardized events of one verified notification; `receivedAt` is its `relay-received-at`.
    public func normalize(_ notification: VerifiedNotification, receivedAt: Int64) async throws(NormalizationError) -> [StandardEvent] {
        guard let app = configuration.app(notification.app) else { return [] }
        var input = MappingInput(notification: notification, app: app, receivedAt: receivedAt, play: nil)

        // Google's subject (the purchase token) is in the notification; its Play data is fetched only
        // after the dedup check below, so a repeat replays what was recorded without calling Google.
        let first = map(input, prior: nil)
        guard first.recognized else {
            Counter(
                label: "relay_notifications_unmapped_total", dimensions: [("store", notification.store.rawValue)], factory: metrics
            ).increment()
            logger.warning(
                "notification type not mapped; no events",
                metadata: [
                    LogKey.notificationStore: "\(notification.store.rawValue)", LogKey.notificationType: "\(notification.type ?? "-")",
                    LogKey.notificationId: "\(notification.notificationId ?? "-")",
                ])
            return []
        }
        // Without a subject there is no state to read; with one, the stored state decides (an invoice
        // names its price only through the subscription the relay already knows).
        guard first.subject != nil || !first.events.isEmpty else { return [] }
        let mapping = try await backend { () async throws(BackendError) in try await stateStore.productMapping(applicationId: app.applicationId) }
        guard let subject = first.subject else {
            return build(first, input: input, subject: nil, prior: nil, after: nil, others: [], mapping: mapping)
        }

        var fetched = notification.store != .google
        for _ in 0..<10 {
            let current = try await backend { () async throws(BackendError) in
                try await stateStore.subscription(store: notification.store, originalTransactionId: subject)
            }
            if let id = notification.notificationId, let recent = current?.recentNotifications.last(where: { $0.id == id }),
                let context = AppliedContext(recent.context)
            {
                // Seen before: the same events, from what was recorded when it was applied.
                var replay = input
                replay.receivedAt = context.receivedAt
                replay.play = context.play
                let again = mapAgainst(replay, prior: context.prior)
                let after = merge(context.prior, again) ?? context.prior
                return build(again, input: replay, subject: subject, prior: context.prior, after: after, others: context.others, mapping: mapping)
            }
            if !fetched {
                input.play = try await fetchPlay(app: app, notification: notification.payload)
                fetched = true
            }
            let result = mapAgainst(input, prior: current)
            guard result.state != nil || !result.events.isEmpty else { return [] }
            var next = merge(current, result)
            let user = (next ?? current)?.entitlementUserIds.first
            var others: [String] = []
            if let user, !user.hasPrefix("$RelayAnonymous:") {
                others = try await backend { () async throws(BackendError) in
                    try await stateStore.otherActiveSubscriptions(appUserId: user, excluding: notification.store, originalTransactionId: subject)
                }.flatMap { mapping.entitlements(of: $0) }
            }
            // A notification with events but no state change is still remembered in a stored state,
            // so that a repeat yields these events rather than ones built from a later state.
            if next == nil, let current, notification.notificationId != nil, !result.events.isEmpty {
                next = current
            }
            guard var state = next else {
                return build(result, input: input, subject: subject, prior: current, after: current, others: others, mapping: mapping)
            }
            if let id = notification.notificationId {
                let context = AppliedContext(receivedAt: receivedAt, prior: current, others: others, play: input.play)
                state.recentNotifications.append(.init(id: id, context: context.json))
                state.recentNotifications = Array(state.recentNotifications.suffix(Self.recentNotificationLimit))
            }
            let written = try await backend { () async throws(BackendError) in try await stateStore.write(state, ifMatch: current?.version ?? 0) }
            switch written {
            case .written:
                return build(result, input: input, subject: subject, prior: current, after: state, others: others, mapping: mapping)
            case .versionMismatch, .stale:
                Counter(label: "relay_backend_write_conflicts_total", dimensions: [], factory: metrics).increment()
                continue
            }
        }
        throw .unavailable("subscription \(notification.store.rawValue)/\(subject) kept changing under 10 attempts")
    }

    /// A backend call whose failure means "try the record again later".
    private func backend<Value>(_ body: () async throws(BackendError) -> Value) async throws(NormalizationError) -> Value {
        do {
            return try await body()
        } catch {
            throw .unavailable("\(error)")
        }
    }

    // MARK: Mapping and state

    private func map(_ input: MappingInput, prior: SubscriptionState?) -> StoreMapping {
        switch input.notification.store {
        case .apple: AppleMapping.map(input, prior: prior)
        case .google: GoogleMapping.map(input, prior: prior)
        case .stripe: StripeMapping.map(input, prior: prior)
        case .paddle: PaddleMapping.map(input, prior: prior, environment: input.app.paddle?.environment ?? "PRODUCTION")
        }
    }

    /// Maps against the stored state, unless the notification is older than it: what a late
    /// notification means cannot be read off a newer state (a late Paddle update diffed against it
    /// would invent a product change back), so it is mapped on its own, and `merge` keeps the newer state.
    private func mapAgainst(_ input: MappingInput, prior: SubscriptionState?) -> StoreMapping {
        let mapping = map(input, prior: prior)
        guard let prior, mapping.eventTime < prior.sourceTimestamp else { return mapping }
        return map(input, prior: nil)
    }

    /// The state to store after `mapping`, or nil when nothing changes. An older notification leaves a
    /// newer stored state as it is.
    private func merge(_ current: SubscriptionState?, _ mapping: StoreMapping) -> SubscriptionState? {
        guard var state = mapping.state else { return nil }
        state.recentNotifications = current?.recentNotifications ?? []
        state.version = current?.version ?? 0
        guard let current else { return state }
        if mapping.eventTime < current.sourceTimestamp {
            var kept = current
            kept.recentNotifications = state.recentNotifications
            return kept
        }
        for id in current.appUserIds where !state.appUserIds.contains(id) { state.appUserIds.append(id) }
        if state.originalAppUserId == nil { state.originalAppUserId = current.originalAppUserId }
        return state
    }

    // MARK: Events

    private func build(
        _ result: StoreMapping, input: MappingInput, subject: String?, prior: SubscriptionState?, after: SubscriptionState?, others: [String],
        mapping: ProductMapping
    ) -> [StandardEvent] {
        let notification = input.notification
        let store = notification.store
        let storeName = ProductMapping.storeName(store)
        let base = notification.notificationId.map { "\(store.rawValue):\($0)" } ?? "\(store.rawValue):\(subject ?? "-"):\(result.eventTime)"
        let before = SubscriptionStatus(entitlements: others + (prior.map { $0.grantsAccess ? mapping.entitlements(of: $0) : [] } ?? []))
        let status = SubscriptionStatus(entitlements: others + (after.map { $0.grantsAccess ? mapping.entitlements(of: $0) : [] } ?? []))
        let appUserId = after?.originalAppUserId ?? result.appUserId
        let source: JSON = [
            "store": .string(store.rawValue), "notificationId": notification.notificationId.map(JSON.string) ?? .null,
            "type": notification.type.map(JSON.string) ?? .null, "subtype": notification.subtype.map(JSON.string) ?? .null,
        ]
        let eventSubject = subject ?? after?.originalTransactionId ?? base
        // A notification that names neither a known subscription nor a user (a stand-alone Stripe
        // refund) cannot say the user's status: the SDK's UNKNOWN, not a made-up INACTIVE.
        let statusJSON: JSON = after == nil && prior == nil && appUserId == nil ? ["status": "UNKNOWN", "entitlements": []] : status.json
        var events: [StandardEvent] = []
        for draft in result.events {
            let id = "\(draft.idBase ?? base):\(draft.type.rawValue)"
            let productEntitlements = entitlements(of: draft.productId, store: store, states: [after, prior], mapping: mapping)
            let money = MoneyFields.compute(
                amount: draft.amount ?? (draft.movesMoney ? nil : .some(Amount(0, "USD"))), taxPercentage: draft.taxPercentage,
                storeName: storeName, money: configuration.money, rates: rates)
            if let missing = money.missingRate { countMissingRate(missing, event: id) }
            let data: [String: JSON] = [
                "id": .string(id), "name": .string(draft.type.rawValue),
                "cancelReason": draft.cancelReason.map(JSON.string) ?? .null,
                "expirationReason": draft.expirationReason.map(JSON.string) ?? .null,
                "exchangeRate": draft.amount == nil ? .null : money.exchangeRate?.json ?? .null, "isSmallBusiness": .bool(money.isSmallBusiness),
                "periodType": .string(draft.periodType.rawValue), "countryCode": draft.countryCode.map(JSON.string) ?? .null,
                "price": money.price?.json ?? .null, "proceeds": money.proceeds?.json ?? .null,
                "priceInPurchasedCurrency": money.priceInPurchasedCurrency?.json ?? .null,
                "currencyCode": draft.amount == nil ? .null : money.currencyCode.map(JSON.string) ?? .null,
                "taxPercentage": money.taxPercentage?.json ?? .null, "commissionPercentage": money.commissionPercentage.json,
                "takehomePercentage": money.takehomePercentage.json, "offerCode": draft.offerCode.map(JSON.string) ?? .null,
                "isFamilyShare": .bool(draft.isFamilyShare), "expirationAt": draft.expirationAt.map(JSON.integer) ?? .null,
                "transactionId": draft.transactionId.map(JSON.string) ?? .null, "originalTransactionId": .string(eventSubject),
                "originalAppUserId": appUserId.map(JSON.string) ?? .null, "store": .string(storeName),
                "purchasedAt": draft.purchasedAt.map(JSON.integer) ?? .null, "productId": draft.productId.map(JSON.string) ?? .null,
                "environment": .string(result.environment), "isTrialConversion": .bool(draft.isTrialConversion),
                "newProductId": draft.newProductId.map(JSON.string) ?? .null, "bundleId": result.bundleId.map(JSON.string) ?? .null,
                "ts": .integer(result.eventTime), "sdkEvents": .array(draft.sdkEvents.map(JSON.string)),
                "entitlements": SubscriptionStatus.entitlementList(productEntitlements), "subscriptionStatus": statusJSON,
                "gracePeriodExpiresAt": draft.gracePeriodExpiresAt.map(JSON.integer) ?? .null, "source": source,
            ]
            events.append(event(draft.type, id: id, subject: eventSubject, environment: result.environment, app: input.app, receivedAt: input.receivedAt, data: data))
        }
        if before != status, let user = (after ?? prior)?.entitlementUserIds.first ?? appUserId {
            let id = "\(base):\(EventType.subscriptionStatusDidChange.rawValue)"
            let data: [String: JSON] = [
                "id": .string(id), "name": .string(EventType.subscriptionStatusDidChange.rawValue), "appUserId": .string(user),
                "originalAppUserId": appUserId.map(JSON.string) ?? .null, "from": before.json, "to": status.json,
                "store": .string(storeName), "environment": .string(result.environment), "originalTransactionId": .string(eventSubject),
                "productId": (after ?? prior).map { JSON.string($0.productId) } ?? .null, "ts": .integer(result.eventTime),
                "sdkEvents": [.string(SDKEvent.subscriptionStatusDidChange)],
                "entitlements": SubscriptionStatus.entitlementList(status.entitlements), "subscriptionStatus": status.json, "source": source,
            ]
            events.append(
                event(.subscriptionStatusDidChange, id: id, subject: eventSubject, environment: result.environment, app: input.app, receivedAt: input.receivedAt, data: data))
        }
        for event in events {
            Counter(label: "relay_events_total", dimensions: [("store", store.rawValue), ("type", event.type.rawValue)], factory: metrics).increment()
        }
        return events
    }

    private func event(
        _ type: EventType, id: String, subject: String, environment: String, app: RelayConfiguration.App, receivedAt: Int64, data: [String: JSON]
    ) -> StandardEvent {
        StandardEvent(
            type: type, id: id, subject: subject, environment: environment,
            payload: [
                "object": "event", "type": .string(type.rawValue), "projectId": .integer(Int64(app.projectId)),
                "applicationId": .integer(Int64(app.applicationId)), "timestamp": .integer(receivedAt), "data": .object(data),
            ])
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
        Counter(label: "relay_exchange_rate_missing_total", dimensions: [("currency", label)], factory: metrics).increment()
        logger.warning(
            "no exchange rate for the purchase currency; price, proceeds and exchangeRate are null",
            metadata: ["currency": "\(currency)", "event.id": "\(event)"])
    }

    // MARK: Google Play Developer API

    private func fetchPlay(app: RelayConfiguration.App, notification: JSON) async throws(NormalizationError) -> PlayData? {
        let fetch = GoogleMapping.fetch(for: notification)
        guard fetch != .none else { return nil }
        guard let client = play[app.key], let packageName = app.google?.packageName else {
            throw .rejected(Rejection(.storeAPIRejected, "app \(app.key) has no google.playApi configured; the subscription's state cannot be read"))
        }
        do {
            switch fetch {
            case .none: return nil
            case .subscription(let token):
                return PlayData(subscription: try await client.subscription(packageName: packageName, purchaseToken: token))
            case .product(let productId, let token):
                return PlayData(product: try await client.product(packageName: packageName, productId: productId, purchaseToken: token))
            }
        } catch {
            Counter(label: "relay_play_api_errors_total", dimensions: [("kind", error.kind.rawValue)], factory: metrics).increment()
            switch error.kind {
            case .notFound:
                throw .rejected(Rejection(.purchaseNotFound, error.message))
            case .rejected, .configuration, .invalidResponse:
                // Our side (credentials, Play Console permissions) or a broken answer: retried, in order,
                // until fixed; rejecting would lose the purchase's place in its subscription's history.
                logger.error(
                    "the Play Developer API refused the request; retrying until it is fixed",
                    metadata: [LogKey.notificationApp: "\(app.key)", LogKey.error: "\(error)"])
                throw .unavailable(error.message)
            case .unavailable:
                throw .unavailable(error.message)
            }
        }
    }
}

extension EventDraft {
    /// Whether money moves with this event: a purchase, a renewal, a refund or its reversal, an upgrade
    /// charged now. Other events carry a price of 0; a money event whose amount the store does not
    /// report carries null.
    var movesMoney: Bool {
        switch type {
        case .initialPurchase, .renewal, .nonRenewingPurchase, .refundReversed: true
        case .cancellation: cancelReason == Reason.customerSupport
        case .productChange: amount != nil
        default: false
        }
    }
}

/// What the normalizer recorded when it applied a notification (`recentNotifications[].context`).
struct AppliedContext {
    var receivedAt: Int64
    var prior: SubscriptionState?
    var others: [String]
    /// Google: the Play Developer API's answers the notification was mapped with.
    var play: PlayData?

    init(receivedAt: Int64, prior: SubscriptionState?, others: [String], play: PlayData?) {
        self.receivedAt = receivedAt
        self.prior = prior.map {
            var stripped = $0
            stripped.recentNotifications = []
            stripped.version = 0
            return stripped
        }
        self.others = others
        self.play = play
    }

    init?(_ json: JSON) {
        guard let receivedAt = json["receivedAt"]?.int64Value else { return nil }
        self.receivedAt = receivedAt
        if let prior = json["prior"], !prior.isNull {
            guard let state = try? SubscriptionState(json: prior) else { return nil }
            self.prior = state
        } else {
            self.prior = nil
        }
        self.others = json["others"]?.arrayValue?.compactMap(\.stringValue) ?? []
        if let play = json["play"], !play.isNull {
            self.play = PlayData(subscription: play.present("subscription"), product: play.present("product"))
        }
    }

    var json: JSON {
        var json: [String: JSON] = ["receivedAt": .integer(receivedAt), "prior": prior?.json ?? .null, "others": .array(others.map(JSON.string))]
        if let play { json["play"] = ["subscription": play.subscription ?? .null, "product": play.product ?? .null] }
        return .object(json)
    }
}
