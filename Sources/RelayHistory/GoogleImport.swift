import Foundation
public import RelayCore

/// `revenue-relay import google`: Google Play has no list of an app's purchases, so an import names them:
/// purchase tokens with their product ids and, optionally, app user ids (what RevenueCat's Google import
/// takes). Each is read from the Play Developer API (a subscription, else a one-time product) and appended
/// as a `relay-source: play-api` record `{"purchaseToken", "productId", "kind", "appUserId"?}` (id
/// `import:<token>`), historical, delivered only with `--deliver`. The worker reads it from the Play API
/// again and applies it as Play's purchase notification: the subscription's state as Play knows it now and
/// its purchase event, bound to the app user when one is given. Play's API lists no past renewals.
extension GoogleHistoryCommands {
    /// One purchase to import.
    public struct ImportLine: Sendable, Equatable {
        public var purchaseToken: String
        public var productId: String
        public var appUserId: String?

        public init(purchaseToken: String, productId: String, appUserId: String? = nil) {
            self.purchaseToken = purchaseToken
            self.productId = productId
            self.appUserId = appUserId
        }
    }

    /// What `import google` did.
    public struct ImportSummary: Sendable, Equatable {
        public var purchases = 0
        /// Purchases the relay already holds (imported before, or seen live): skipped.
        public var alreadyKnown = 0
        /// Appended for the worker.
        public var imported = 0
        /// Tokens the Play API does not know for this app's package (wrong, another app's, expired long ago).
        public var unknown = 0

        public init(purchases: Int = 0, alreadyKnown: Int = 0, imported: Int = 0, unknown: Int = 0) {
            self.purchases = purchases
            self.alreadyKnown = alreadyKnown
            self.imported = imported
            self.unknown = unknown
        }
    }

    /// The purchases of an import file: one a line, `purchaseToken,productId[,appUserId]`, or CSV with a header
    /// naming the columns (`purchase_token`/`token`, `product_id`/`product`/`subscription_id`,
    /// `app_user_id`/`user_id`, in any order, as RevenueCat's Google import takes them). Blank lines and
    /// lines starting with `#` are skipped.
    public static func parseImportFile(_ text: String) throws(Failure) -> [ImportLine] {
        var lines = text.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty && !$0.hasPrefix("#") }
        guard let first = lines.first else { return [] }
        func cells(_ line: String) -> [String] { line.split(separator: ",", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: CharacterSet(charactersIn: " \"")) } }
        var columns = (token: 0, product: 1, user: 2)
        let header = cells(first).map { $0.lowercased() }
        if header.contains(where: { $0.contains("token") }) {
            guard let token = header.firstIndex(where: { ["purchase_token", "purchasetoken", "token"].contains($0) }),
                let product = header.firstIndex(where: { ["product_id", "productid", "product", "subscription_id", "sku"].contains($0) })
            else { throw Failure(.badArguments, "the file's header names no purchase_token and product_id columns: \(first.prefix(120))") }
            columns = (token, product, header.firstIndex(where: { ["app_user_id", "appuserid", "user_id"].contains($0) }) ?? -1)
            lines.removeFirst()
        }
        var result: [ImportLine] = []
        for (number, line) in lines.enumerated() {
            let row = cells(line)
            guard row.count > max(columns.token, columns.product), !row[columns.token].isEmpty, !row[columns.product].isEmpty else {
                throw Failure(.badArguments, "line \(number + 1) is not purchaseToken,productId[,appUserId] (\(row.count) cells)")
            }
            let user = columns.user >= 0 && row.count > columns.user && !row[columns.user].isEmpty ? row[columns.user] : nil
            result.append(ImportLine(purchaseToken: row[columns.token], productId: row[columns.product], appUserId: user))
        }
        return result
    }

    /// Imports `purchases` (see the type's comment); `deliver` sends their events to the endpoints too.
    /// A purchase whose state the relay holds is skipped, so a rerun (or a resumed run) appends nothing
    /// twice. `progress` gets a line every 50 purchases: counts, rate and what remains.
    public func importPurchases(_ purchases: [ImportLine], deliver: Bool, progress: @escaping @Sendable (String) -> Void = { _ in }) async throws(Failure)
        -> ImportSummary
    {
        var summary = ImportSummary(purchases: purchases.count)
        let loop = HistoryLoop(pacing: pacing, progress: progress)
        var batch: [OutgoingRecord] = []
        func flush() async throws(Failure) {
            guard !batch.isEmpty else { return }
            try await HistoryRun.append(batch, producer: producer, topic: topic, rerun: HistoryRun.importAgain)
            summary.imported += batch.count
            batch = []
        }
        for (index, line) in purchases.enumerated() {
            if try await backend.subscription(store: .google, id: line.purchaseToken) != nil {
                summary.alreadyKnown += 1
            } else {
                var kind = "subscription"
                var purchasedAt: Int64?
                do throws(StoreAPIError) {
                    let purchase = try await loop.call("a purchase") { () async throws(StoreAPIError) in
                        try await client.subscription(packageName: packageName, purchaseToken: line.purchaseToken)
                    }
                    purchasedAt = Timestamp.milliseconds(purchase["startTime"]?.stringValue)
                } catch {
                    // Not a subscription's token: 404, or 400 for a one-time product's.
                    guard error.kind == .notFound || error.status == 400 else { throw Self.failure(error, reading: "a purchase from the Play Developer API") }
                    do throws(StoreAPIError) {
                        let purchase = try await loop.call("a purchase") { () async throws(StoreAPIError) in
                            try await client.product(packageName: packageName, productId: line.productId, purchaseToken: line.purchaseToken)
                        }
                        purchasedAt = Self.milliseconds(purchase["purchaseTimeMillis"])
                        kind = "product"
                    } catch {
                        guard error.kind == .notFound || error.status == 400 else { throw Self.failure(error, reading: "a purchase from the Play Developer API") }
                        kind = ""
                    }
                }
                if kind.isEmpty {
                    summary.unknown += 1
                } else {
                    var body: [String: JSON] = ["purchaseToken": .string(line.purchaseToken), "productId": .string(line.productId), "kind": .string(kind)]
                    // The purchase happened then, not on the import's day: revenue by day puts it there.
                    if let purchasedAt { body["eventTime"] = .integer(purchasedAt) }
                    if let user = line.appUserId { body["appUserId"] = .string(user) }
                    batch.append(
                        RawNotification(
                            store: .google, app: app.key, receivedAtMilliseconds: now(), body: JSON.object(body).serialized(), requestHeaders: [:],
                            source: RawNotification.playAPISource, historical: true, deliver: deliver
                        ).record(topic: topic, subject: line.purchaseToken))
                    if batch.count >= 100 { try await flush() }
                }
            }
            if (index + 1) % 50 == 0 || index + 1 == purchases.count {
                loop.report(
                    index + 1, of: purchases.count, "purchases",
                    "\(summary.imported + batch.count) imported, \(summary.alreadyKnown) known, \(summary.unknown) unknown")
            }
        }
        try await flush()
        return summary
    }
}
