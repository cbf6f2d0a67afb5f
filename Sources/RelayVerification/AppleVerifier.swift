package import RelayCrypto
import Foundation
public import RelayConfig
public import RelayCore

/// Verifies App Store Server Notifications V2 (`{"signedPayload": JWS}`) the way Apple's own
/// SignedDataVerifier does with online checks off, for one app:
///
/// 1. the JWS: three base64url parts, `alg` ES256 only, `x5c` with exactly three certificates;
/// 2. the chain leaf → `x5c[1]` → a configured root (never `x5c[2]`), built by OpenSSL at the payload's
///    `signedDate`, with Apple's marker OIDs on the leaf and the intermediate;
/// 3. the ES256 signature over `header.payload` with the leaf key;
/// 4. bundleId, environment (in the app's `environments`) and, for Production, appAppleId;
/// 5. the nested `signedTransactionInfo` and `signedRenewalInfo`, verified the same way and required to
///    be of the notification's environment (and the transaction of the app's bundle). With
///    `verifyNestedSignatures` off, their headers, chains and signatures are not checked, only their
///    payloads' claims (a `signedDate`, the environment, the bundle): their bytes are part of the payload
///    step 3 verified (Apple's SignedDataVerifier does not verify them with the notification either), and
///    that saves two of an Apple notification's three ES256 verifications, about 130 µs of one core.
///
/// `Xcode` and `LocalTesting` data is unsigned; like Apple's verifier, it is decoded without signature
/// checks, and only when the app lists that environment.
public struct AppleVerifier: Sendable {
    public static let leafOID = "1.2.840.113635.100.6.11.1"
    public static let intermediateOID = "1.2.840.113635.100.6.2.1"
    /// Environments whose data carries no Apple signature.
    public static let unsignedEnvironments: Set<String> = ["Xcode", "LocalTesting"]

    private let app: String
    private let bundleId: String
    private let appAppleId: Int64?
    private let environments: Set<String>
    /// The configured roots (`chainKey`, in AppleVerifier+Chain.swift).
    let trust: TrustStore
    /// Verified chains (`checkAhead`, in AppleVerifier+Together.swift, reads it too).
    let cache: AppleChainCache
    private let verifyNestedSignatures: Bool

    /// - Parameters:
    ///   - configurationKey: where `configuration` is in the file (`apps[0].apple`), for errors' keys.
    ///   - chainCacheCapacity: verified chains kept (0 disables the cache, as the uncached benchmark does).
    public init(
        app: String, configuration: RelayConfiguration.Apple, configurationKey: String = "apple", chainCacheCapacity: Int = 64
    ) throws(ConfigurationError) {
        try self.init(app: app, configuration: configuration, configurationKey: configurationKey, chainCacheCapacity: chainCacheCapacity, prepareKeys: nil)
    }

    /// - Parameter prepareKeys: what the chain cache does with each chain's key when it enters the chain
    ///   (`AppleChainCache`); nil: builds its table in the background. Tests and the benchmark build it at once.
    package init(
        app: String, configuration: RelayConfiguration.Apple, configurationKey: String, chainCacheCapacity: Int,
        prepareKeys: (@Sendable (PublicKey) -> Void)?
    ) throws(ConfigurationError) {
        var roots: [Certificate] = []
        for path in configuration.rootCertificates {
            do {
                roots += try Certificate.load(contentsOf: path)
            } catch {
                throw ConfigurationError(key: "\(configurationKey).rootCertificates", message: "\(path): \(error)")
            }
        }
        // Only apps that take signed environments need a root; Xcode/LocalTesting data is unsigned.
        guard !roots.isEmpty || Set(configuration.environments).isSubset(of: Self.unsignedEnvironments) else {
            throw ConfigurationError(key: "\(configurationKey).rootCertificates", message: "at least one root certificate is required (Apple Root CA - G3 for Sandbox and Production)")
        }
        do {
            self.trust = try TrustStore(roots: roots)
        } catch {
            throw ConfigurationError(key: "\(configurationKey).rootCertificates", message: "\(error)")
        }
        self.app = app
        self.bundleId = configuration.bundleId
        self.appAppleId = configuration.appAppleId
        self.environments = Set(configuration.environments)
        self.cache = AppleChainCache(capacity: chainCacheCapacity, prepare: prepareKeys)
        self.verifyNestedSignatures = configuration.verifyNestedSignatures
    }

