import Foundation
public import Logging
public import RelayConfig
public import RelayCore
public import RelayHTTPClient

/// `revenue-relay import revenuecat`: a way off RevenueCat. RevenueCat's Scheduled Data Export (the
/// Transactions feed, CSV, export versions 3 to 7) holds every transaction it saw, with the customer's ids;
/// the import turns each into `relay-source: revenuecat` records of the transaction's store
/// (`RevenueCatRecord`), historical and delivered only with `--deliver`, and the worker applies them as it
/// applies any notification: states, historical events, customer info.
///
/// - **Stores.** `app_store` (keyed by Apple's `original_transaction_id`, the relay's own key, so Apple's
///   notifications after the cut-over continue the same subscription), `play_store` (keyed by the first
///   order id; the export carries no purchase token), `stripe` (keyed by RevenueCat's
///   `original_store_transaction_id`) and `promotional` (a promotional grant of its first entitlement).
///   Other stores are counted and left out.
/// - **Identity.** The purchase belongs to `rc_last_seen_app_user_id_alias`; a different
///   `rc_original_app_user_id` is linked to it as an alias, so either id finds the customer (unless either id
///   is one the backend refuses: then the pair is counted, not linked).
/// - **Counted once.** A later row of the same transaction (the incremental feed re-sends changed rows)
///   replaces the earlier one (the newest `updated_at` wins). A payment or refund the relay recorded already
///   (from the store, or an earlier import) is skipped, and so is every record a previous run appended: a
///   rerun, or a run after an interruption, appends only the rest.
public struct RevenueCatHistoryCommands: Sendable {
    public typealias Failure = CommandFailure

    public let app: RelayConfiguration.App
    let producer: any RecordProducer
    let topic: String
    let backend: HistoryBackend
    let now: @Sendable () -> Int64

    public init(
        configuration: RelayConfiguration, appKey: String, producer: any RecordProducer, backendURL: String? = nil,
        http: HTTPClient = HTTPClient(connectTimeout: .seconds(5), timeout: .seconds(30), maxConcurrentTransfers: 8), logger: Logger,
        now: (@Sendable () -> Int64)? = nil
    ) throws(Failure) {
        let (app, _) = try HistoryRun.app(configuration, key: appKey)
        self.backend = try HistoryRun.backend(configuration, url: backendURL, http: http, logger: logger)
        self.app = app
        self.producer = producer
        self.topic = configuration.topics.notifications
        self.now = HistoryRun.clock(now)
    }

    /// One row of the export: a transaction as RevenueCat last saw it.
    public struct Transaction: Sendable, Equatable {
        public var store: String
        public var transactionId: String
        public var originalTransactionId: String
        public var productId: String
        public var originalAppUserId: String
        public var lastSeenAlias: String?
        public var start: Int64
        public var end: Int64?
        public var effectiveEnd: Int64?
        public var gracePeriodEnd: Int64?
        public var autoRenewable: Bool
        public var trial: Bool
        public var intro: Bool
        public var sandbox: Bool
        /// What was paid (`purchase_price_in_purchased_currency`, else `price_in_purchased_currency`, which
        /// RevenueCat zeroes on a refund) and its currency.
        public var price: String?
        public var currency: String?
        public var taxPercentage: String?
        public var country: String?
        public var refundedAt: Int64?
        public var unsubscribedAt: Int64?
        public var billingIssueAt: Int64?
        public var renewalNumber: Int64?
        public var trialConversion: Bool
        public var entitlements: [String]
        public var offer: String?
        public var updatedAt: Int64?
        /// The line of the file it came from (for messages).
        public var line: Int

        /// The user it belongs to: the last seen alias, else the original id.
        public var appUserId: String { lastSeenAlias.flatMap { $0.isEmpty ? nil : $0 } ?? originalAppUserId }
    }

    /// What `import revenuecat` did.
    public struct ImportSummary: Sendable, Equatable {
        /// Transactions in the files (a transaction sent again counts once).
        public var transactions = 0
        /// Subscriptions (and one-time purchases, grants) they belong to.
        public var subscriptions = 0
        /// Records appended for the worker.
        public var appended = 0
        /// Records skipped because the relay recorded what they stand for.
        public var alreadyRecorded = 0
        /// Transactions of stores the relay does not take, or that the app does not configure, by store.
        public var leftOut: [String: Int] = [:]
        /// Original app user ids linked as aliases of the last seen one; conflicts (already another user's).
        public var aliasesLinked = 0
        public var aliasConflicts = 0
        /// Pairs not linked because an id is one the aliases route refuses (`AppUser.isStorableId`).
        public var aliasesNotLinked = 0

