import Foundation
public import Logging
public import RelayAppStoreAPI
public import RelayConfig
public import RelayCore
public import RelayHTTPClient
import RelayVerification

/// `revenue-relay import apple`, `recover apple` and `reconcile apple`: what the App Store Server API
/// knows, brought through the normal pipeline. Nothing here writes state or events itself: each command
/// appends raw notification records to `relay.notifications`, and the worker verifies and normalizes them
/// like any notification (so a repeat is absorbed where every repeat is: the normalizer's recent
/// notification ids and the events store's event ids).
///
/// - `import` appends `relay-source: apple-api` records (a signed transaction from Get Transaction History
///   with a notification type) marked `relay-historical: true`, and `relay-deliver: false` unless asked.
/// - `recover` appends the `signedPayload`s of Get Notification History whose notificationUUID has no
///   events in the events store, exactly as the ingest would have.
/// - `reconcile` compares the backend's active (or recently changed) subscriptions with Get All
///   Subscription Statuses and appends, for each drift, the apple-api record that brings the state to Apple's.
///
/// Secrets stay out of every message: the key is named by its ids, bearer tokens never appear.
public struct AppleHistoryCommands: Sendable {
    /// Why a command could not run or finish; `exitCode` is the sysexits code the CLI exits with.
    public struct Failure: Error, Sendable, CustomStringConvertible {
        public enum Kind: Sendable {
            /// The configuration lacks what the command needs, or the App Store key is refused (exit 78).
            case configuration
            /// An argument is wrong (exit 64).
            case badArguments
            /// The log, the backend or Apple could not be reached (exit 69); running it again continues.
            case unavailable
        }

        public var kind: Kind
        public var message: String

        public init(_ kind: Kind, _ message: String) {
            self.kind = kind
            self.message = message
        }

        public var description: String { message }

        public var exitCode: Int32 {
            switch kind {
            case .configuration: 78
            case .badArguments: 64
            case .unavailable: 69
            }
        }
    }

    /// The days of notification history Apple keeps: 180 in production, 30 in the sandbox (Get
    /// Notification History).
    public static func notificationHistoryDays(_ environment: AppStoreServerEnvironment) -> Int64 {
        environment == .production ? 180 : 30
    }

    public let app: RelayConfiguration.App
    let apple: RelayConfiguration.Apple
    let client: AppStoreServerClient
    let verifier: AppleVerifier
    let producer: any RecordProducer
    let topic: String
    let backend: BackendReader
    let now: @Sendable () -> Int64
    let logger: Logger