    /// Verifies one request body.
    public func verify(body: [UInt8]) throws(Rejection) -> VerifiedNotification {
        guard let document = try? JSON.parse(body), let signedPayload = document["signedPayload"]?.stringValue else {
            throw Rejection(.malformed, #"body is not {"signedPayload": "<JWS>"}"#)
        }
        let jws = try CompactJWS(signedPayload, what: "signedPayload")
        let identity = try Self.identity(of: jws.payload)
        let claims = claims(of: identity)
        // For a notification whose own claims pass, the nested JWSs are read now and their signatures checked
        // with the notification's, together (`checkAhead`): those of its environment, and a transaction of its
        // bundle. Any other notification is refused, or its nested JWSs read, in their turns below, as before.
        var nested = [CompactJWS?](repeating: nil, count: Self.nestedMembers.count)
        var ahead = [CheckedAhead?](repeating: nil, count: 1 + nested.count)
        if verifyNestedSignatures, case .success(let environment) = claims {
            nested = Self.nestedMembers.map { member in
                jws.payload["data"]?[member.key]?.stringValue.flatMap { try? CompactJWS($0, what: "data.\(member.key)") }
            }
            let tokens = zip(Self.nestedMembers, nested).map { member, token -> (jws: CompactJWS, claimedEnvironment: String?)? in
                guard let token, (token.payload["environment"]?.stringValue ?? environment) == environment,
                    !member.checkBundle || (token.payload["bundleId"]?.stringValue ?? bundleId) == bundleId
                else { return nil }
                return (token, environment)
            }
            ahead = checkAhead([(jws, environment)] + tokens)
        }
        try verify(jws, claimedEnvironment: identity.environment, what: "signedPayload", checked: ahead[0])
        // Business checks, in Apple's order: the app, then the environment (`claims(of:)`).
        let environment = try claims.get()

        // The nested JWSs, replaced in place by their payloads: signed by Apple as part of the payload just verified.
        var payload = jws.payload
        if case .object(var data) = payload["data"] {
            for (index, (key, checkBundle)) in Self.nestedMembers.enumerated() {
                guard let value = data[key] else { continue }
                data[key] = try verifyNested(
                    value, what: "data.\(key)", of: "the notification", environment: environment, checkBundle: checkBundle,
                    coveredBySignature: !verifyNestedSignatures, parsed: nested[index], checked: ahead[index + 1])
            }
            if case .object(var members) = payload {
                members["data"] = .object(data)
                payload = .object(members)
            }
        }
        return VerifiedNotification(
            store: .apple, app: app, payload: payload, notificationId: payload["notificationUUID"]?.stringValue,
            type: payload["notificationType"]?.stringValue, subtype: payload["subtype"]?.stringValue, environment: environment)
    }

    /// A notification's nested JWSs, in the order they are verified, and whether each must be of the app's bundle.
    private static let nestedMembers: [(key: String, checkBundle: Bool)] = [("signedTransactionInfo", true), ("signedRenewalInfo", false)]

    /// The environment of a notification whose own claims pass the checks `verify(body:)` makes after its
    /// signature, in Apple's order (this app's bundle, one of its environments, for Production its
    /// `appAppleId`); else the first one's refusal.
    private func claims(of identity: (bundleId: String?, appAppleId: Int64?, environment: String?)) -> Result<String, Rejection> {
        guard identity.bundleId == bundleId else {
            return .failure(
                Rejection(.wrongBundleId, "bundleId \(identity.bundleId.map { "\"\($0)\"" } ?? "missing") is not this app's \"\(bundleId)\""))
        }
        guard let environment = identity.environment, environments.contains(environment) else {
            return .failure(
                Rejection(
                    .wrongEnvironment,
                    "environment \(identity.environment.map { "\"\($0)\"" } ?? "missing") is not among the app's environments \(environments.sorted())"))
        }
        if environment == "Production" {
            guard let configured = appAppleId else {
                return .failure(Rejection(.wrongAppAppleId, "Production notifications need apple.appAppleId configured for app \(app)"))
            }
            guard identity.appAppleId == configured else {
                return .failure(
                    Rejection(.wrongAppAppleId, "appAppleId \(identity.appAppleId.map(String.init) ?? "missing") is not this app's \(configured)"))
            }
        }
        return .success(environment)
    }

    /// Verifies a record synthesized from the App Store Server API (`relay-source: apple-api`):
    /// `{"notificationType", "subtype"?, "notificationUUID", "eventTime"?, "signedTransactionInfo": JWS, "signedRenewalInfo"?: JWS}`.
    /// No signature covers this document, so each JWS has its own chain and signature verified (at its
    /// `signedDate`), as a notification's nested ones are with `verifyNestedSignatures`; the transaction's
    /// environment must be among the app's and its bundle the app's, the renewal info of the same
    /// environment. The result has a notification's decoded shape: `signedDate` is `eventTime` or the transaction's,
    /// `data.environment` and `data.bundleId` are the transaction's, the JWSs replaced by their payloads.
    /// Only the type, the UUID and the event time are not signed: the command that wrote the record chose them.
    public func verify(apiRecord body: [UInt8]) throws(Rejection) -> VerifiedNotification {
        guard let document = try? JSON.parse(body), case .object = document,
            let type = document["notificationType"]?.stringValue, !type.isEmpty,
            let uuid = document["notificationUUID"]?.stringValue, !uuid.isEmpty,
            let transactionText = document["signedTransactionInfo"]?.stringValue
        else {
            throw Rejection(
                .malformed,
                #"an apple-api record's body is not {"notificationType", "notificationUUID", "signedTransactionInfo": "<JWS>", "signedRenewalInfo"?: "<JWS>"}"#)
        }
        let transaction = try verifySignedData(transactionText, what: "signedTransactionInfo", requireBundle: true)
        guard let environment = transaction["environment"]?.stringValue else {
            throw Rejection(.wrongEnvironment, "signedTransactionInfo has no environment")  // verifySignedData requires one
        }
        var data: [String: JSON] = [
            "bundleId": .string(bundleId), "environment": .string(environment), "signedTransactionInfo": transaction,
        ]
        if let appAppleId { data["appAppleId"] = .integer(appAppleId) }
        if let renewal = document["signedRenewalInfo"], !renewal.isNull {
            data["signedRenewalInfo"] = try verifyNested(renewal, what: "signedRenewalInfo", of: "the transaction", environment: environment, checkBundle: false)
        }
        var payload: [String: JSON] = [
            "notificationType": .string(type), "notificationUUID": .string(uuid), "version": "2.0", "data": .object(data),
        ]
        if let subtype = document["subtype"]?.stringValue { payload["subtype"] = .string(subtype) }
        // The event time: `eventTime` when the command gave one (an import: the purchase or the
        // revocation), else when Apple signed the transaction. The chain was checked at the JWS's own date.
        if let eventTime = document["eventTime"]?.int64Value {
            payload["signedDate"] = .integer(eventTime)
        } else if let signedDate = transaction["signedDate"] {
            payload["signedDate"] = signedDate
        }
        return VerifiedNotification(
            store: .apple, app: app, payload: .object(payload), notificationId: uuid, type: type, subtype: payload["subtype"]?.stringValue,
            environment: environment)
    }

    /// Verifies a purchase an app handed over (`relay-source: app-purchase`, `AppPurchase`):
    /// `{"signedTransaction": JWS, "appUserId", "transferPolicy", "purchaseId"}`. The transaction is verified
    /// as a notification's own (chain at its `signedDate`, an environment of the app's, the app's bundle), and
    /// the result is the notification Apple sends for such a transaction (`appleNotification(for:)`), dated
    /// when the transaction happened (its `purchaseDate`, else `signedDate`: StoreKit signs old transactions
    /// anew, so an earlier renewal handed over today must not look newer than the state), with the purchaser
    /// attached.
    public func verify(purchaseRecord body: [UInt8]) throws(Rejection) -> VerifiedNotification {
        guard let document = try? JSON.parse(body), let purchaser = AppPurchase.Purchaser(body: document),
            let text = document["signedTransaction"]?.stringValue
        else {
            throw Rejection(.malformed, #"an app-purchase record's body is not {"signedTransaction": "<JWS>", "appUserId", "purchaseId", "transferPolicy"}"#)
        }
        let transaction = try verify(signedTransaction: text)
        guard let environment = transaction["environment"]?.stringValue else {
            throw Rejection(.wrongEnvironment, "signedTransaction has no environment")  // verifySignedData requires one
        }
        let (type, subtype) = Self.appleNotification(for: transaction)
        let id = AppPurchase.notificationId(purchaser.purchaseId)
        var data: [String: JSON] = ["bundleId": .string(bundleId), "environment": .string(environment), "signedTransactionInfo": transaction]
        if let appAppleId { data["appAppleId"] = .integer(appAppleId) }
        var payload: [String: JSON] = ["notificationType": .string(type), "notificationUUID": .string(id), "version": "2.0", "data": .object(data)]
        if let subtype { payload["subtype"] = .string(subtype) }
        if let date = transaction["revocationDate"] ?? transaction["purchaseDate"] ?? transaction["signedDate"] { payload["signedDate"] = date }
        var verified = VerifiedNotification(
            store: .apple, app: app, payload: .object(payload), notificationId: id, type: type, subtype: subtype, environment: environment)
        verified.purchaser = purchaser
        return verified
    }

    /// Verifies a StoreKit 2 signed transaction an app sends (`Transaction.jwsRepresentation`): the chain
    /// and signature, an environment of the app's, this app's `bundleId`. Returns the decoded transaction.
    public func verify(signedTransaction text: String) throws(Rejection) -> JSON {
        let transaction = try verifySignedData(text, what: "signedTransaction", requireBundle: true)
        guard transaction["originalTransactionId"]?.stringValue?.isEmpty == false, transaction["productId"]?.stringValue?.isEmpty == false else {
            throw Rejection(.malformed, "signedTransaction names no originalTransactionId or productId")
        }
        return transaction
    }

    /// The App Store notification a transaction an app hands over stands for: a refund or revocation when
    /// Apple revoked it; a subscription's first purchase (`SUBSCRIBED`, `INITIAL_BUY`) when it is the
    /// subscription's original transaction, else a renewal (`DID_RENEW`); any other product a
    /// `ONE_TIME_CHARGE`.
    static func appleNotification(for transaction: JSON) -> (type: String, subtype: String?) {
        if transaction["revocationDate"]?.int64Value != nil {
            return (transaction["inAppOwnershipType"]?.stringValue == "FAMILY_SHARED" ? "REVOKE" : "REFUND", nil)
        }
        guard transaction["type"]?.stringValue == "Auto-Renewable Subscription" else { return ("ONE_TIME_CHARGE", nil) }
        let first = transaction["transactionId"]?.stringValue == transaction["originalTransactionId"]?.stringValue
        return first ? ("SUBSCRIBED", "INITIAL_BUY") : ("DID_RENEW", nil)
    }

    /// Verifies a signed AppTransaction (StoreKit's `AppTransaction.shared`, `jwsRepresentation`) with
    /// the rules of a notification: the x5c chain to a configured root at its `signedDate`, Apple's OIDs,
    /// ES256, `bundleId` the app's, and for Production `appAppleId` the configured one. Returns the decoded
    /// payload.
    ///
    /// Its environment (`environment`, else `receiptType`) is held to a stricter rule than a
    /// notification's, because an AppTransaction grants access for life on its `originalApplicationVersion`,
    /// which Apple sets to "1.0" for every sandbox (so every TestFlight) AppTransaction:
    /// - `Production` only, when the app lists Production among its `environments`;
    /// - `Sandbox` only for an app that lists no Production at all (a sandbox-only test app), and then
    ///   only when it lists Sandbox;
    /// - never the unsigned `Xcode` and `LocalTesting` data, even when the app lists them: anyone can
    ///   write it. These are refused before any signature check, with `wrong_environment`.
    public func verify(appTransaction text: String) throws(Rejection) -> JSON {
        let jws = try CompactJWS(text, what: "signedAppTransaction")
        guard case .object = jws.payload else { throw Rejection(.malformed, "signedAppTransaction's payload is not a JSON object") }
        // Newer AppTransactions carry `environment`; older ones only `receiptType`, with the same values.
        let claimed = jws.payload["environment"]?.stringValue ?? jws.payload["receiptType"]?.stringValue
        if let claimed, Self.unsignedEnvironments.contains(claimed) {
            throw Rejection(.wrongEnvironment, "signedAppTransaction is unsigned \(claimed) data, which never grants access")
        }
        try verify(jws, claimedEnvironment: claimed, what: "signedAppTransaction")
        let bundle = jws.payload["bundleId"]?.stringValue
        guard bundle == bundleId else {
            throw Rejection(.wrongBundleId, "signedAppTransaction bundleId \(bundle.map { "\"\($0)\"" } ?? "missing") is not this app's \"\(bundleId)\"")
        }
        let accepted = Self.appTransactionEnvironments(of: environments)
        guard let environment = claimed, accepted.contains(environment) else {
            let why = environments.contains("Production")
                ? "this app lists Production, so only Production AppTransactions grant access (sandbox ones claim originalApplicationVersion 1.0)"
                : "the app's environments \(environments.sorted()) admit \(accepted.isEmpty ? "none" : accepted.sorted().joined(separator: ", "))"
            throw Rejection(.wrongEnvironment, "signedAppTransaction environment \(claimed.map { "\"\($0)\"" } ?? "missing") is refused: \(why)")
        }
        if environment == "Production" {
            guard let configured = appAppleId else {
                throw Rejection(.wrongAppAppleId, "Production AppTransactions need apple.appAppleId configured for app \(app)")
            }
            let given = jws.payload["appAppleId"]?.int64Value
            guard given == configured else {
                throw Rejection(.wrongAppAppleId, "signedAppTransaction appAppleId \(given.map(String.init) ?? "missing") is not this app's \(configured)")
            }
        }
        return jws.payload
    }

    /// The AppTransaction environments an app with these notification `environments` accepts: Production
    /// alone when it lists Production, else Sandbox when it lists it; never an unsigned one.
    static func appTransactionEnvironments(of environments: Set<String>) -> Set<String> {
        if environments.contains("Production") { return ["Production"] }
        return environments.contains("Sandbox") ? ["Sandbox"] : []
    }

    /// Verifies a record the local backend appended for a grandfathered customer (`relay-source:
    /// app-transaction`): `{"signedAppTransaction": JWS, "appUserId", "rule"}`. The AppTransaction is
    /// verified again (`verify(appTransaction:)`); the result has type `APP_TRANSACTION`, notification id
    /// `<subject>:<appUserId>` (so the same customer posting it again changes nothing), `signedDate` the
    /// AppTransaction's, and `data` {appTransaction (decoded), appUserId, rule, environment, bundleId}.
    /// The user id and the rule are not signed: whoever appends to `relay.notifications` chooses them; the
    /// mapping checks the rule against the configuration again.
    public func verify(appTransactionRecord body: [UInt8]) throws(Rejection) -> VerifiedNotification {
        guard let document = try? JSON.parse(body), let text = document["signedAppTransaction"]?.stringValue,
            let user = document["appUserId"]?.stringValue, !user.isEmpty, let rule = document["rule"]?.int64Value
        else {
            throw Rejection(.malformed, #"an app-transaction record's body is not {"signedAppTransaction": "<JWS>", "appUserId", "rule"}"#)
        }
        let appTransaction = try verify(appTransaction: text)
        guard let subject = AppTransactionGrant.subject(of: appTransaction) else {
            throw Rejection(.malformed, "signedAppTransaction has neither appTransactionId nor originalPurchaseDate")
        }
        let environment = appTransaction["environment"]?.stringValue ?? appTransaction["receiptType"]?.stringValue ?? ""
        let id = "\(subject):\(user)"
        var payload: [String: JSON] = [
            "notificationType": .string(AppTransactionGrant.notificationType), "notificationUUID": .string(id),
            "data": [
                "appTransaction": appTransaction, "appUserId": .string(user), "rule": .integer(rule), "environment": .string(environment),
                "bundleId": .string(bundleId),
            ],
        ]
        if let signedDate = appTransaction["signedDate"] { payload["signedDate"] = signedDate }
        return VerifiedNotification(
            store: .apple, app: app, payload: .object(payload), notificationId: id, type: AppTransactionGrant.notificationType, subtype: nil,
            environment: environment)
    }

    /// Verifies one standalone signed transaction or renewal info (a JWS as the App Store Server API
    /// or an app sends it): chain and signature as for notifications, its `environment` among the app's,
    /// and a transaction's `bundleId`. Returns the decoded payload.
    /// `requireBundle`: a payload without `bundleId` is refused too (a transaction always names it).
    public func verifySignedData(_ text: String, what: String = "signed data", requireBundle: Bool = false) throws(Rejection) -> JSON {
        let jws = try CompactJWS(text, what: what)
        let environment = jws.payload["environment"]?.stringValue
        try verify(jws, claimedEnvironment: environment, what: what)
        guard let environment, environments.contains(environment) else {
            throw Rejection(
                .wrongEnvironment,
                "\(what) environment \(environment.map { "\"\($0)\"" } ?? "missing") is not among the app's environments \(environments.sorted())")
        }
        let named = jws.payload["bundleId"]?.stringValue
        if named.map({ $0 != bundleId }) ?? requireBundle {
            throw Rejection(.wrongBundleId, "\(what) bundleId \(named.map { "\"\($0)\"" } ?? "missing") is not this app's \"\(bundleId)\"")
        }
        return jws.payload
    }