        public init() {}
    }

    /// The transactions of export files (CSV with RevenueCat's header row), in the order given; a transaction
    /// sent again (same `store_transaction_id` and `renewal_number`) keeps its newest version (`updated_at`,
    /// else the later row).
    public static func parseExport(_ files: [String]) throws(Failure) -> [Transaction] {
        var latest: [String: Transaction] = [:]
        var order: [String] = []
        for (fileIndex, text) in files.enumerated() {
            // A byte order mark before the header would hide its first column.
            let rows = CSV.rows(text.hasPrefix("\u{FEFF}") ? String(text.dropFirst()) : text)
            guard let header = rows.first?.map({ $0.trimmingCharacters(in: .whitespaces).lowercased() }) else { continue }
            func column(_ name: String) -> Int? { header.firstIndex(of: name) }
            let required = ["rc_original_app_user_id", "product_identifier", "start_time", "store", "store_transaction_id", "original_store_transaction_id"]
            if let missing = required.first(where: { column($0) == nil }) {
                throw Failure(.badArguments, "file \(fileIndex + 1) has no \(missing) column: it is not RevenueCat's Transactions export (its header: \(header.prefix(8).joined(separator: ",")))")
            }
            for (index, row) in rows.dropFirst().enumerated() where !(row.count == 1 && row[0].isEmpty) {
                let line = index + 2
                func text(_ name: String) -> String? {
                    guard let i = column(name), i < row.count else { return nil }
                    let value = row[i].trimmingCharacters(in: .whitespaces)
                    return value.isEmpty || value.lowercased() == "null" ? nil : value
                }
                func flag(_ name: String) -> Bool { ["true", "t", "1"].contains(text(name)?.lowercased() ?? "") }
                func time(_ name: String) throws(Failure) -> Int64? {
                    guard let value = text(name) else { return nil }
                    guard let milliseconds = Self.milliseconds(value) else {
                        throw Failure(.badArguments, "file \(fileIndex + 1) line \(line): \(name) \(value.prefix(40)) is not a time")
                    }
                    return milliseconds
                }
                guard let store = text("store"), let transactionId = text("store_transaction_id"), let original = text("original_store_transaction_id"),
                    let productId = text("product_identifier"), let user = text("rc_original_app_user_id"), let start = try time("start_time")
                else {
                    throw Failure(.badArguments, "file \(fileIndex + 1) line \(line): a transaction needs its store, ids, product, user and start_time")
                }
                let refunded = try time("refunded_at")
                let paid = text("purchase_price_in_purchased_currency") ?? (refunded == nil ? text("price_in_purchased_currency") : nil)
                let transaction = Transaction(
                    store: store, transactionId: transactionId, originalTransactionId: original, productId: productId, originalAppUserId: user,
                    lastSeenAlias: text("rc_last_seen_app_user_id_alias"), start: start, end: try time("end_time"), effectiveEnd: try time("effective_end_time"),
                    gracePeriodEnd: try time("grace_period_end_time"), autoRenewable: text("is_auto_renewable") == nil ? true : flag("is_auto_renewable"),
                    trial: flag("is_trial_period"), intro: flag("is_in_intro_offer_period"), sandbox: flag("is_sandbox"), price: paid,
                    currency: text("purchased_currency"), taxPercentage: text("tax_percentage"), country: text("country"), refundedAt: refunded,
                    unsubscribedAt: try time("unsubscribe_detected_at"), billingIssueAt: try time("billing_issues_detected_at"),
                    renewalNumber: text("renewal_number").flatMap { Int64($0) }, trialConversion: flag("is_trial_conversion"),
                    entitlements: Self.list(text("entitlement_identifiers")), offer: text("offer"), updatedAt: try time("updated_at"), line: line)
                // Stripe's transaction ids repeat across renewals: RevenueCat's key is the id with the renewal number.
                let key = "\(store)\u{1F}\(transactionId)\u{1F}\(transaction.renewalNumber.map(String.init) ?? "")"
                if let known = latest[key] {
                    if (known.updatedAt ?? 0) > (transaction.updatedAt ?? 0) { continue }
                } else {
                    order.append(key)
                }
                latest[key] = transaction
            }
        }
        return order.compactMap { latest[$0] }
    }