    /// - Parameters:
    ///   - appKey: the `apps[].key` whose `apple.serverApi` is used.
    ///   - producer: appends to the configured log (`ToolLog`, or a running relay's).
    ///   - backendURL: the backend instead of `backend.url` (dev's `backend.listen` address).
    ///   - retry: the App Store Server API client's retries (`Retry-After` is honoured up to its maximum).
    ///   - now: Unix milliseconds.
    public init(
        configuration: RelayConfiguration, appKey: String, producer: any RecordProducer, backendURL: String? = nil,
        http: HTTPClient = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(30), maxConcurrentTransfers: 8),
        retry: AppStoreServerClient.RetryPolicy = .standard, logger: Logger,
        now: (@Sendable () -> Int64)? = nil
    ) throws(Failure) {
        guard let index = configuration.apps.firstIndex(where: { $0.key == appKey }) else {
            throw Failure(.badArguments, "no app with key \(appKey) in the configuration; apps are \(configuration.apps.map(\.key).joined(separator: ", "))")
        }
        let app = configuration.apps[index]
        guard let apple = app.apple else {
            throw Failure(.configuration, "app \(appKey) has no apple section (apps[\(index)].apple); the App Store commands need one")
        }
        guard let serverApi = apple.serverApi else {
            throw Failure(
                .configuration,
                "app \(appKey) has no App Store Server API key: set apps[\(index)].apple.serverApi {keyId, issuerId, privateKey, environment}"
                    + " to an In-App Purchase key from App Store Connect → Users and Access → Integrations")
        }
        guard let environment = AppStoreServerEnvironment(rawValue: serverApi.environment) else {
            throw Failure(.configuration, "apps[\(index)].apple.serverApi.environment must be Production or Sandbox")
        }
        do {
            let key = try AppStoreConnectKey.load(path: serverApi.privateKey, keyId: serverApi.keyId, issuerId: serverApi.issuerId, bundleId: apple.bundleId)
            client = try AppStoreServerClient(key: key, environment: environment, baseURL: serverApi.baseUrl, http: http, retry: retry, logger: logger)
            // The same rules as the worker's, so a transaction that would be rejected is reported here.
            verifier = try AppleVerifier(app: app.key, configuration: apple, configurationKey: "apps[\(index)].apple", chainCacheCapacity: 64)
        } catch let error as AppStoreAPIError {
            throw Failure(.configuration, "apps[\(index)].apple.serverApi: \(error.message)")
        } catch {
            throw Failure(.configuration, "\(error)")
        }
        guard let apiKey = configuration.backend.clientKey, !apiKey.isEmpty else {
            throw Failure(.configuration, "backend.apiKey is not set: the commands read the backend's events and subscriptions with it")
        }
        self.app = app
        self.apple = apple
        self.producer = producer
        self.topic = configuration.topics.notifications
        self.backend = BackendReader(url: backendURL ?? configuration.backend.url, apiKey: apiKey, http: http)
        self.now = now ?? { Int64(Date().timeIntervalSince1970 * 1000) }
        self.logger = logger
    }

    // MARK: - import

    /// What `import apple` did.
    public struct ImportSummary: Sendable, Equatable {
        /// Distinct subscriptions (originalTransactionIds) and one-time purchases' ids seen.
        public var subscriptions = 0
        /// Distinct signed transactions read.
        public var transactions = 0
        public var recordsAppended = 0
        /// Records of an earlier run whose events are already recorded: not appended again.
        public var alreadyImported = 0
        /// Records the live pipeline already recorded (a money event of the same transaction for a purchase,
        /// a refund or revocation event of it for a revocation): not appended, so nothing is counted twice.
        public var alreadyRecordedLive = 0
        /// Ids (or transactions) that failed, with why.
        public var failures: [(id: String, reason: String)] = []

        public init() {}

        public static func == (lhs: Self, rhs: Self) -> Bool {
            lhs.subscriptions == rhs.subscriptions && lhs.transactions == rhs.transactions && lhs.recordsAppended == rhs.recordsAppended
                && lhs.alreadyImported == rhs.alreadyImported && lhs.alreadyRecordedLive == rhs.alreadyRecordedLive
                && lhs.failures.map(\.id) == rhs.failures.map(\.id)
                && lhs.failures.map(\.reason) == rhs.failures.map(\.reason)
        }
    }

    /// One record an import appends: the notification type a transaction stands for.
    struct ImportRecord {
        var uuid: String
        var type: String
        var subtype: String?
        var time: Int64
        var transactionId: String
        var signedTransaction: String
    }

    /// For each id, every page of Get Transaction History; each signed transaction verified, then appended
    /// per subscription in purchase order as an apple-api record (`import:<transactionId>`): SUBSCRIBED
    /// INITIAL_BUY for a subscription's first transaction, DID_RENEW for later ones, ONE_TIME_CHARGE for
    /// other products, and for a revoked one REFUND (REVOKE when family shared) at its revocation time
    /// (`import:<transactionId>:revoked`). Records whose events are already recorded (an earlier run
    /// that got that far) are skipped; the rest are appended again, and repeats are absorbed by their
    /// event ids. So an interrupted import is finished by running it again. Records of what the live
    /// pipeline already recorded are skipped too: a purchase whose transaction has a money event, a
    /// revocation whose transaction has a refund or revocation event (their event ids differ from the
    /// import's, so they would be counted twice).
    ///
    /// - Throws: only when nothing can go on (the key refused, the log or the backend unreachable);
    ///   an id Apple does not know, or whose history cannot be read, is a failure in the summary.
    public func importHistory(
        originalTransactionIds ids: [String], deliver: Bool, progress: @Sendable (String) -> Void = { _ in }
    ) async throws(Failure) -> ImportSummary {
        var summary = ImportSummary()
        var seenTransactions = Set<String>()
        var seenSubjects = Set<String>()
        for (position, id) in ids.enumerated() {
            progress("[\(position + 1)/\(ids.count)] \(id): reading the transaction history")
            // Get Transaction History answers the customer's whole history in the app: several ids of
            // one customer return the same transactions, read once.
            var transactions: [(payload: JSON, signed: String)] = []
            do {
                var pages = 0
                for try await page in client.transactionHistory(transactionId: id) {
                    pages += 1
                    for signed in page.signedTransactions {
                        do {
                            transactions.append((try verifier.verifySignedData(signed), signed))
                        } catch {
                            summary.failures.append((id, "a signed transaction was rejected (\(error)); it is not imported"))
                        }
                    }
                    progress("[\(position + 1)/\(ids.count)] \(id): page \(pages), \(transactions.count) transactions")
                }
            } catch {
                if error.kind == .keyRefused || error.kind == .configuration { throw Failure(.configuration, error.message) }
                summary.failures.append((id, "\(error.message)\(error.isRetriable ? "; run the import again later" : "")"))
                continue
            }
            var bySubject: [String: [JSON]] = [:]
            var signedById: [String: String] = [:]
            for (payload, signed) in transactions {
                guard let transactionId = payload["transactionId"]?.stringValue,
                    let subject = payload["originalTransactionId"]?.stringValue
                else {
                    summary.failures.append((id, "a transaction without transactionId or originalTransactionId; it is not imported"))
                    continue
                }
                guard seenTransactions.insert(transactionId).inserted else { continue }
                signedById[transactionId] = signed
                bySubject[subject, default: []].append(payload)
            }
            summary.transactions += signedById.count
            for subject in bySubject.keys.sorted() {
                if seenSubjects.insert(subject).inserted { summary.subscriptions += 1 }
                let records = Self.importRecords(bySubject[subject] ?? [], signed: signedById)
                // What an earlier run already brought to the events store is not appended again, nor
                // what the live pipeline recorded (the same money under other event ids).
                let recorded = try await backend.recordedEvents(originalTransactionId: subject)
                var pending: [ImportRecord] = []
                for record in records {
                    if recorded.notificationIds.contains(record.uuid) {
                        summary.alreadyImported += 1
                    } else if recorded.covers(record) {
                        summary.alreadyRecordedLive += 1
                    } else {
                        pending.append(record)
                    }
                }
                guard !pending.isEmpty else { continue }
                let outgoing = pending.map { record in
                    apiRecord(
                        subject: subject, type: record.type, subtype: record.subtype, uuid: record.uuid, signedTransaction: record.signedTransaction,
                        signedRenewal: nil, historical: true, deliver: deliver, eventTime: record.time)
                }
                do {
                    // One subscription's records in one batch, in order, on one key: the worker applies them in this order.
                    _ = try await producer.produce(outgoing)
                } catch {
                    throw Failure(
                        .unavailable,
                        "appending to \(topic) failed (\(error)); \(summary.recordsAppended) records were appended before, run the same import again to finish")
                }
                summary.recordsAppended += outgoing.count
                progress("[\(position + 1)/\(ids.count)] \(id): subscription \(subject): \(outgoing.count) records appended")
            }
        }
        return summary
    }

    /// The records of one subscription's transactions, in the order they happened.
    static func importRecords(_ transactions: [JSON], signed: [String: String]) -> [ImportRecord] {
        let ordered = transactions.sorted { a, b in
            let (left, right) = (a["purchaseDate"]?.int64Value ?? 0, b["purchaseDate"]?.int64Value ?? 0)
            if left != right { return left < right }
            return (a["transactionId"]?.stringValue ?? "") < (b["transactionId"]?.stringValue ?? "")
        }
        var records: [ImportRecord] = []
        var subscribed = false
        for transaction in ordered {
            guard let id = transaction["transactionId"]?.stringValue, let text = signed[id] else { continue }
            let purchased = transaction["purchaseDate"]?.int64Value ?? 0
            let (type, subtype): (String, String?)
            if transaction["type"]?.stringValue == "Auto-Renewable Subscription" {
                (type, subtype) = subscribed ? ("DID_RENEW", nil) : ("SUBSCRIBED", "INITIAL_BUY")
                subscribed = true
            } else {
                (type, subtype) = ("ONE_TIME_CHARGE", nil)
            }
            records.append(ImportRecord(uuid: "import:\(id)", type: type, subtype: subtype, time: purchased, transactionId: id, signedTransaction: text))
            if let revoked = transaction["revocationDate"]?.int64Value {
                let familyShared = transaction["inAppOwnershipType"]?.stringValue == "FAMILY_SHARED"
                records.append(
                    ImportRecord(
                        uuid: "import:\(id):revoked", type: familyShared ? "REVOKE" : "REFUND", subtype: nil, time: revoked, transactionId: id,
                        signedTransaction: text))
            }
        }
        // A revocation takes its place among the purchases by when it happened (stable: a purchase first).
        return records.enumerated().sorted { ($0.element.time, $0.offset) < ($1.element.time, $1.offset) }.map(\.element)
    }

    /// A raw notification record of the App Store Server API, keyed by its subscription as the ingest keys Apple's.
    func apiRecord(
        subject: String, type: String, subtype: String?, uuid: String, signedTransaction: String, signedRenewal: String?, historical: Bool,
        deliver: Bool, eventTime: Int64? = nil
    ) -> OutgoingRecord {
        var body: [String: JSON] = [
            "notificationType": .string(type), "notificationUUID": .string(uuid), "signedTransactionInfo": .string(signedTransaction),
        ]
        // An import's events happened when the customer paid (or was refunded), not when Apple signed
        // the history it answered with today: revenue by day must put them on their own days.
        if let eventTime, eventTime > 0 { body["eventTime"] = .integer(eventTime) }
        if let subtype { body["subtype"] = .string(subtype) }
        if let signedRenewal { body["signedRenewalInfo"] = .string(signedRenewal) }
        let notification = RawNotification(
            store: .apple, app: app.key, receivedAtMilliseconds: now(), body: JSON.object(body).serialized(), requestHeaders: [:],
            source: RawNotification.appleAPISource, historical: historical, deliver: deliver)
        return notification.record(topic: topic, subject: subject)
    }

    // MARK: - recover

    /// What `recover apple` did.
    public struct RecoverSummary: Sendable, Equatable {
        /// Notifications in Apple's history for the period.
        public var found = 0
        /// Of those, notifications whose events are already recorded.
        public var alreadyProcessed = 0
        /// Appended to the notifications topic for the worker.
        public var reingested = 0
        /// History items whose signedPayload could not be read (not appended).
        public var unreadable = 0
        /// Notifications that yield no events (`CONSUMPTION_REQUEST`, `TEST`): not re-ingested, since they
        /// always look unprocessed, and a re-ingested CONSUMPTION_REQUEST would be answered again with today's state.
        public var skipped = 0

        public init() {}
    }

    /// Get Notification History from `since` to `until` (Unix ms; `until` nil: now); each notification
    /// whose notificationUUID has no events in the events store is appended as the ingest would have
    /// appended it (`{"signedPayload": ...}`, no relay headers beyond the ingest's). One that yields no
    /// events (TEST, CONSUMPTION_REQUEST) is skipped: the events store cannot tell whether it was
    /// processed, and the worker would answer a CONSUMPTION_REQUEST again with today's state.
    public func recover(since: Int64, until: Int64?, progress: @Sendable (String) -> Void = { _ in }) async throws(Failure) -> RecoverSummary {
        let now = self.now()
        let days = Self.notificationHistoryDays(client.environment)
        let oldest = now - days * 86_400_000
        guard since >= oldest else {
            throw Failure(
                .badArguments,
                "--since \(Timestamp.rfc3339(milliseconds: since)) is older than the \(days) days of notification history Apple keeps"
                    + " (\(client.environment == .production ? "production" : "sandbox"));"
                    + " use --since \(Timestamp.rfc3339(milliseconds: oldest + 60_000)) or later, and `revenue-relay import apple` for older transactions")
        }
        let end = min(until ?? now, now)
        guard since < end else { throw Failure(.badArguments, "--since must be before --until (and before now)") }
        var summary = RecoverSummary()
        var seen = Set<String>()
        var pages = 0
        do {
            for try await page in client.notificationHistory(NotificationHistoryRequest(startDate: since, endDate: end)) {
                pages += 1
                var outgoing: [OutgoingRecord] = []
                for item in page.notificationHistory {
                    summary.found += 1
                    guard let payload = JWSPayload.decode(item.signedPayload), let uuid = payload["notificationUUID"]?.stringValue, !uuid.isEmpty else {
                        summary.unreadable += 1
                        logger.warning("a notification of Apple's history has no readable notificationUUID; not re-ingested")
                        continue
                    }
                    if let type = payload["notificationType"]?.stringValue, Self.yieldsNoEvents.contains(type) {
                        summary.skipped += 1
                        continue
                    }
                    guard seen.insert(uuid).inserted else {
                        summary.alreadyProcessed += 1
                        continue
                    }
                    if try await backend.hasEvents(notificationId: uuid) {
                        summary.alreadyProcessed += 1
                        continue
                    }
                    let body = JSON.object(["signedPayload": .string(item.signedPayload)]).serialized()
                    let notification = RawNotification(store: .apple, app: app.key, receivedAtMilliseconds: self.now(), body: body, requestHeaders: [:])
                    outgoing.append(notification.record(topic: topic))
                }
                if !outgoing.isEmpty {
                    do {
                        _ = try await producer.produce(outgoing)
                    } catch {
                        throw Failure(.unavailable, "appending to \(topic) failed (\(error)); run the same recover again: what was appended is skipped once processed")
                    }
                    summary.reingested += outgoing.count
                }
                progress(
                    "page \(pages): \(summary.found) found, \(summary.alreadyProcessed) already processed, \(summary.reingested) re-ingested,"
                        + " \(summary.skipped) skipped (no events)")
            }
        } catch let failure as Failure {
            throw failure
        } catch let error as AppStoreAPIError {
            throw Self.failure(error, what: "reading the notification history", done: "\(summary.reingested) notifications were re-ingested before")
        } catch {
            throw Failure(.unavailable, "\(error)")
        }
        return summary
    }

    /// Notification types `recover` never re-ingests: they yield no events, so they always look unprocessed.
    static let yieldsNoEvents: Set<String> = ["CONSUMPTION_REQUEST", "TEST"]

    // MARK: - reconcile

    /// One subscription whose stored state differed from Apple's, and what was appended for it.
    public struct Correction: Sendable, Equatable {
        public var originalTransactionId: String
        public var stored: String
        public var apple: String
        /// The notification type (and subtype) appended.
        public var action: String

        public var line: String { "\(originalTransactionId): \(stored) → Apple \(apple): \(action) appended" }
    }

    /// What `reconcile apple` did.
    public struct ReconcileSummary: Sendable, Equatable {
        public var checked = 0
        public var inSync = 0
        public var corrections: [Correction] = []
        /// Subscriptions in the other App Store environment than serverApi's: not checked.
        public var otherEnvironment = 0
        public var failures: [String] = []

        public init() {}
    }

    /// For each of the app's Apple subscriptions the backend lists as active or changed since `since`,
    /// Get All Subscription Statuses; where Apple's status or expiry differs from the stored state, an
    /// apple-api record (delivered, not historical: these are missed events) with the type that brings
    /// the state to Apple's, notificationUUID `reconcile:<Apple's last transactionId>:<Apple's status>`:
    /// the same on every run until Apple's answer changes (Apple signs each answer when it answers), so a
    /// run repeated before the worker caught up yields the same event ids and is absorbed.
    public func reconcile(
        since: Int64?, progress: @Sendable (String) -> Void = { _ in }, corrected: @Sendable (Correction) -> Void = { _ in }
    ) async throws(Failure) -> ReconcileSummary {
        var summary = ReconcileSummary()
        var cursor: String?
        let environment = client.environment == .production ? "PRODUCTION" : "SANDBOX"
        repeat {
            let page = try await backend.subscriptions(applicationId: app.applicationId, activeOrChangedSince: since, cursor: cursor)
            cursor = page.next
            for state in page.states {
                // A grandfathering grant is no App Store subscription: Apple has no status for it. Nor has
                // a one-time purchase (no renewal, no expiry; the backend no longer lists them).
                if state.productId.hasPrefix(AppTransactionGrant.productPrefix) { continue }
                if !state.autoRenew, state.expiresAt == nil { continue }
                guard state.environment == environment else {
                    summary.otherEnvironment += 1
                    continue
                }
                summary.checked += 1
                let statuses: SubscriptionStatusesResponse
                do {
                    statuses = try await client.subscriptionStatuses(transactionId: state.originalTransactionId)
                } catch {
                    if error.kind == .keyRefused || error.kind == .configuration { throw Failure(.configuration, error.message) }
                    summary.failures.append("\(state.originalTransactionId): \(error.message)")
                    continue
                }
                guard let last = statuses.data.flatMap(\.lastTransactions).first(where: { $0.originalTransactionId == state.originalTransactionId })
                else {
                    summary.failures.append("\(state.originalTransactionId): Apple lists no status for this subscription")
                    continue
                }
                let transaction: JSON
                var renewal: JSON?
                do {
                    transaction = try verifier.verifySignedData(last.signedTransactionInfo)
                    if let signed = last.signedRenewalInfo { renewal = try verifier.verifySignedData(signed) }
                } catch {
                    summary.failures.append("\(state.originalTransactionId): Apple's signed status was rejected (\(error))")
                    continue
                }
                guard let fix = Self.correction(stored: state, appleStatus: last.status, transaction: transaction, renewal: renewal) else {
                    summary.inSync += 1
                    continue
                }
                let (type, subtype) = fix
                let transactionId = transaction["transactionId"]?.stringValue ?? state.originalTransactionId
                let record = apiRecord(
                    subject: state.originalTransactionId, type: type, subtype: subtype, uuid: "reconcile:\(transactionId):\(last.status)",
                    signedTransaction: last.signedTransactionInfo, signedRenewal: last.signedRenewalInfo, historical: false, deliver: true)
                do {
                    _ = try await producer.produce(record)
                } catch {
                    throw Failure(.unavailable, "appending to \(topic) failed (\(error)); run reconcile again: corrected subscriptions are in sync then")
                }
                let correction = Correction(
                    originalTransactionId: state.originalTransactionId, stored: Self.describe(status: state.status.rawValue, expiresAt: state.expiresAt),
                    apple: Self.describe(apple: last.status, expiresAt: transaction["expiresDate"]?.int64Value),
                    action: subtype.map { "\(type)/\($0)" } ?? type)
                summary.corrections.append(correction)
                corrected(correction)
            }
            progress("\(summary.checked) checked, \(summary.corrections.count) corrected")
        } while cursor != nil
        return summary
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

    static func describe(status: String, expiresAt: Int64?) -> String {
        status + (expiresAt.map { " (expires \(Timestamp.rfc3339(milliseconds: $0)))" } ?? "")
    }

    static func describe(apple status: Int, expiresAt: Int64?) -> String {
        let name =
            switch SubscriptionStatus(rawValue: status) {
            case .active: "active"
            case .expired: "expired"
            case .billingRetry: "billing retry"
            case .billingGracePeriod: "grace period"
            case .revoked: "revoked"
            case nil: "unknown"
            }
        return "\(status) \(name)" + (expiresAt.map { " (expires \(Timestamp.rfc3339(milliseconds: $0)))" } ?? "")
    }

    static func failure(_ error: AppStoreAPIError, what: String, done: String) -> Failure {
        switch error.kind {
        case .keyRefused, .configuration: Failure(.configuration, error.message)
        case .rejected: Failure(.badArguments, "Apple refused \(what): \(error.message)")
        default: Failure(.unavailable, "\(what) failed (\(error.message)); \(done); run the same command again to continue")
        }
    }
}