    /// A JWS nested in a document from `environment` (a notification's or an apple-api record's transaction
    /// and renewal info): verified at its own date unless covered, of the same environment, and (with
    /// `checkBundle`) of this app's bundle when it names one. Returns its payload.
    ///
    /// - Parameter coveredBySignature: the document's verified signature covers this JWS's bytes (a
    ///   notification's): its header and signature are not read, only its payload's claims (a `signedDate`,
    ///   the environment, the bundle).
    /// - Parameters:
    ///   - parsed: `value` already read (with this `what`), when it was.
    ///   - checked: its signature checked ahead (`checkAhead`).
    private func verifyNested(
        _ value: JSON, what: String, of document: String, environment: String, checkBundle: Bool, coveredBySignature: Bool = false,
        parsed: CompactJWS? = nil, checked: CheckedAhead? = nil
    ) throws(Rejection) -> JSON {
        guard let text = value.stringValue else { throw Rejection(.malformed, "\(what) is not a JWS string") }
        let nested: CompactJWS
        if let parsed { nested = parsed } else { nested = try CompactJWS(text, what: what) }
        let nestedEnvironment = nested.payload["environment"]?.stringValue ?? environment
        guard nestedEnvironment == environment else {
            throw Rejection(.wrongEnvironment, "\(what) is from \(nestedEnvironment), \(document) from \(environment)")
        }
        if coveredBySignature {
            _ = try Self.signedTime(of: nested, what: what)
        } else {
            try verify(nested, claimedEnvironment: nestedEnvironment, what: what, checked: checked)
        }
        if checkBundle, let nestedBundle = nested.payload["bundleId"]?.stringValue, nestedBundle != bundleId {
            throw Rejection(.wrongBundleId, "\(what) bundleId \"\(nestedBundle)\" is not this app's \"\(bundleId)\"")
        }
        return nested.payload
    }

