import Foundation
public import RelayCore

/// `revenue-relay import paddle`: the account's Paddle subscriptions with their payments, brought in as
/// history, as `import stripe` does for Stripe. Paddle lists them (`GET /subscriptions`); a subscription
/// belongs to the app when its price is one of the app's `PADDLE` products (every subscription, when the
/// app lists none). For each one the relay does not hold, `relay-source: paddle-api` records `{"objectId",
/// "subject", "import"}` are appended, historical and delivered only with `--deliver`:
///
/// 1. the subscription as it began (`created`): its initial purchase, at its start;
/// 2. each completed renewal transaction, oldest first (`paid`): a renewal with its money;
/// 3. each approved refund or chargeback (or its reversal) of the subscription (`refunded`);
/// 4. the subscription as it is now (`current`): its cancellation, end or change, and its current state.
///
/// The worker reads every object from Paddle again and applies it as the event Paddle would have sent, ids
/// `import:<id>:<kind>`; an adjustment's events are named by the adjustment, a renewal's payment counted
/// once by its transaction, so Paddle's own late notifications add nothing.
extension PaddleHistoryCommands {
    public typealias ImportSummary = SubscriptionImportSummary


    /// Imports the app's subscriptions, as the type's comment says; `deliver` sends their events to the
    /// endpoints too. A rerun (or a resumed run) appends nothing twice once the worker has applied what the
    /// first appended.
    public func importSubscriptions(deliver: Bool, progress: @escaping @Sendable (String) -> Void = { _ in }) async throws(Failure) -> ImportSummary {
        let producer = try appender()
        var summary = ImportSummary()
        let loop = HistoryLoop(pacing: pacing, progress: progress)
        let prices = Set(app.products.filter { $0.store == "PADDLE" }.map(\.productId))
        func failure(_ error: StoreAPIError) -> Failure {
            Self.failure(error, done: "\(summary.imported) subscriptions were imported before (a rerun skips them)")
        }
        func next(_ page: JSON) -> String? {
            page["meta"]?["pagination"]?["has_more"]?.boolValue == true ? page["data"]?.arrayValue?.last?["id"]?.stringValue : nil
        }
        try await loop.pages("the subscriptions list") { after throws(StoreAPIError) in
            let page = try await client.subscriptions(after: after)
            return (page, next(page))
        } failure: { error in
            failure(error)
        } each: { page, _ throws(Failure) in
            for subscription in page["data"]?.arrayValue ?? [] {
                guard let id = subscription["id"]?.stringValue, id.hasPrefix("sub_") else { continue }
                let price = subscription["items"]?.arrayValue?.first?["price"]?["id"]?.stringValue
                if !prices.isEmpty, !prices.contains(price ?? "") {
                    summary.otherApps += 1
                    continue
                }
                summary.subscriptions += 1
                // A subscription the relay holds (from its notifications, or an earlier run) keeps its purchase and
                // state; only the payments and refunds it never recorded are brought in.
                let held = try await backend.subscription(store: .paddle, id: id) != nil
                let recorded = held ? try await backend.recordedEvents(originalTransactionId: id, store: .paddle) : HistoryBackend.RecordedEvents()
                if held { summary.alreadyKnown += 1 }
                var records: [OutgoingRecord] = []
                if !held { records.append(record(objectId: id, subject: id, field: "import", value: "created", historical: true, deliver: deliver)) }
                var transactions: [JSON] = []
                try await loop.pages("the transactions of \(id)") { after throws(StoreAPIError) in
                    // Paddle lists at most 30 transactions a page.
                    let page = try await client.transactions(subscriptionId: id, newestFirst: false, perPage: 30, after: after)
                    return (page, next(page))
                } failure: { error in
                    failure(error)
                } each: { page, _ throws(Failure) in
                    transactions += page["data"]?.arrayValue ?? []
                }
                for transaction in transactions {
                    guard let transactionId = transaction["id"]?.stringValue, !recorded.paidTransactionIds.contains(transactionId) else { continue }
                    if Self.isRenewal(transaction) {
                        records.append(record(objectId: transactionId, subject: id, field: "import", value: "paid", historical: true, deliver: deliver))
                        summary.renewals += 1
                    }
                }
                var adjustments: [JSON] = []
                try await loop.pages("the adjustments of \(id)") { after throws(StoreAPIError) in
                    let page = try await client.adjustments(subscriptionId: id, after: after)
                    return (page, next(page))
                } failure: { error in
                    failure(error)
                } each: { page, _ throws(Failure) in
                    adjustments += (page["data"]?.arrayValue ?? []).filter {
                        $0["status"]?.stringValue == "approved" && ["refund", "chargeback", "chargeback_reverse"].contains($0["action"]?.stringValue ?? "")
                    }
                }
                for adjustment in adjustments.sorted(by: { ($0["created_at"]?.stringValue ?? "") < ($1["created_at"]?.stringValue ?? "") }) {
                    guard let adjustmentId = adjustment["id"]?.stringValue, !recorded.notificationIds.contains("import:\(adjustmentId):refunded"),
                        !(held && recorded.revokedTransactionIds.contains(adjustment["transaction_id"]?.stringValue ?? ""))
                    else { continue }
                    records.append(record(objectId: adjustmentId, subject: id, field: "import", value: "refunded", historical: true, deliver: deliver))
                    summary.refunds += 1
                }
                if !held { records.append(record(objectId: id, subject: id, field: "import", value: "current", historical: true, deliver: deliver)) }
                guard !records.isEmpty else { continue }
                try await HistoryRun.append(records, producer: producer, topic: topic, rerun: HistoryRun.importAgain)
                if !held { summary.imported += 1 }
                loop.report(
                    summary.subscriptions, "subscriptions",
                    "\(summary.imported) imported (\(summary.renewals) renewals, \(summary.refunds) refunds), \(summary.alreadyKnown) known")
            }
        }
        return summary
    }
}
