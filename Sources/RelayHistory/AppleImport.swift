import Foundation
import RelayAppStoreAPI
import RelayConfig
import RelayCore
import RelayVerification

extension AppleHistoryCommands {
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
        originalTransactionIds ids: [String], deliver: Bool, progress: @escaping @Sendable (String) -> Void = { _ in }
    ) async throws(Failure) -> ImportSummary {
        var summary = ImportSummary()
        var seenTransactions = Set<String>()
        var seenSubjects = Set<String>()
        let loop = HistoryLoop(pacing: pacing, progress: progress)
        for (position, id) in ids.enumerated() {
            loop.report(position, of: ids.count, "customers", "\(id): reading the transaction history")
            // Get Transaction History answers the customer's whole history in the app: several ids of
            // one customer return the same transactions, read once.
            var transactions: [(payload: JSON, signed: String)] = []
            var failed: AppStoreAPIError?
            do throws(CommandFailure) {
                try await loop.pages("the transaction history of \(id)") { revision throws(AppStoreAPIError) in
                    let page = try await client.transactionHistoryPage(transactionId: id, revision: revision)
                    return (page, page.hasMore ? page.revision : nil)
                } failure: { error in
                    failed = error
                    return Failure(.unavailable, error.message)
                } each: { page, number throws(Failure) in
                    for signed in page.signedTransactions {
                        do {
                            transactions.append((try verifier.verifySignedData(signed), signed))
                        } catch {
                            summary.failures.append((id, "a signed transaction was rejected (\(error)); it is not imported"))
                        }
                    }
                    loop.report(position, of: ids.count, "customers", "\(id): page \(number), \(transactions.count) transactions")
                }
            } catch {
                guard let error = failed else { throw error }
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
                // One subscription's records in one batch, in order, on one key: the worker applies them in this order.
                try await HistoryRun.append(
                    outgoing, producer: producer, topic: topic,
                    rerun: "\(summary.recordsAppended) records were appended before, run the same import again to finish")
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
}