/// The backend's internal routes as the command line reads them (`events`, `revenue`, and the Apple
/// commands): a failure is an `AppleHistoryCommands.Failure` with its message and exit code.
public struct BackendReader: Sendable {
    public let url: String
    let apiKey: String
    let http: HTTPClient

    public init(url: String, apiKey: String, http: HTTPClient) {
        var url = url
        while url.hasSuffix("/") { url.removeLast() }
        self.url = url
        self.apiKey = apiKey
        self.http = http
    }

    public func get(_ path: String, _ query: [(String, String)]) async throws(AppleHistoryCommands.Failure) -> JSON {
        let text = query.map { "\(PercentEncoding.encode($0.0))=\(PercentEncoding.encode($0.1))" }.joined(separator: "&")
        let response: HTTPClientResponse
        do {
            response = try await http.send("GET", url + path + (text.isEmpty ? "" : "?" + text), headers: [("Authorization", "Bearer \(apiKey)")])
        } catch {
            throw .init(.unavailable, "the backend at \(url) cannot be reached (\(error)); start it, or pass its address with --backend-url")
        }
        switch response.status {
        case 200:
            guard let document = try? JSON.parse(response.body) else { throw .init(.unavailable, "the backend at \(url) answered \(path) with a body that is not JSON") }
            return document
        case 400:
            throw .init(.badArguments, (try? JSON.parse(response.body))?["detail"]?.stringValue ?? "the backend refused the request to \(path)")
        case 401, 403:
            throw .init(.configuration, "the backend at \(url) refused backend.apiKey")
        case 404:
            throw .init(.unavailable, "the backend at \(url) has no \(path): it is older than this command; upgrade it")
        default:
            let detail = (try? JSON.parse(response.body))?["detail"]?.stringValue.map { ": \($0)" } ?? ""
            throw .init(.unavailable, "the backend at \(url) answered HTTP \(response.status) for \(path)\(detail)")
        }
    }

