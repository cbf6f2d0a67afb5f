import Foundation
public import RelayCore

/// `revenue-relay import stripe`: the account's subscriptions with their payments, brought in as history.
/// Stripe lists them (`GET /v1/subscriptions?status=all`), so nothing needs naming; a subscription belongs
/// to the app when its price is one of the app's `STRIPE` products (every subscription, when the app lists
/// none). For each subscription the relay does not hold, `relay-source: stripe-api` records
/// `{"objectId", "subject", "import"}` are appended, historical and delivered only with `--deliver`:
///
/// 1. the subscription as it began (`created`): its initial purchase, at its start;
/// 2. each paid renewal invoice, oldest first (`paid`): a renewal with its money, at its payment;
/// 3. each refunded charge of those invoices (`refunded`): the refund, at its last refund;
/// 4. the subscription as it is now (`current`): its cancellation, end or change, and its current state.
///
/// The worker reads every object from Stripe again and applies it as the event Stripe would have sent, ids
/// `import:<id>:<kind>`; one payment is counted once across an import and Stripe's own webhooks (by its
/// invoice id). One-time purchases (Checkout in payment mode) are not listed by Stripe's subscriptions.
extension StripeHistoryCommands {
    public typealias ImportSummary = SubscriptionImportSummary


    /// Imports the app's subscriptions created at or after `since` (Unix ms; nil: all), as the type's comment
    /// says; `deliver` sends their events to the endpoints too. A rerun (or a resumed run) appends nothing twice
    /// once the worker has applied what the first appended.
    public func importSubscriptions(since: Int64?, deliver: Bool, progress: @escaping @Sendable (String) -> Void = { _ in }) async throws(Failure)
        -> ImportSummary
    {
        var summary = ImportSummary()
        let loop = HistoryLoop(pacing: pacing, progress: progress)
        let prices = Set(app.products.filter { $0.store == "STRIPE" }.map(\.productId))
        func failure(_ error: StoreAPIError) -> Failure {
            Self.failure(error, done: "\(summary.imported) subscriptions were imported before (a rerun skips them)")
        }
        try await loop.pages("the subscriptions list") { cursor throws(StoreAPIError) in
            let page = try await client.subscriptions(createdFrom: since.map { $0 / 1000 }, startingAfter: cursor)
            return (page, page["has_more"]?.boolValue == true ? page["data"]?.arrayValue?.last?["id"]?.stringValue : nil)
        } failure: { error in
            failure(error)
        } each: { page, _ throws(Failure) in
            for subscription in page["data"]?.arrayValue ?? [] {
                guard let id = subscription["id"]?.stringValue, id.hasPrefix("sub_") else { continue }
                let price = subscription["items"]?["data"]?.arrayValue?.first?["price"]?["id"]?.stringValue
                if !prices.isEmpty, !prices.contains(price ?? "") {
                    summary.otherApps += 1
                    continue
                }
                summary.subscriptions += 1
                // Never paid (incomplete, incomplete_expired): no purchase to import.
                if ["incomplete", "incomplete_expired"].contains(subscription["status"]?.stringValue ?? "") { continue }
                // A subscription the relay holds (from its webhooks, or an earlier run) keeps its purchase and
                // state; only the payments and refunds it never recorded are brought in.
                let held = try await backend.subscription(store: .stripe, id: id) != nil
                let recorded = held ? try await backend.recordedEvents(originalTransactionId: id, store: .stripe) : HistoryBackend.RecordedEvents()
                if held { summary.alreadyKnown += 1 }
                var records: [OutgoingRecord] = []
                // Its paid invoices, oldest first: the renewals (the first invoice is the purchase itself).
                var invoices: [JSON] = []
                try await loop.pages("the invoices of \(id)") { cursor throws(StoreAPIError) in
                    let page = try await client.invoices(subscription: id, startingAfter: cursor)
                    return (page, page["has_more"]?.boolValue == true ? page["data"]?.arrayValue?.last?["id"]?.stringValue : nil)
                } failure: { error in
                    failure(error)
                } each: { page, _ throws(Failure) in
                    invoices += page["data"]?.arrayValue ?? []
                }
                invoices.sort { ($0["created"]?.int64Value ?? 0) < ($1["created"]?.int64Value ?? 0) }
                if !held {
                    // The purchase, paid by the subscription's first invoice.
                    let first = invoices.first { $0["billing_reason"]?.stringValue == "subscription_create" }?["id"]?.stringValue
                    records.append(
                        record(objectId: id, subject: id, field: "import", value: "created", historical: true, deliver: deliver, extra: ["firstInvoice": first.map(JSON.string) ?? .null]))
                }
                for invoice in invoices {
                    guard let invoiceId = invoice["id"]?.stringValue, !recorded.paidTransactionIds.contains(invoiceId) else { continue }
                    let reason = invoice["billing_reason"]?.stringValue
                    if reason == "subscription_cycle" || (reason == "subscription_update" && (invoice["amount_paid"]?.int64Value ?? 0) > 0) {
                        records.append(record(objectId: invoiceId, subject: id, field: "import", value: "paid", historical: true, deliver: deliver))
                        summary.renewals += 1
                    }
                }
                // Refunds of those invoices' charges: the customer's charges name their invoice.
                let invoiceIds = Set(invoices.compactMap { $0["id"]?.stringValue })
                if let customer = subscription["customer"]?.stringValue ?? subscription["customer"]?["id"]?.stringValue, !invoiceIds.isEmpty {
                    var refunded: [JSON] = []
                    try await loop.pages("the charges of \(customer)") { cursor throws(StoreAPIError) in
                        let page = try await client.charges(customer: customer, startingAfter: cursor)
                        return (page, page["has_more"]?.boolValue == true ? page["data"]?.arrayValue?.last?["id"]?.stringValue : nil)
                    } failure: { error in
                        failure(error)
                    } each: { page, _ throws(Failure) in
                        refunded += (page["data"]?.arrayValue ?? []).filter { charge in
                            (charge["amount_refunded"]?.int64Value ?? 0) > 0
                                && invoiceIds.contains(charge["invoice"]?.stringValue ?? charge["invoice"]?["id"]?.stringValue ?? "")
                        }
                    }
                    for charge in refunded.sorted(by: { ($0["created"]?.int64Value ?? 0) < ($1["created"]?.int64Value ?? 0) }) {
                        let invoiceId = charge["invoice"]?.stringValue ?? charge["invoice"]?["id"]?.stringValue ?? ""
                        guard let chargeId = charge["id"]?.stringValue, !recorded.revokedTransactionIds.contains(invoiceId),
                            !recorded.notificationIds.contains("import:\(chargeId):refunded")
                        else { continue }
                        records.append(record(objectId: chargeId, subject: id, field: "import", value: "refunded", historical: true, deliver: deliver))
                        summary.refunds += 1
                    }
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

    func record(
        objectId: String, subject: String, field: String, value: String, historical: Bool = false, deliver: Bool = true, extra: [String: JSON] = [:]
    ) -> OutgoingRecord {
        var body: [String: JSON] = ["objectId": .string(objectId), "subject": .string(subject), field: .string(value)]
        body.merge(extra) { $1 }
        return RawNotification(
            store: .stripe, app: app.key, receivedAtMilliseconds: now(), body: JSON.object(body).serialized(), requestHeaders: [:],
            source: RawNotification.stripeAPISource, historical: historical, deliver: deliver
        ).record(topic: topic, subject: subject)
    }
}