    /// Who a notification claims to be for, from whichever of Apple's forms it has.
    private static func identity(of payload: JSON) throws(Rejection) -> (bundleId: String?, appAppleId: Int64?, environment: String?) {
        for form in ["data", "summary", "appData"] {
            if let section = payload[form], case .object = section {
                return (section["bundleId"]?.stringValue, section["appAppleId"]?.int64Value, section["environment"]?.stringValue)
            }
        }
        if let token = payload["externalPurchaseToken"], case .object = token {
            // As Apple's verifier: the environment is told by the purchase id's prefix.
            let sandbox = token["externalPurchaseId"]?.stringValue?.hasPrefix("SANDBOX") ?? false
            return (token["bundleId"]?.stringValue, token["appAppleId"]?.int64Value, sandbox ? "Sandbox" : "Production")
        }
        throw Rejection(.malformed, "signedPayload has none of data, summary, externalPurchaseToken or appData")
    }

    /// The payload's `signedDate`, in Unix seconds.
    static func signedTime(of jws: CompactJWS, what: String) throws(Rejection) -> Int64 {
        // Milliseconds; Xcode data has fractions. Anything outside Int64 is not a date (and must not trap).
        guard let milliseconds = jws.payload["signedDate"]?.doubleValue else {
            throw Rejection(.malformed, "\(what) has no signedDate")
        }
        guard milliseconds.isFinite, let time = Int64(exactly: (milliseconds / 1000).rounded(.down)) else {
            throw Rejection(.malformed, "\(what) signedDate is not a time")
        }
        return time
    }