    /// Whether any event was recorded for this notification id.
    func hasEvents(notificationId: String) async throws(AppleHistoryCommands.Failure) -> Bool {
        let page = try await get("/subscriptions-api/internal/v1/events", [("notificationId", notificationId), ("environment", "ALL"), ("limit", "1")])
        return !(page["events"]?.arrayValue ?? []).isEmpty
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

    /// Every recorded event that matches `filter` (the events route's query parameters), page by page
    /// (1,000 a page), oldest recorded first, each page handed to `body`.
    public func events(
        _ filter: [(String, String)], _ body: ([JSON]) throws(AppleHistoryCommands.Failure) -> Void
    ) async throws(AppleHistoryCommands.Failure) {
        var cursor: String?
        repeat {
            var query = filter + [("limit", "1000")]
            if let cursor { query.append(("cursor", cursor)) }
            let page = try await get("/subscriptions-api/internal/v1/events", query)
            try body(page["events"]?.arrayValue ?? [])
            cursor = page["nextCursor"]?.stringValue
        } while cursor != nil
    }

    /// Every recorded event of an Apple subscription (every page), live and historical, in every environment.
    func recordedEvents(originalTransactionId: String) async throws(AppleHistoryCommands.Failure) -> RecordedEvents {
        var recorded = RecordedEvents()
        try await events([("originalTransactionId", originalTransactionId), ("store", "apple"), ("environment", "ALL")]) { page in
            for event in page { recorded.add(event) }
        }
        return recorded
    }

    /// One page of the backend's subscriptions list.
    func subscriptions(applicationId: Int, activeOrChangedSince since: Int64?, cursor: String?) async throws(AppleHistoryCommands.Failure)
        -> (states: [SubscriptionState], next: String?)
    {
        var query = [("store", "apple"), ("applicationId", String(applicationId)), ("limit", "100")]
        if let since { query.append(("activeOrChangedSince", String(since))) }
        if let cursor { query.append(("cursor", cursor)) }
        let page = try await get("/subscriptions-api/internal/v1/subscriptions", query)
        var states: [SubscriptionState] = []
        for item in page["subscriptions"]?.arrayValue ?? [] {
            do {
                states.append(try SubscriptionState(json: item))
            } catch {
                throw .init(.unavailable, "the backend at \(url) listed a subscription this version cannot read (\(error))")
            }
        }
        return (states, page["nextCursor"]?.stringValue)
    }
}