    /// Imports `transactions` (see the type's comment); `deliver` sends their events to the endpoints too.
    public func importTransactions(_ transactions: [Transaction], deliver: Bool, progress: @escaping @Sendable (String) -> Void = { _ in }) async throws(Failure)
        -> ImportSummary
    {
        var summary = ImportSummary()
        summary.transactions = transactions.count
        let loop = HistoryLoop(progress: progress)
        // One subscription's transactions together, oldest first.
        var groups: [String: [Transaction]] = [:]
        var order: [String] = []
        for transaction in transactions {
            let key = "\(transaction.store)\u{1F}\(transaction.originalTransactionId)"
            if groups[key] == nil { order.append(key) }
            groups[key, default: []].append(transaction)
        }
        var linked = Set<String>()
        let now = self.now()
        // Play subscriptions the relay knows by their purchase token already (the stores' notifications during a
        // dual-run): the export's rows go to that token's subscription, so no payment is counted twice.
        let tokens = order.contains { $0.hasPrefix("play_store\u{1F}") } ? try await backend.googleTokensByFirstOrder(app: app.key) : [:]
        for (index, key) in order.enumerated() {
            guard var group = groups[key]?.sorted(by: { ($0.start, $0.renewalNumber ?? 0) < ($1.start, $1.renewalNumber ?? 0) }), let base = group.first else { continue }
            if base.store == "play_store", let token = tokens[base.originalTransactionId] {
                for index in group.indices { group[index].originalTransactionId = token }
            }
            let first = group[0]
            guard let store = Self.store(first.store), storeConfigured(store) else {
                summary.leftOut[first.store, default: 0] += group.count
                continue
            }
            summary.subscriptions += 1
            let user = group.last?.appUserId ?? first.appUserId
            // The customer's other id finds them too.
            for transaction in group where transaction.originalAppUserId != transaction.appUserId {
                let pair = transaction.originalAppUserId + "\u{1F}" + transaction.appUserId
                guard linked.insert(pair).inserted else { continue }
                // The aliases route refuses such an id (over 256 bytes, a control character): counted, and the import goes on.
                guard AppUser.isStorableId(transaction.originalAppUserId), AppUser.isStorableId(transaction.appUserId) else {
                    summary.aliasesNotLinked += 1
                    continue
                }
                if try await backend.linkAliases([transaction.originalAppUserId], to: transaction.appUserId, applicationId: app.applicationId) {
                    summary.aliasesLinked += 1
                } else {
                    summary.aliasConflicts += 1
                }
            }
            let records: [(id: String, record: OutgoingRecord)]
            if store == .promotional {
                var kept: [(String, OutgoingRecord)] = []
                for (action, record) in grantRecords(group, user: user, now: now, deliver: deliver) {
                    // A grant the relay holds was applied; its end, once the state says so.
                    let state = try await backend.subscription(store: .promotional, id: action.grantId)
                    if let state, action.action == .grant || state.status != .active {
                        summary.alreadyRecorded += 1
                        continue
                    }
                    kept.append((action.notificationId, record))
                }
                records = kept
            } else {
                let recorded = try await backend.recordedEvents(originalTransactionId: first.originalTransactionId, store: store)
                // What its state remembers applying (moments that changed it without an event: a cancellation
                // of renewal already off) counts as recorded too.
                let applied = Set(try await backend.subscription(store: store, id: first.originalTransactionId)?.recentNotifications.map(\.id) ?? [])
                let moments = Self.moments(group, user: user, now: now)
                // RevenueCat's Stripe payments cannot be matched with Stripe's invoices (its ids repeat across
                // renewals): a Stripe subscription the relay has from Stripe itself (its webhooks, `import
                // stripe`) is left to that.
                if store == .stripe, recorded.notificationIds.contains(where: { !$0.hasPrefix("revenuecat:") }) {
                    summary.alreadyRecorded += moments.count
                    continue
                }
                var kept: [(String, OutgoingRecord)] = []
                for moment in moments {
                    let done =
                        recorded.notificationIds.contains(moment.notificationId) || applied.contains(moment.notificationId)
                        || (moment.kind == .purchase && recorded.paidTransactionIds.contains(moment.transactionId))
                        || (moment.kind == .refund && recorded.revokedTransactionIds.contains(moment.transactionId))
                    if done {
                        summary.alreadyRecorded += 1
                        continue
                    }
                    let notification = RawNotification(
                        store: store, app: app.key, receivedAtMilliseconds: now, body: moment.json.serialized(), requestHeaders: [:],
                        source: RevenueCatRecord.source, historical: true, deliver: deliver)
                    kept.append((moment.notificationId, notification.record(topic: topic, subject: moment.originalTransactionId)))
                }
                records = kept
            }
            if !records.isEmpty {
                try await HistoryRun.append(records.map(\.record), producer: producer, topic: topic, rerun: HistoryRun.importAgain)
                summary.appended += records.count
            }
            if (index + 1) % 50 == 0 || index + 1 == order.count {
                loop.report(
                    index + 1, of: order.count, "subscriptions",
                    "\(summary.appended) records appended, \(summary.alreadyRecorded) already recorded, \(summary.leftOut.values.reduce(0, +)) left out")
            }
        }
        return summary
    }

