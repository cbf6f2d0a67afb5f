import RelayCrypto
import Foundation
public import RelayConfig
public import RelayCore

/// Verifies Google Play real-time developer notifications delivered by a Pub/Sub push subscription
/// with authentication, for one app:
///
/// 1. the `Authorization: Bearer` OIDC token: RS256 only, key by `kid` from the app's key set,
///    `iss` accounts.google.com (either spelling), `aud` the app's `pushAudience`, `email` the app's
///    `pushServiceAccount` with `email_verified`, `exp`/`iat` within 60 s of skew of the receive time;
/// 2. `message.data`: base64 of a DeveloperNotification whose `packageName` is the app's.
public struct GoogleVerifier: Sendable {
    /// Allowed clock difference for `exp` and `iat`.
    public static let skewSeconds: Int64 = 60
    public static let issuers: Set<String> = ["accounts.google.com", "https://accounts.google.com"]

    private let app: String
    private let configuration: RelayConfiguration.Google
    private let keys: GoogleKeySet

    public init(app: String, configuration: RelayConfiguration.Google, keys: GoogleKeySet) {
        self.app = app
        self.configuration = configuration
        self.keys = keys
    }

    public func verify(body: [UInt8], authorization: String?, receivedAtSeconds: Int64) async throws(VerificationUnavailable) -> Verdict {
        let token: CompactJWS
        let kid: String
        do {
            (token, kid) = try Self.parseToken(authorization)
        } catch {
            return .rejected(error)
        }
        guard let key = try await keys.key(for: kid) else {
            return .rejected(Rejection(.unknownKey, "push token kid \"\(kid)\" is not among the keys of \(keys.source)"))
        }
        do {
            try checkToken(token, key: key, receivedAtSeconds: receivedAtSeconds)
            return .accepted(try decodeMessage(body))
        } catch {
            return .rejected(error)
        }
    }

