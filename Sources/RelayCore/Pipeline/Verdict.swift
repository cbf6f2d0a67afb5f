/// Why a notification was not accepted: a stable code (docs/verification.md) for machines and dashboards,
/// and a detail for the human reading `inspect` or the rejected topic.
public enum RejectReason: String, Sendable, CaseIterable, CustomStringConvertible {
    /// Not the shape the store sends: not JSON, not a JWS, a missing field (Apple `signedDate`, `x5c`).
    case malformed
    /// A JWS or JWT algorithm other than ES256 (Apple) or RS256 (Google), including `none`.
    case unsupportedAlgorithm = "unsupported_algorithm"
    /// The certificate chain does not lead to a configured root.
    case untrustedChain = "untrusted_chain"
    /// A certificate of the chain is expired or not yet valid at the payload's `signedDate`.
    case certificateExpired = "certificate_expired"
    /// The leaf or intermediate lacks Apple's marker extension.
    case missingAppleOID = "missing_apple_oid"
    /// The signature, HMAC or token signature does not match.
    case badSignature = "bad_signature"
    case wrongBundleId = "wrong_bundle_id"
    case wrongEnvironment = "wrong_environment"
    case wrongAppAppleId = "wrong_app_apple_id"
    case wrongPackageName = "wrong_package_name"
    case wrongAudience = "wrong_audience"
    case wrongIssuer = "wrong_issuer"
    /// The push token's `email` is not the configured service account, or is not verified.
    case wrongServiceAccount = "wrong_service_account"
    /// The token's `kid` is in none of the configured keys.
    case unknownKey = "unknown_key"
    /// The push token is expired or issued in the future (beyond 60 s of skew).
    case tokenExpired = "token_expired"
    /// The Stripe `t` or Paddle `ts` is outside the tolerance around the receive time.
    case staleTimestamp = "stale_timestamp"
    /// No signature header, or one without a usable signature scheme.
    case missingSignature = "missing_signature"
    /// The app key is not configured, or the app does not take this store's notifications.
    case unknownApp = "unknown_app"
    /// Google: the Play Developer API does not know the notification's purchase token (404/410).
    case purchaseNotFound = "purchase_not_found"
    /// Google: no `playApi` is configured for the app, so the subscription's state cannot be read.
    /// Configure it, then re-drive the rejected record. (A Play API that refuses is retried instead.)
    case storeAPIRejected = "store_api_rejected"

    public var description: String { rawValue }
}

/// A notification that failed verification. The detail never contains secrets or whole payloads.
public struct Rejection: Error, Sendable, Equatable, CustomStringConvertible {
    public var reason: RejectReason
    public var detail: String

    /// Details quote values from the notification, which anyone can send: control characters are
    /// replaced and the length is bounded, so a detail cannot forge log lines or grow headers.
    public init(_ reason: RejectReason, _ detail: String) {
        self.reason = reason
        var safe = String(String.UnicodeScalarView(detail.unicodeScalars.prefix(Self.maximumDetailLength).map {
            $0.properties.generalCategory == .control ? "?" : $0
        }))
        if detail.unicodeScalars.count > Self.maximumDetailLength { safe += "…" }
        self.detail = safe
    }

    public static let maximumDetailLength = 500

    public var description: String { "\(reason.rawValue): \(detail)" }
}

/// A notification that passed every check of its store.
public struct VerifiedNotification: Sendable {
    public var store: Store
    public var app: String
    /// The decoded notification: Apple's `signedPayload` payload with `signedTransactionInfo` and
    /// `signedRenewalInfo` replaced by their verified, decoded payloads; Google's DeveloperNotification
    /// (from `message.data`); the Stripe or Paddle event as sent.
    public var payload: JSON
    /// The store's id of this notification, the dedup key: Apple `notificationUUID`, Google Pub/Sub
    /// `messageId`, Stripe `id`, Paddle `event_id` (or `notification_id`).
    public var notificationId: String?
    /// Apple `notificationType` (and `subtype`), Google's notification kind, Stripe `type`, Paddle `event_type`.
    public var type: String?
    public var subtype: String?
    /// Apple's `environment` (`Sandbox`, `Production`, ...); Stripe `livemode` as PRODUCTION/SANDBOX; else nil.
    public var environment: String?
    /// A purchase an app handed over (`relay-source: app-purchase`): who did, by which policy. Nil for a
    /// store's own notification.
    public var purchaser: AppPurchase.Purchaser?
    /// A Stripe event `recover stripe` re-ingested (`relay-source: stripe-api`): its id, which the
    /// normalizer reads from Stripe's API before anything else.
    public var stripeEventId: String?
    /// A voided purchase `recover google` re-ingested (`relay-source: play-api`): the normalizer finds it
    /// in the Voided Purchases API before anything else.
    public var playVoided = false
    /// A Stripe subscription or invoice, or a Paddle subscription or transaction, that `reconcile` found out
    /// of step or `import` brings in (`relay-source: stripe-api` or `paddle-api`): its id. The normalizer reads
    /// it from the store's API after the dedup check and applies it as the event the store would have sent,
    /// given the stored state.
    public var reconcileObject: String?

    public init(
        store: Store, app: String, payload: JSON, notificationId: String?, type: String?, subtype: String? = nil,
        environment: String? = nil
    ) {
        self.store = store
        self.app = app
        self.payload = payload
        // An empty id is no id: it would name every such notification's events alike, and a state cannot
        // record it.
        self.notificationId = notificationId?.isEmpty == true ? nil : notificationId
        self.type = type
        self.subtype = subtype
        self.environment = environment
    }
}

/// The outcome of verifying one notification. Verdicts are values: a forged or broken notification is
/// an ordinary result, never a crash or a retry.
public enum Verdict: Sendable, CustomStringConvertible {
    case accepted(VerifiedNotification)
    case rejected(Rejection)

    public var description: String {
        switch self {
        case .accepted(let notification): "accepted \(notification.store.rawValue) \(notification.type ?? "notification")"
        case .rejected(let rejection): "rejected: \(rejection)"
        }
    }

    public var rejection: Rejection? {
        if case .rejected(let rejection) = self { return rejection }
        return nil
    }

    public var notification: VerifiedNotification? {
        if case .accepted(let notification) = self { return notification }
        return nil
    }
}

/// Verification could not reach a verdict because something it depends on is unavailable (Google's
/// key endpoint unreachable with no cached keys). Not a verdict: the worker retries the record later.
public struct VerificationUnavailable: Error, Sendable, CustomStringConvertible {
    public var message: String

    public init(_ message: String) {
        self.message = message
    }

    public var description: String { message }
}