    /// Checks one JWS: algorithm, chain at `signedDate`, signature. Unsigned environments skip the
    /// cryptography, but only when the app lists them.
    /// - Parameter checked: its signature checked ahead (`checkAhead`), used when it was checked at this
    ///   JWS's time. Its key is the one the cache held for this header a moment before: the lookup is not
    ///   made again (a chain evicted since would be built again from the same certificates, with the same key).
    private func verify(_ jws: CompactJWS, claimedEnvironment: String?, what: String, checked: CheckedAhead? = nil) throws(Rejection) {
        let time = try Self.signedTime(of: jws, what: what)
        if let claimedEnvironment, Self.unsignedEnvironments.contains(claimedEnvironment) {
            guard environments.contains(claimedEnvironment) else {
                throw Rejection(.wrongEnvironment, "\(what) is unsigned \(claimedEnvironment) data, which this app does not accept")
            }
            return
        }
        // A header seen before (same algorithm, same certificates) whose chain is valid at this time.
        let key: PublicKey
        // A chain built here, entered in the cache only once the signature has verified with it.
        var verifiedChain: Range<Int64>?
        let checked = checked.flatMap { $0.time == time ? $0 : nil }
        if let checked {
            key = checked.key
            cache.answeredAhead.add(1, ordering: .relaxed)
        } else if let cached = jws.withHeaderSegment({ cache.lookup($0, at: time) }) {
            key = cached
        } else {
            let header = try jws.header()
            let algorithm = header["alg"]?.stringValue
            guard algorithm == "ES256" else {
                throw Rejection(.unsupportedAlgorithm, "\(what) alg is \(algorithm.map { "\"\($0)\"" } ?? "missing"); only ES256 is accepted")
            }
            guard let chain = header["x5c"]?.arrayValue else { throw Rejection(.malformed, "\(what) header has no x5c") }
            guard chain.count == 3, let leaf = chain[0].stringValue, let intermediate = chain[1].stringValue, chain[2].stringValue != nil
            else { throw Rejection(.malformed, "\(what) x5c must hold exactly three certificates") }
            (key, verifiedChain) = try chainKey(leaf: leaf, intermediate: intermediate, at: time, what: what)
        }
        guard jws.signature.count == 64 else {
            throw Rejection(.badSignature, "\(what) signature is \(jws.signature.count) bytes; ES256 signatures are 64")
        }
        guard checked?.valid ?? jws.withSigningInput({ key.verifyES256($0, rawSignature: jws.signature) }) else {
            throw Rejection(.badSignature, "\(what) signature does not verify with its leaf certificate")
        }
        // Only a header whose JWS verified is entered: Apple's certificates can be copied from any
        // notification, and headers that carry them but sign nothing must not crowd the cache.
        if let verifiedChain {
            cache.insert(jws.headerSegment, key: key, validity: verifiedChain, now: Int64(Date().timeIntervalSince1970))
        }
    }

    /// The chains the cache holds (for tests).
    var cachedChainCount: Int { cache.count }

    /// The cached chains whose leaf key has its table (for tests).
    var cachedChainsWithTables: Int { cache.countWithTables }

    /// Signatures whose answer came from their check ahead of their turns (for tests).
    var signaturesAnsweredAhead: Int { cache.answeredAhead.load(ordering: .relaxed) }
}