    /// Verifies a purchase an app handed over (`relay-source: app-purchase`, `AppPurchase`):
    /// `{"productId", "purchaseToken", "kind": "subscription" | "product", "appUserId", "transferPolicy",
    /// "purchaseId"}`. There is no push token: what makes it authentic is the Play Developer API, which the
    /// normalizer reads for the token under this app's package (a token of another package is unknown there).
    /// The result is the DeveloperNotification Play sends for such a purchase (SUBSCRIPTION_PURCHASED, or
    /// ONE_TIME_PRODUCT_PURCHASED), dated when the relay received it, with the purchaser attached.
    ///
    /// An import's record (`relay-source: play-api` with a `purchaseToken`, `import google`) has the same
    /// shape without a purchaser: `{"productId", "purchaseToken", "kind", "appUserId"?}`, id `import:<token>`;
    /// with `appUserId` it binds the purchase to that user as a hand-over does. A `reconcile google` record adds
    /// `"notificationType"` (one of `reconcileCodes`) and `"reconcile"` (what names the change): it becomes that
    /// subscription notification, id `reconcile:<token>:<reconcile>`, dated when the relay received it.
    public func verify(purchaseRecord body: [UInt8], receivedAt: Int64, imported: Bool = false) throws(Rejection) -> VerifiedNotification {
        guard let document = try? JSON.parse(body), let productId = document["productId"]?.stringValue, !productId.isEmpty,
            let token = document["purchaseToken"]?.stringValue, !token.isEmpty
        else {
            throw Rejection(.malformed, #"a purchase record's body is not {"productId", "purchaseToken", "kind", ...}"#)
        }
        var purchaser = AppPurchase.Purchaser(body: document)
        if imported, purchaser == nil, let user = document["appUserId"]?.stringValue, !user.isEmpty {
            purchaser = AppPurchase.Purchaser(appUserId: user, transferPolicy: "keep", purchaseId: "import:\(token)")
        }
        guard imported || purchaser != nil else {
            throw Rejection(.malformed, #"an app-purchase record's body is not {"productId", "purchaseToken", "kind", "appUserId", "purchaseId", "transferPolicy"}"#)
        }
        // `reconcile google`'s correction: the subscription notification Play would have pushed for a change
        // the relay missed, named by the change (the same on every run until Play's answer changes).
        var code: Int64 = 4
        var id = imported ? "import:\(token)" : AppPurchase.notificationId(purchaser?.purchaseId ?? "")
        if imported, let reconcile = document["reconcile"]?.stringValue {
            guard let type = document["notificationType"]?.int64Value, Self.reconcileCodes.contains(type), document["kind"]?.stringValue == "subscription",
                purchaser == nil
            else {
                throw Rejection(.malformed, #"a reconcile record is {"purchaseToken", "productId", "kind": "subscription", "notificationType", "reconcile"}"#)
            }
            code = type
            id = "reconcile:\(token):\(reconcile)"
        }
        // An import is dated when the purchase happened (the command read it from the Play API).
        let eventTime = imported ? document["eventTime"]?.int64Value ?? receivedAt : receivedAt
        var notification: [String: JSON] = [
            "version": "1.0", "packageName": .string(configuration.packageName), "eventTimeMillis": .string(String(eventTime)),
        ]
        if document["kind"]?.stringValue == "product" {
            notification["oneTimeProductNotification"] = [
                "version": "1.0", "notificationType": 1, "purchaseToken": .string(token), "sku": .string(productId),
            ]
        } else {
            notification["subscriptionNotification"] = [
                "version": "1.0", "notificationType": .integer(code), "purchaseToken": .string(token), "subscriptionId": .string(productId),
            ]
        }
        let payload = JSON.object(notification)
        var verified = VerifiedNotification(
            store: .google, app: app, payload: payload, notificationId: id, type: DeveloperNotificationKind(payload).name, subtype: nil, environment: nil)
        verified.purchaser = purchaser
        return verified
    }

    /// The notifications `reconcile google` appends: RECOVERED, RENEWED, CANCELED, ON_HOLD, IN_GRACE_PERIOD,
    /// RESTARTED, PAUSED, EXPIRED.
    static let reconcileCodes: Set<Int64> = [1, 2, 3, 5, 6, 7, 10, 13]

    /// Verifies a voided purchase `recover google` re-ingested (`relay-source: play-api`): a DeveloperNotification
    /// of this app's package with a `voidedPurchaseNotification` (`purchaseToken`, `orderId`), id
    /// `voided:<orderId>`. No push token: what makes it authentic is the Voided Purchases API, in which the
    /// normalizer finds the order again under this app's package.
    public func verify(voidedRecord body: [UInt8]) throws(Rejection) -> VerifiedNotification {
        guard let notification = try? JSON.parse(body), let voided = notification["voidedPurchaseNotification"],
            let order = voided["orderId"]?.stringValue, !order.isEmpty, voided["purchaseToken"]?.stringValue?.isEmpty == false
        else {
            throw Rejection(.malformed, "a play-api record is a DeveloperNotification with a voidedPurchaseNotification {purchaseToken, orderId}")
        }
        let packageName = notification["packageName"]?.stringValue
        guard packageName == configuration.packageName else {
            throw Rejection(.wrongPackageName, "packageName \(packageName.map { "\"\($0)\"" } ?? "missing") is not this app's \"\(configuration.packageName)\"")
        }
        var verified = VerifiedNotification(
            store: .google, app: app, payload: notification, notificationId: "voided:\(order)", type: DeveloperNotificationKind(notification).name)
        verified.playVoided = true
        return verified
    }

    private static func parseToken(_ authorization: String?) throws(Rejection) -> (CompactJWS, String) {
        guard let authorization, !authorization.isEmpty else {
            throw Rejection(.missingSignature, "no Authorization header; enable authentication on the Pub/Sub push subscription")
        }
        let parts = authorization.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else {
            throw Rejection(.missingSignature, "the Authorization header is not a Bearer token")
        }
        let token = try CompactJWS(String(parts[1]).trimmingCharacters(in: .whitespaces), what: "push token")
        let header = try token.header()
        let algorithm = header["alg"]?.stringValue
        guard algorithm == "RS256" else {
            throw Rejection(.unsupportedAlgorithm, "push token alg is \(algorithm.map { "\"\($0)\"" } ?? "missing"); only RS256 is accepted")
        }
        guard let kid = header["kid"]?.stringValue else { throw Rejection(.unknownKey, "push token has no kid") }
        return (token, kid)
    }

    private func checkToken(_ token: CompactJWS, key: PublicKey, receivedAtSeconds: Int64) throws(Rejection) {
        guard case .rsa(let bits) = key.kind, bits >= 2048 else {
            throw Rejection(.unsupportedAlgorithm, "the token's key is not an RSA key of at least 2048 bits")
        }
        guard key.verifyRS256(token.signingInput, signature: token.signature) else {
            throw Rejection(.badSignature, "push token signature does not verify")
        }
        let claims = token.payload
        let issuer = claims["iss"]?.stringValue
        guard let issuer, Self.issuers.contains(issuer) else {
            throw Rejection(.wrongIssuer, "push token iss \(issuer.map { "\"\($0)\"" } ?? "missing") is not accounts.google.com")
        }
        let audiences = claims["aud"]?.stringValue.map { [$0] } ?? claims["aud"]?.arrayValue?.compactMap(\.stringValue) ?? []
        guard audiences.contains(configuration.pushAudience) else {
            throw Rejection(.wrongAudience, "push token aud \(audiences) is not google.pushAudience of app \(app)")
        }
        let email = claims["email"]?.stringValue
        guard email == configuration.pushServiceAccount else {
            throw Rejection(.wrongServiceAccount, "push token email \(email.map { "\"\($0)\"" } ?? "missing") is not google.pushServiceAccount of app \(app)")
        }
        let verified = claims["email_verified"]?.boolValue ?? (claims["email_verified"]?.stringValue == "true")
        guard verified else { throw Rejection(.wrongServiceAccount, "push token email is not verified (email_verified is not true)") }
        guard let expires = claims["exp"]?.int64Value, let issued = claims["iat"]?.int64Value else {
            throw Rejection(.malformed, "push token lacks exp or iat")
        }
        // exp and iat are whatever the sender wrote: compare without arithmetic on them.
        guard receivedAtSeconds - Self.skewSeconds <= expires else {
            throw Rejection(.tokenExpired, "push token expired at \(AppleVerifier.iso8601(expires)), received \(AppleVerifier.iso8601(receivedAtSeconds))")
        }
        guard issued <= receivedAtSeconds + Self.skewSeconds else {
            throw Rejection(.tokenExpired, "push token is issued at \(AppleVerifier.iso8601(issued)), after it was received (\(AppleVerifier.iso8601(receivedAtSeconds)))")
        }
    }

    private func decodeMessage(_ body: [UInt8]) throws(Rejection) -> VerifiedNotification {
        guard let envelope = try? JSON.parse(body), let message = envelope["message"], case .object = message else {
            throw Rejection(.malformed, #"body is not a Pub/Sub push envelope {"message": {...}}"#)
        }
        guard let data = message["data"]?.stringValue, let bytes = Base64.decode(data) else {
            throw Rejection(.malformed, "message.data is missing or not base64")
        }
        guard let notification = try? JSON.parse(bytes), case .object = notification else {
            throw Rejection(.malformed, "message.data is not a JSON DeveloperNotification")
        }
        let packageName = notification["packageName"]?.stringValue
        guard packageName == configuration.packageName else {
            throw Rejection(
                .wrongPackageName, "packageName \(packageName.map { "\"\($0)\"" } ?? "missing") is not this app's \"\(configuration.packageName)\"")
        }
        let kind = DeveloperNotificationKind(notification)
        return VerifiedNotification(
            store: .google, app: app, payload: notification,
            notificationId: message["messageId"]?.stringValue ?? message["message_id"]?.stringValue,
            type: kind.name, subtype: nil, environment: nil)
    }
}