    /// The moments of one subscription's transactions, in time order: each payment, billing issue,
    /// cancellation of renewal and refund, and the end of a subscription that has ended.
    static func moments(_ group: [Transaction], user: String, now: Int64) -> [RevenueCatRecord] {
        var moments: [RevenueCatRecord] = []
        for transaction in group {
            func moment(_ kind: RevenueCatRecord.Kind, at: Int64) -> RevenueCatRecord {
                RevenueCatRecord(
                    kind: kind, transactionId: transaction.transactionId + (transaction.store == "stripe" ? "#\(transaction.renewalNumber ?? 0)" : ""),
                    originalTransactionId: transaction.originalTransactionId, productId: transaction.productId, appUserId: user, at: at,
                    purchasedAt: transaction.start, expiresAt: transaction.autoRenewable ? (transaction.end ?? transaction.effectiveEnd) : nil,
                    renewalNumber: transaction.renewalNumber, autoRenewable: transaction.autoRenewable, trial: transaction.trial, intro: transaction.intro,
                    trialConversion: transaction.trialConversion, sandbox: transaction.sandbox, price: transaction.price, currency: transaction.currency,
                    taxPercentage: transaction.taxPercentage, country: transaction.country, gracePeriodEndsAt: transaction.gracePeriodEnd,
                    expirationReason: nil, offer: transaction.offer)
            }
            moments.append(moment(.purchase, at: transaction.start))
            if let at = transaction.billingIssueAt { moments.append(moment(.billingIssue, at: at)) }
            if let at = transaction.unsubscribedAt { moments.append(moment(.unsubscribe, at: at)) }
            if let at = transaction.refundedAt { moments.append(moment(.refund, at: at)) }
        }
        // A subscription whose last period (its grace period included) is over, and that was not refunded away.
        if let last = group.last, last.autoRenewable, last.refundedAt == nil, let end = last.effectiveEnd ?? last.end, end <= now {
            var expiration = moments.last { $0.transactionId.hasPrefix(last.transactionId) && $0.kind == .purchase } ?? moments[moments.count - 1]
            expiration.kind = .expiration
            expiration.at = end
            expiration.expirationReason =
                last.billingIssueAt != nil ? Reason.billingError.rawValue : last.unsubscribedAt != nil ? Reason.unsubscribe.rawValue : Reason.unknown.rawValue
            moments.append(expiration)
        }
        let rank: [RevenueCatRecord.Kind: Int] = [.purchase: 0, .billingIssue: 1, .unsubscribe: 2, .refund: 3, .expiration: 4]
        return moments.enumerated().sorted { ($0.element.at, rank[$0.element.kind] ?? 0, $0.offset) < ($1.element.at, rank[$1.element.kind] ?? 0, $1.offset) }
            .map(\.element)
    }

    /// A promotional transaction as a grant of its first entitlement (`PromotionalGrant`), and its end when
    /// it has ended; one grant per transaction, id `revenuecat:<store_transaction_id>`.
    func grantRecords(_ group: [Transaction], user: String, now: Int64, deliver: Bool) -> [(action: PromotionalGrant.Record, record: OutgoingRecord)] {
        var records: [(PromotionalGrant.Record, OutgoingRecord)] = []
        for transaction in group {
            guard let entitlement = transaction.entitlements.first else { continue }
            let grantId = "revenuecat:\(transaction.transactionId)"
            var actions = [PromotionalGrant.Record(
                action: .grant, grantId: grantId, appUserId: user, entitlement: entitlement, expiresAt: transaction.end,
                reason: "imported from RevenueCat", at: transaction.start)]
            if let end = transaction.end, end <= now {
                actions.append(PromotionalGrant.Record(
                    action: .expire, grantId: grantId, appUserId: user, entitlement: entitlement, expiresAt: end, reason: nil, at: end))
            }
            for action in actions {
                let notification = RawNotification(
                    store: .promotional, app: app.key, receivedAtMilliseconds: now, body: action.json.serialized(), requestHeaders: [:],
                    source: PromotionalGrant.source, historical: true, deliver: deliver)
                records.append((action, notification.record(topic: topic, subject: grantId)))
            }
        }
        return records
    }

