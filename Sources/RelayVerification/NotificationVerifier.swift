public import Logging
public import RelayConfig
public import RelayCore
public import RelayHTTPClient

/// The verification stage: the verifiers of every configured app and store, built once from the
/// configuration (roots read, key files parsed), then shared by every worker lane.
public final class NotificationVerifier: Sendable {
    private struct AppVerifiers: Sendable {
        var apple: AppleVerifier?
        var google: GoogleVerifier?
        var stripe: SignedWebhookVerifier?
        var paddle: SignedWebhookVerifier?
    }

    private let apps: [String: AppVerifiers]

    /// - Parameters:
    ///   - chainCacheCapacity: Apple chains kept verified per app (0 disables the cache).
    ///   - keyRefetchInterval: how often an unknown Google `kid` may make the key source be read again.
    /// - Throws: a configuration error naming the key, when a root certificate or key file is unusable.
    public convenience init(
        configuration: RelayConfiguration, httpClient: HTTPClient = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(15)),
        logger: Logger, chainCacheCapacity: Int = 64, keyRefetchInterval: Duration = .seconds(60)
    ) throws(ConfigurationError) {
        try self.init(
            apps: configuration.apps, httpClient: httpClient, logger: logger, chainCacheCapacity: chainCacheCapacity,
            keyRefetchInterval: keyRefetchInterval)
    }

    /// The verifiers of `apps` (the configuration's `apps` section).
    public init(
        apps configuredApps: [RelayConfiguration.App], httpClient: HTTPClient = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(15)),
        logger: Logger, chainCacheCapacity: Int = 64, keyRefetchInterval: Duration = .seconds(60)
    ) throws(ConfigurationError) {
        var apps: [String: AppVerifiers] = [:]
        // Apps that name the same key source share one cache of it.
        var keySets: [String: GoogleKeySet] = [:]
        for (index, app) in configuredApps.enumerated() {
            var verifiers = AppVerifiers()
            if let apple = app.apple {
                let unsigned = AppleVerifier.unsignedEnvironments.intersection(apple.environments)
                if !unsigned.isEmpty {
                    logger.warning(
                        "app accepts unsigned Apple data: anyone can post it; never list these environments in production",
                        metadata: ["app": "\(app.key)", "environments": "\(unsigned.sorted().joined(separator: ","))"])
                }
                verifiers.apple = try AppleVerifier(
                    app: app.key, configuration: apple, configurationKey: "apps[\(index)].apple", chainCacheCapacity: chainCacheCapacity)
            }
            if let google = app.google {
                let keys: GoogleKeySet
                if let shared = keySets[google.jwks] {
                    keys = shared
                } else {
                    do {
                        keys = try GoogleKeySet(
                            source: GoogleKeySet.Source(google.jwks), httpClient: httpClient, refetchInterval: keyRefetchInterval, logger: logger)
                    } catch {
                        throw ConfigurationError(key: "apps[\(index)].google.jwks", message: "\(error)")
                    }
                    keySets[google.jwks] = keys
                }
                verifiers.google = GoogleVerifier(app: app.key, configuration: google, keys: keys)
            }
            if let stripe = app.stripe {
                verifiers.stripe = SignedWebhookVerifier(app: app.key, scheme: .stripe, secrets: stripe.signingSecrets, tolerance: stripe.tolerance)
            }
            if let paddle = app.paddle {
                verifiers.paddle = SignedWebhookVerifier(app: app.key, scheme: .paddle, secrets: paddle.secretKeys, tolerance: paddle.tolerance)
            }
            apps[app.key] = verifiers
        }
        self.apps = apps
    }

    /// The verdict on one raw notification. Timestamps are judged against its receive time.
    /// - Throws: only when no verdict can be reached yet (Google's keys unreachable); retry later.
    public func verify(_ notification: RawNotification) async throws(VerificationUnavailable) -> Verdict {
        guard let app = apps[notification.app] else {
            return .rejected(Rejection(.unknownApp, "app \"\(notification.app)\" is not configured"))
        }
        let receivedAt = notification.receivedAtMilliseconds / 1000
        // Built only when it is the verdict: a rejection's detail is sanitized scalar by scalar.
        var unconfigured: Rejection { Rejection(.unknownApp, "app \"\(notification.app)\" takes no \(notification.store.rawValue) notifications") }
        // A record the relay itself synthesized (never one the ingest wrote): the App Store Server API's
        // transactions and the local backend's grandfathering grants, for Apple apps.
        if let source = notification.source {
            let known =
                switch notification.store {
                case .apple: [RawNotification.appleAPISource, AppTransactionGrant.source, AppPurchase.source, RevenueCatRecord.source]
                case .promotional: [PromotionalGrant.source]
                case .stripe: [AppPurchase.source, RawNotification.stripeAPISource, RevenueCatRecord.source]
                case .google: [AppPurchase.source, RawNotification.playAPISource, RevenueCatRecord.source]
                case .paddle: [AppPurchase.source, RawNotification.paddleAPISource]
                default: [AppPurchase.source]
                }
            guard known.contains(source) else {
                return .rejected(
                    Rejection(
                        .malformed,
                        "relay-source \"\(source)\" is not known for \(notification.store.rawValue) records; only \(known.joined(separator: ", ")) are"))
            }
        }
        if notification.source == RevenueCatRecord.source {
            // What the operator's RevenueCat export says; nothing a store signed. Its store must be one the app takes.
            let configured =
                switch notification.store {
                case .apple: app.apple != nil
                case .google: app.google != nil
                case .stripe: app.stripe != nil
                default: false
                }
            guard configured else { return .rejected(unconfigured) }
            return Self.revenueCatRecord(notification)
        }
        do {
            switch notification.store {
            case .apple:
                guard let apple = app.apple else { return .rejected(unconfigured) }
                if notification.source == AppTransactionGrant.source { return .accepted(try apple.verify(appTransactionRecord: notification.body)) }
                if notification.source == AppPurchase.source { return .accepted(try apple.verify(purchaseRecord: notification.body)) }
                if notification.source != nil { return .accepted(try apple.verify(apiRecord: notification.body)) }
                return .accepted(try apple.verify(body: notification.body))
            case .google:
                guard let google = app.google else { return .rejected(unconfigured) }
                if notification.source == AppPurchase.source { return .accepted(try google.verify(purchaseRecord: notification.body, receivedAt: notification.receivedAtMilliseconds)) }
                if notification.source == RawNotification.playAPISource {
                    // `import google`'s purchases, else `recover google`'s voided purchases.
                    if (try? JSON.parse(notification.body))?["purchaseToken"] != nil {
                        return .accepted(try google.verify(purchaseRecord: notification.body, receivedAt: notification.receivedAtMilliseconds, imported: true))
                    }
                    return .accepted(try google.verify(voidedRecord: notification.body))
                }
                return try await google.verify(
                    body: notification.body, authorization: notification.requestHeaders["authorization"], receivedAtSeconds: receivedAt)
            case .stripe:
                guard let stripe = app.stripe else { return .rejected(unconfigured) }
                if notification.source == AppPurchase.source { return .accepted(try Self.webPurchase(notification)) }
                if notification.source == RawNotification.stripeAPISource { return .accepted(try Self.stripeAPIEvent(notification)) }
                return .accepted(
                    try stripe.verify(body: notification.body, signatureHeader: notification.requestHeaders["stripe-signature"], receivedAtSeconds: receivedAt))
            case .promotional:
                // Made by the backend with the secret key: nothing to verify but its shape (and its source, above).
                guard notification.source == PromotionalGrant.source, let document = try? JSON.parse(notification.body),
                    let record = PromotionalGrant.Record(json: document)
                else {
                    return .rejected(Rejection(.malformed, #"a promotional record is relay-source: grant with {"action", "grantId", "appUserId", "entitlement", "at"}"#))
                }
                return .accepted(
                    VerifiedNotification(
                        store: .promotional, app: notification.app, payload: document, notificationId: record.notificationId,
                        type: record.action.rawValue.uppercased(), environment: "PRODUCTION"))
            case .paddle:
                guard let paddle = app.paddle else { return .rejected(unconfigured) }
                if notification.source == AppPurchase.source { return .accepted(try Self.webPurchase(notification)) }
                if notification.source == RawNotification.paddleAPISource { return .accepted(try Self.storeAPIObject(notification)) }
                return .accepted(
                    try paddle.verify(body: notification.body, signatureHeader: notification.requestHeaders["paddle-signature"], receivedAtSeconds: receivedAt))
            }
        } catch let rejection as Rejection {
            return .rejected(rejection)
        } catch let unavailable as VerificationUnavailable {
            throw unavailable
        } catch {
            throw VerificationUnavailable("\(error)")
        }
    }

    /// A store object `reconcile` or `import` named (`relay-source: stripe-api` or `paddle-api`):
    /// `{"objectId", "subject", "reconcile": KEY}` or `{"objectId", "subject", "import": KIND}`. Stripe's objects are
    /// a subscription (`sub_`), an invoice (`in_`) or a charge (`ch_`); Paddle's a subscription (`sub_`), a
    /// transaction (`txn_`) or an adjustment (`adj_`); the subject is the subscription. No signature: the normalizer reads the object
    /// from the store's API with the app's key. Ids: `reconcile:<objectId>:<KEY>`, `import:<objectId>:<KIND>`.
    static func storeAPIObject(_ notification: RawNotification) throws(Rejection) -> VerifiedNotification {
        let prefixes = notification.store == .stripe ? ["sub_", "in_", "ch_"] : ["sub_", "txn_", "adj_"]
        let shape = #"{"objectId", "subject": "sub_…", "reconcile" | "import"}"#
        guard let document = try? JSON.parse(notification.body), let object = document["objectId"]?.stringValue,
            prefixes.contains(where: object.hasPrefix), document["subject"]?.stringValue?.hasPrefix("sub_") == true
        else {
            throw Rejection(.malformed, "a \(notification.source ?? "-") record is \(shape), its object one of \(prefixes.joined(separator: ", "))")
        }
        // A subscription record names itself: another subscription's key would apply it to that one's state.
        if object.hasPrefix("sub_"), document["subject"]?.stringValue != object {
            throw Rejection(.malformed, "a \(notification.source ?? "-") record of subscription \(object) must have it as its subject")
        }
        // A refund is imported once, by its charge: each reconcile key would take its whole amount back again.
        if object.hasPrefix("ch_"), document["import"]?.stringValue != "refunded" {
            throw Rejection(.malformed, "a \(notification.source ?? "-") record of charge \(object) is an import's refund only")
        }
        let id: String
        if let key = document["reconcile"]?.stringValue, !key.isEmpty {
            id = "reconcile:\(object):\(key)"
        } else if let kind = document["import"]?.stringValue, ["created", "paid", "refunded", "current"].contains(kind) {
            id = "import:\(object):\(kind)"
        } else {
            throw Rejection(.malformed, "a \(notification.source ?? "-") record is \(shape)")
        }
        let type: String =
            switch (notification.store, String(object.prefix(3))) {
            case (.stripe, "in_"): "invoice.paid"
            case (.stripe, "ch_"): "charge.refunded"
            case (.stripe, _): document["import"]?.stringValue == "created" ? "customer.subscription.created" : "customer.subscription.updated"
            case (_, "txn"): "transaction.completed"
            case (_, "adj"): "adjustment.updated"
            default: document["import"]?.stringValue == "created" ? "subscription.created" : "subscription.updated"
            }
        var verified = VerifiedNotification(store: notification.store, app: notification.app, payload: document, notificationId: id, type: type)
        verified.reconcileObject = object
        return verified
    }

    /// A moment of a RevenueCat export's transaction (`import revenuecat`, `RevenueCatRecord`). Nothing signed
    /// it: the operator's export is trusted as the operator's log is (only the command appends it), and only
    /// its shape is checked. Type `revenuecat.<kind>`, id `revenuecat:<transactionId>:<kind>`.
    static func revenueCatRecord(_ notification: RawNotification) -> Verdict {
        guard let document = try? JSON.parse(notification.body), let record = RevenueCatRecord(json: document) else {
            return .rejected(
                Rejection(.malformed, #"a revenuecat record is {"kind", "transactionId", "originalTransactionId", "productId", "at", "purchasedAt", ...}"#))
        }
        return .accepted(
            VerifiedNotification(
                store: notification.store, app: notification.app, payload: document, notificationId: record.notificationId,
                type: RevenueCatRecord.typePrefix + record.kind.rawValue, environment: record.sandbox ? "SANDBOX" : "PRODUCTION"))
    }

    /// A Stripe or Paddle purchase an app handed over: `{"subscriptionId" | "checkoutSessionId"}` (Stripe) or
    /// `{"transactionId"}` (Paddle) with the purchaser. No signature to check: what makes it authentic is the
    /// store's API, which the normalizer reads with this app's key (`HandedOverPurchase`); an id the store
    /// does not know for that key is rejected there.
    static func webPurchase(_ notification: RawNotification) throws(Rejection) -> VerifiedNotification {
        let ids = notification.store == .stripe ? ["subscriptionId", "checkoutSessionId"] : ["transactionId"]
        guard let document = try? JSON.parse(notification.body), let purchaser = AppPurchase.Purchaser(body: document),
            ids.contains(where: { document[$0]?.stringValue?.isEmpty == false })
        else {
            throw Rejection(.malformed, "an app-purchase record's body names no \(ids.joined(separator: " or ")) or no purchaser")
        }
        var verified = VerifiedNotification(
            store: notification.store, app: notification.app, payload: document, notificationId: AppPurchase.notificationId(purchaser.purchaseId),
            type: "purchase")
        verified.purchaser = purchaser
        return verified
    }

    /// A Stripe event `recover stripe` re-ingested: `{"eventId": "evt_…", "type"}`. No signature: what makes it
    /// authentic is Stripe's API, which the normalizer reads the event from with the app's key (an id Stripe
    /// does not know for that key is rejected there). Its id is the webhook's, so its events are the ones the
    /// webhook would have made.
    ///
    /// A `reconcile stripe` record is `{"objectId": "sub_…" | "in_…", "subject": "sub_…", "reconcile"}`: the
    /// subscription (or its latest invoice) Stripe's API answers differently from the stored state, read
    /// again by the normalizer; its id `reconcile:<objectId>:<reconcile>` stays the same until Stripe's
    /// answer changes.
    static func stripeAPIEvent(_ notification: RawNotification) throws(Rejection) -> VerifiedNotification {
        if let document = try? JSON.parse(notification.body), document["reconcile"] != nil || document["import"] != nil {
            return try storeAPIObject(notification)
        }
        guard let document = try? JSON.parse(notification.body), let id = document["eventId"]?.stringValue, id.hasPrefix("evt_") else {
            throw Rejection(.malformed, #"a stripe-api record's body is not {"eventId": "evt_…", "type"}"#)
        }
        var verified = VerifiedNotification(store: .stripe, app: notification.app, payload: document, notificationId: id, type: document["type"]?.stringValue)
        verified.stripeEventId = id
        return verified
    }
}