    /// The relay's store for RevenueCat's `store` value; nil for stores the relay does not take.
    static func store(_ value: String) -> Store? {
        switch value.lowercased() {
        case "app_store", "mac_app_store": .apple
        case "play_store": .google
        case "stripe": .stripe
        case "promotional": .promotional
        default: nil
        }
    }

    func storeConfigured(_ store: Store) -> Bool {
        switch store {
        case .apple: app.apple != nil
        case .google: app.google != nil
        case .stripe: app.stripe != nil
        case .promotional: true
        case .paddle: false
        }
    }

    /// RevenueCat's times: `2023-01-01 08:27:06` (UTC), also with fractional seconds, a `T`, ` UTC`, `Z` or an
    /// offset (`+00:00`, `+0000`, `+00`).
    static func milliseconds(_ text: String) -> Int64? {
        var value = text.trimmingCharacters(in: .whitespaces)
        if value.uppercased().hasSuffix(" UTC") { value = String(value.dropLast(4)) + "Z" }
        if value.hasSuffix("z") { value = String(value.dropLast()) + "Z" }
        value = value.replacingOccurrences(of: " ", with: "T")
        // +0000 and +00 as +00:00.
        if let sign = value.dropFirst(19).lastIndex(where: { $0 == "+" || $0 == "-" }) {
            let zone = value[value.index(after: sign)...]
            if zone.count == 4, zone.allSatisfy(\.isNumber) { value = String(value[...sign]) + zone.prefix(2) + ":" + zone.suffix(2) }
            if zone.count == 2, zone.allSatisfy(\.isNumber) { value += ":00" }
        }
        if value.count == 10 { value += "T00:00:00" }
        let hasZone = value.hasSuffix("Z") || value.dropFirst(19).contains("+") || value.dropFirst(19).contains("-")
        if !hasZone { value += "Z" }
        return Timestamp.milliseconds(value)
    }

    /// `entitlement_identifiers`: a JSON array (`["pro"]`, export version 4 and later), else `{pro,plus}` or a
    /// comma-separated list.
    static func list(_ text: String?) -> [String] {
        guard let text, !text.isEmpty else { return [] }
        if let array = (try? JSON.parse(Array(text.utf8)))?.arrayValue { return array.compactMap(\.stringValue) }
        return text.trimmingCharacters(in: CharacterSet(charactersIn: "{}[] ")).split(separator: ",")
            .map { $0.trimmingCharacters(in: CharacterSet(charactersIn: "\" ")) }.filter { !$0.isEmpty }
    }
}

/// RFC 4180 CSV: fields separated by commas, a field in double quotes may hold commas, line breaks and
/// doubled quotes; lines end with LF or CRLF.
enum CSV {
    static func rows(_ text: String) -> [[String]] {
        var rows: [[String]] = []
        var row: [String] = []
        var field = ""
        var quoted = false
        var iterator = text.unicodeScalars.makeIterator()
        var pending: Unicode.Scalar? = nil
        func next() -> Unicode.Scalar? {
            if let scalar = pending {
                pending = nil
                return scalar
            }
            return iterator.next()
        }
        while let scalar = next() {
            if quoted {
                if scalar == "\"" {
                    if let following = next() {
                        if following == "\"" {
                            field.unicodeScalars.append("\"")
                        } else {
                            quoted = false
                            pending = following
                        }
                    } else {
                        quoted = false
                    }
                } else {
                    field.unicodeScalars.append(scalar)
                }
                continue
            }
            switch scalar {
            case "\"" where field.isEmpty:
                quoted = true
            case ",":
                row.append(field)
                field = ""
            case "\r":
                continue
            case "\n":
                row.append(field)
                rows.append(row)
                row = []
                field = ""
            default:
                field.unicodeScalars.append(scalar)
            }
        }
        if !field.isEmpty || !row.isEmpty {
            row.append(field)
            rows.append(row)
        }
        return rows
    }
}
