import Foundation
import Logging
import RelayApp
import RelayConfig
import RelayCore
import RelayHistory
import RelayHTTPClient
import RelayTestSupport
import Testing

/// `import revenuecat` on a whole relay (embedded log) with RevenueCat's Transactions export (CSV, the
/// documented columns): an App Store subscription with a trial, its conversion, a refunded renewal and a
/// cancellation; a Play subscription that ended after a billing issue; a promotional grant; an Amazon
/// purchase left out. States, customer info and historical events come out as the stores' own would have
/// made them, the customer keeps both ids, a transaction re-sent in a later delivery keeps its newest
/// version, and a second run (or one over what an earlier run imported) appends nothing twice.
@Suite(.serialized) struct RevenueCatImportTests {
    static let publicKey = "pk_revenuecat_import_0123456789"
    static let header =
        "rc_original_app_user_id,rc_last_seen_app_user_id_alias,country,product_identifier,start_time,end_time,store,is_auto_renewable,"
        + "is_trial_period,is_in_intro_offer_period,is_sandbox,price_in_usd,takehome_percentage,store_transaction_id,original_store_transaction_id,"
        + "refunded_at,unsubscribe_detected_at,billing_issues_detected_at,purchased_currency,price_in_purchased_currency,entitlement_identifiers,"
        + "renewal_number,is_trial_conversion,presented_offering,reserved_subscriber_attributes,custom_subscriber_attributes,platform,"
        + "grace_period_end_time,effective_end_time,purchase_price_in_purchased_currency,updated_at"

    /// One export row; times are days from now, written as RevenueCat writes them (`2023-01-01 08:27:06`, UTC).
    static func row(
        user: String = "$RCAnonymousID:87c6049c58069238dce29853916d624c", alias: String, product: String, start: Double, end: Double?, store: String,
        renewing: Bool = true, trial: Bool = false, transaction: String, original: String, refunded: Double? = nil, unsubscribed: Double? = nil,
        billingIssue: Double? = nil, price: String, paid: String? = nil, entitlements: String = #"["pro"]"#, renewal: Int, conversion: Bool = false,
        updated: Double = 0
    ) -> String {
        func time(_ days: Double?) -> String {
            guard let days else { return "" }
            let formatter = DateFormatter()
            formatter.locale = Locale(identifier: "en_US_POSIX")
            formatter.timeZone = TimeZone(identifier: "UTC")
            formatter.dateFormat = "yyyy-MM-dd HH:mm:ss"
            return formatter.string(from: Date(timeIntervalSinceNow: days * 86_400))
        }
        let attributes = #""{""$email"": {""value"": ""kim@example.com"", ""updated_at_ms"": 1672549200}}""#
        let cells: [String] = [
            user, alias, "GB", product, time(start), time(end), store, renewing ? "true" : "false", trial ? "true" : "false", "false", "true", price,
            "0.7", transaction, original, time(refunded), time(unsubscribed), time(billingIssue), "USD", refunded == nil ? price : "0",
            "\"" + entitlements.replacingOccurrences(of: "\"", with: "\"\"") + "\"", String(renewal), conversion ? "true" : "false",
            "Default Offering", attributes, "{}", "ios", "", time(end), paid ?? price, time(updated),
        ]
        return cells.joined(separator: ",")
    }

    static func firstDelivery() -> String {
        [
            header,
            // App Store: a trial, its conversion, a renewal refunded later, and the current period.
            row(alias: "user-rc1", product: "com.example.pro.monthly", start: -90, end: -83, store: "app_store", trial: true,
                transaction: "1000000000000001", original: "1000000000000001", price: "0", renewal: 1),
            row(alias: "user-rc1", product: "com.example.pro.monthly", start: -83, end: -53, store: "app_store",
                transaction: "1000000000000002", original: "1000000000000001", price: "9.99", renewal: 2, conversion: true),
            row(alias: "user-rc1", product: "com.example.pro.monthly", start: -53, end: -23, store: "app_store",
                transaction: "1000000000000003", original: "1000000000000001", refunded: -50, price: "9.99", renewal: 3),
            row(alias: "user-rc1", product: "com.example.pro.monthly", start: -23, end: 7, store: "app_store",
                transaction: "1000000000000004", original: "1000000000000001", price: "9.99", renewal: 4, updated: -20),
            // Play: one period, a billing issue at its end, never paid again.
            row(user: "user-rc2", alias: "user-rc2", product: "pro_monthly", start: -40, end: -10, store: "play_store",
                transaction: "GPA.1111-2222-3333-44444", original: "GPA.1111-2222-3333-44444", billingIssue: -11, price: "4.99", renewal: 1),
            // A promotional grant, and a purchase of a store the relay does not take.
            row(user: "user-rc3", alias: "user-rc3", product: "rc_promo_pro_monthly", start: -5, end: 25, store: "promotional", renewing: false,
                transaction: "promo-1", original: "promo-1", price: "0", renewal: 1),
            row(user: "user-rc4", alias: "user-rc4", product: "amzn.pro", start: -5, end: 25, store: "amazon",
                transaction: "amzn-1", original: "amzn-1", price: "2.99", renewal: 1),
        ].joined(separator: "\r\n") + "\r\n"
    }

    /// A later delivery: the current period again, now with renewal turned off (newer `updated_at`).
    static func secondDelivery() -> String {
        [
            header,
            row(alias: "user-rc1", product: "com.example.pro.monthly", start: -23, end: 7, store: "app_store",
                transaction: "1000000000000004", original: "1000000000000001", unsubscribed: -10, price: "9.99", renewal: 4, updated: -10),
        ].joined(separator: "\n")
    }

    @Test func theExportBecomesStatesAndHistoricalEventsOnceWithBothIds() async throws {
        let google = """
            google:
                  packageName: com.example.app
                  pushAudience: "https://relay.test/google"
                  pushServiceAccount: "pubsub-push@example.iam.gserviceaccount.com"
                  jwks: \(Fixtures.path("google/jwks.json"))
                products:
                  - { productId: com.example.pro.monthly, store: APP_STORE, entitlements: [pro] }
                  - { productId: pro_monthly, store: PLAY_STORE, entitlements: [pro] }
            """
        var text = AppleRelayConfiguration.text(app: [#"publicApiKeys: ["\#(Self.publicKey)"]"#])
        text = text.replacingOccurrences(
            of: "products:\n      - { productId: com.example.pro.monthly, store: APP_STORE, entitlements: [pro] }", with: google)
        let configuration = try AppleRelayConfiguration.parse(text, name: "revenuecat-import")
        #expect(configuration.apps[0].google != nil)
        let relay = try await TestRelay(configuration: configuration, log: .embedded)
        let backendURL = await relay.environment.process.backendAddress.value()
        @Sendable func events(_ type: String) async throws -> [JSON] { try await relay.events(type) }
        @Sendable func distinct(_ type: String) async throws -> Int { try await relay.distinctEvents(type) }
        @Sendable func entitlements(_ user: String) async throws -> [String] {
            let response = try await relay.http.send(
                "GET", backendURL + "/subscriptions-api/public/v1/users/\(PercentEncoding.pathSegment(user))/entitlements",
                headers: [("Authorization", "Bearer \(Self.publicKey)")])
            return try JSON.parse(response.body)["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } ?? []
        }
        let commands = try RevenueCatHistoryCommands(
            configuration: configuration, appKey: "demo", producer: try relay.environment.process.log.producer, backendURL: backendURL,
            logger: Logger(label: "test"))

        // The first delivery alone (an earlier import), then both: only what is new is appended.
        let early = try await commands.importTransactions(try RevenueCatHistoryCommands.parseExport([Self.firstDelivery()]), deliver: false)
        #expect(early.transactions == 7)
        #expect(early.leftOut == ["amazon": 1])
        #expect(early.aliasesLinked == 1)
        try await waitUntil("the first import applied") { try await distinct("renewal") == 3 }
        let transactions = try RevenueCatHistoryCommands.parseExport([Self.firstDelivery(), Self.secondDelivery()])
        #expect(transactions.count == 7)
        #expect(transactions.first { $0.transactionId == "1000000000000004" }?.unsubscribedAt != nil, "the newer version of a re-sent transaction wins")
        let summary = try await commands.importTransactions(transactions, deliver: false)
        #expect(summary.appended == 1, "only the cancellation of renewal is new: \(summary)")
        // Four payments and a refund of the App Store subscription, the Play one's payment, billing issue and
        // end, and the grant.
        #expect(summary.alreadyRecorded == 9, "\(summary)")

        try await waitUntil("the whole history") {
            let purchases = try await distinct("initial_purchase")
            let cancellations = try await distinct("cancellation")
            let expirations = try await distinct("expiration")
            let issues = try await distinct("billing_issue")
            let grants = try await distinct("non_renewing_purchase")
            return purchases == 2 && cancellations == 2 && expirations == 1 && issues == 1 && grants == 1
        }
        // The App Store subscription: a trial, its conversion, two paid renewals, one refunded, renewal off.
        let purchase = try #require(try await events("initial_purchase").first { $0["data"]?["store"] == "APP_STORE" })
        #expect(purchase["data"]?["periodType"] == "TRIAL")
        #expect(purchase["data"]?["originalAppUserId"] == "user-rc1", "\(purchase)")
        let renewals = try await events("renewal")
        #expect(Set(renewals.compactMap { $0["data"]?["transactionId"]?.stringValue }) == ["1000000000000002", "1000000000000003", "1000000000000004"])
        #expect(renewals.first { $0["data"]?["transactionId"] == "1000000000000002" }?["data"]?["isTrialConversion"] == true)
        #expect(renewals.allSatisfy { $0["data"]?["price"]?.doubleValue == 9.99 }, "\(renewals)")
        let cancellations = try await events("cancellation")
        let refund = try #require(cancellations.first { $0["data"]?["cancelReason"] == "CUSTOMER_SUPPORT" })
        #expect(refund["data"]?["transactionId"] == "1000000000000003")
        #expect(refund["data"]?["price"]?.doubleValue == -9.99)
        #expect(cancellations.contains { $0["data"]?["transactionId"] == "1000000000000004" && $0["data"]?["cancelReason"] == "UNSUBSCRIBE" })
        // The Play subscription ended with its billing issue.
        let expiration = try #require(try await events("expiration").first)
        #expect(expiration["data"]?["originalTransactionId"] == "GPA.1111-2222-3333-44444")
        #expect(expiration["data"]?["expirationReason"] == "BILLING_ERROR")
        // Historical, never delivered.
        #expect(try await relay.records(topic: configuration.topics.events).allSatisfy { $0.headers.first(named: RelayHeaderName.historical)?.stringValue == "true" })
        #expect(try await relay.records(topic: configuration.topics.deliveries).isEmpty)
        // Customer info: by the last seen id and by RevenueCat's original (anonymous) id alike.
        #expect(try await entitlements("user-rc1") == ["pro"])
        #expect(try await entitlements("$RCAnonymousID:87c6049c58069238dce29853916d624c") == ["pro"])
        #expect(try await entitlements("user-rc2") == [])
        #expect(try await entitlements("user-rc3") == ["pro"])
        #expect(try await entitlements("user-rc4") == [])
        // No customer attributes (an e-mail) were carried into what the relay recorded.
        let notifications = try await relay.records(topic: configuration.topics.notifications).map { String(decoding: $0.value, as: UTF8.self) }
        #expect(!notifications.contains { $0.contains("kim@example.com") })

        // Again: everything is recorded; nothing is appended.
        let appended = try await relay.records(topic: configuration.topics.notifications).count
        let again = try await commands.importTransactions(transactions, deliver: false)
        #expect(again.appended == 0, "\(again)")
        #expect(again.alreadyRecorded == 10, "\(again)")
        #expect(try await relay.records(topic: configuration.topics.notifications).count == appended)
        #expect(try await distinct("renewal") == 3)
        #expect(try await distinct("cancellation") == 2)
        try await relay.stop()
    }

    /// The aliases route refuses an id with a control character or over 256 bytes: such a pair is counted and not
    /// linked, and the import goes on (the purchase imported, only the link missing).
    @Test func aPairWithAnIdTheBackendRefusesIsNotLinkedAndTheImportGoesOn() async throws {
        let configuration = try AppleRelayConfiguration.parse(AppleRelayConfiguration.text(app: []), name: "revenuecat-control")
        let relay = try await TestRelay(configuration: configuration, log: .embedded)
        let commands = try RevenueCatHistoryCommands(
            configuration: configuration, appKey: "demo", producer: try relay.environment.process.log.producer,
            backendURL: await relay.environment.process.backendAddress.value(), logger: Logger(label: "test"))
        let export = [
            Self.header,
            Self.row(alias: "user\u{1}rc", product: "com.example.pro.monthly", start: -10, end: 20, store: "app_store",
                transaction: "1000000000000091", original: "1000000000000091", price: "9.99", renewal: 1),
            Self.row(user: "$RCAnonymousID:00000000000000000000000000000092", alias: "user-rc92", product: "com.example.pro.monthly", start: -10,
                end: 20, store: "app_store", transaction: "1000000000000092", original: "1000000000000092", price: "9.99", renewal: 1),
            Self.row(alias: String(repeating: "u", count: 257), product: "com.example.pro.monthly", start: -10, end: 20, store: "app_store",
                transaction: "1000000000000093", original: "1000000000000093", price: "9.99", renewal: 1),
        ].joined(separator: "\n")
        let summary = try await commands.importTransactions(try RevenueCatHistoryCommands.parseExport([export]), deliver: false)
        #expect(summary.aliasesNotLinked == 2 && summary.aliasesLinked == 1, "\(summary)")
        #expect(summary.subscriptions == 3 && summary.appended >= 3, "\(summary)")
        try await waitUntil("the three purchases applied") { try await relay.distinctEvents("initial_purchase") == 3 }
        try await relay.stop()
    }

    @Test func theDocumentedExportVersionsAreRead() throws {
        let v5 = try String(contentsOfFile: Fixtures.path("revenuecat/transactions-v5.csv"), encoding: .utf8)
        let v3 = try String(contentsOfFile: Fixtures.path("revenuecat/transactions-v3.csv"), encoding: .utf8)
        let transactions = try RevenueCatHistoryCommands.parseExport([v3, "\u{FEFF}" + v5])
        #expect(transactions.count == 6)
        let trial = try #require(transactions.first { $0.transactionId == "2000000100000001" })
        #expect(trial.trial && trial.autoRenewable && !trial.sandbox)
        #expect(trial.appUserId == "user-42")
        #expect(trial.originalAppUserId == "$RCAnonymousID:87c6049c58069238dce29853916d624c")
        #expect(trial.start == Timestamp.milliseconds("2026-01-01T08:27:06Z"))
        #expect(trial.entitlements == ["pro"])
        let conversion = try #require(transactions.first { $0.transactionId == "2000000100000002" })
        #expect(conversion.trialConversion && conversion.renewalNumber == 2 && conversion.price == "9.99" && conversion.currency == "GBP")
        #expect(conversion.offer == "black_friday_discount")
        // A refunded row's price is zeroed by RevenueCat; what was paid is purchase_price_in_purchased_currency.
        let refunded = try #require(transactions.first { $0.transactionId == "2000000100000003" })
        #expect(refunded.refundedAt == Timestamp.milliseconds("2026-02-10T12:00:00Z"))
        #expect(refunded.price == "9.99")
        let play = try #require(transactions.first { $0.store == "play_store" })
        #expect(play.intro && play.sandbox)
        #expect(play.gracePeriodEnd == Timestamp.milliseconds("2026-04-04T00:00:00Z"))
        #expect(play.billingIssueAt == Timestamp.milliseconds("2026-04-01T00:05:00Z"))
        // Version 3: t/f booleans, {pro} entitlements, no end for a lifetime grant.
        let grant = try #require(transactions.first { $0.store == "promotional" })
        #expect(!grant.autoRenewable && grant.end == nil && grant.entitlements == ["pro"])
        let cancelled = try #require(transactions.first { $0.transactionId == "2000000200000001" })
        #expect(cancelled.autoRenewable && cancelled.unsubscribedAt == Timestamp.milliseconds("2025-06-15T09:00:00Z"))
    }

    @Test func aFileThatIsNotTheExportIsRefusedWithTheMissingColumn() throws {
        #expect(throws: CommandFailure.self) { try RevenueCatHistoryCommands.parseExport(["purchase_token,product_id\nabc,pro\n"]) }
        do {
            _ = try RevenueCatHistoryCommands.parseExport(["purchase_token,product_id\nabc,pro\n"])
        } catch {
            #expect(error.description.contains("rc_original_app_user_id"), "\(error)")
        }
        // A quoted cell may hold commas, quotes and a line break.
        let rows = try RevenueCatHistoryCommands.parseExport([
            Self.header + "\n" + Self.row(alias: "user, \"quoted\"\nname", product: "p", start: -1, end: 1, store: "app_store", transaction: "1", original: "1", price: "1", renewal: 1)
                .replacingOccurrences(of: "user, \"quoted\"\nname", with: "\"user, \"\"quoted\"\"\nname\""),
        ])
        #expect(rows.first?.lastSeenAlias == "user, \"quoted\"\nname")
    }
}

/// A Play subscription imported from RevenueCat's export is keyed by its first order id (the export has no
/// purchase token); Play's first notification for its token after the cut-over takes it over: the token's
/// subscription belongs to the imported customer, its renewal already imported is not counted again, and
/// the imported one gives access no longer on its own.
@Suite(.serialized) struct RevenueCatPlayTakeoverTests {
    @Test func playsFirstNotificationOfTheTokenTakesTheImportedSubscriptionOver() async throws {
        var purchase = GooglePurchaseTests.subscription(acknowledged: true, order: "GPA.5555-6666-7777-88888..0")
        if case .object(var members) = purchase {
            members["latestOrderId"] = "GPA.5555-6666-7777-88888..0"
            purchase = .object(members)
        }
        let harness = try await GooglePurchaseTests.start(subscriptions: ["token-rc": purchase], acknowledge: false)
        let export = [
            RevenueCatImportTests.header,
            RevenueCatImportTests.row(user: "user-rcg", alias: "user-rcg", product: "pro_monthly", start: -50, end: -20, store: "play_store",
                transaction: "GPA.5555-6666-7777-88888", original: "GPA.5555-6666-7777-88888", price: "4.99", renewal: 1),
            RevenueCatImportTests.row(user: "user-rcg", alias: "user-rcg", product: "pro_monthly", start: -20, end: 10, store: "play_store",
                transaction: "GPA.5555-6666-7777-88888..0", original: "GPA.5555-6666-7777-88888", price: "4.99", renewal: 2),
        ].joined(separator: "\n")
        let commands = try RevenueCatHistoryCommands(
            configuration: harness.relay.configuration, appKey: "demo", producer: try harness.relay.environment.process.log.producer,
            backendURL: harness.backendURL, logger: Logger(label: "test"))
        let summary = try await commands.importTransactions(try RevenueCatHistoryCommands.parseExport([export]), deliver: false)
        #expect(summary.appended == 2)
        try await waitUntil("the import applied") { try await harness.state("GPA.5555-6666-7777-88888")?.lastTransactionId == "GPA.5555-6666-7777-88888..0" }

        // Play's renewal notification of the token (the renewal RevenueCat already exported).
        let claims = GooglePushSigner.claims(issuedAt: Int64(Date().timeIntervalSince1970), overrides: ["aud": "https://relay.test/google"])
        var notification = GooglePushSigner.developerNotification(code: 2)
        if case .object(var members) = notification, case .object(var sub) = members["subscriptionNotification"] {
            sub["purchaseToken"] = "token-rc"
            members["subscriptionNotification"] = .object(sub)
            notification = .object(members)
        }
        let response = try await harness.relay.http.send(
            "POST", harness.relay.baseURL + "/v1/notifications/google/demo",
            headers: [("Content-Type", "application/json"), ("Authorization", "Bearer \(GooglePushSigner().token(claims))")],
            body: GooglePushSigner.envelope(notification, messageId: "m-rc"))
        #expect(response.status == 200)
        try await waitUntil("the takeover") { try await harness.state("GPA.5555-6666-7777-88888")?.replacedBy == "token-rc" }
        #expect(try await harness.state("token-rc")?.originalAppUserId == "user-rcg")
        #expect(try await harness.entitlements("user-rcg") == ["pro"])
        let renewals = try await harness.events("renewal").filter { $0["data"]?["transactionId"] == "GPA.5555-6666-7777-88888..0" }
        #expect(Set(renewals.compactMap { $0["data"]?["id"]?.stringValue }).count == 1, "the imported renewal is not counted again: \(renewals)")
        try await harness.stop()
    }

    @Test func aTokenSeenDuringTheDualRunGetsTheExportsHistoryOnce() async throws {
        var purchase = GooglePurchaseTests.subscription(user: "user-dual", acknowledged: true, order: "GPA.9999-0000-1111-22222..0")
        if case .object(var members) = purchase {
            members["latestOrderId"] = "GPA.9999-0000-1111-22222..0"
            purchase = .object(members)
        }
        let harness = try await GooglePurchaseTests.start(subscriptions: ["token-dual": purchase], acknowledge: false)
        // The dual-run: Play's renewal notification reaches the relay before the import.
        let claims = GooglePushSigner.claims(issuedAt: Int64(Date().timeIntervalSince1970), overrides: ["aud": "https://relay.test/google"])
        var notification = GooglePushSigner.developerNotification(code: 2)
        if case .object(var members) = notification, case .object(var sub) = members["subscriptionNotification"] {
            sub["purchaseToken"] = "token-dual"
            members["subscriptionNotification"] = .object(sub)
            notification = .object(members)
        }
        #expect(try await harness.relay.http.send(
            "POST", harness.relay.baseURL + "/v1/notifications/google/demo",
            headers: [("Content-Type", "application/json"), ("Authorization", "Bearer \(GooglePushSigner().token(claims))")],
            body: GooglePushSigner.envelope(notification, messageId: "m-dual")
        ).status == 200)
        try await waitUntil("the live renewal") { try await harness.events("renewal").count == 1 }
        // The export has the purchase and that same renewal, keyed by the first order id.
        let export = [
            RevenueCatImportTests.header,
            RevenueCatImportTests.row(user: "user-dual", alias: "user-dual", product: "pro_monthly", start: -50, end: -20, store: "play_store",
                transaction: "GPA.9999-0000-1111-22222", original: "GPA.9999-0000-1111-22222", price: "4.99", renewal: 1),
            RevenueCatImportTests.row(user: "user-dual", alias: "user-dual", product: "pro_monthly", start: -20, end: 10, store: "play_store",
                transaction: "GPA.9999-0000-1111-22222..0", original: "GPA.9999-0000-1111-22222", price: "4.99", renewal: 2),
        ].joined(separator: "\n")
        let commands = try RevenueCatHistoryCommands(
            configuration: harness.relay.configuration, appKey: "demo", producer: try harness.relay.environment.process.log.producer,
            backendURL: harness.backendURL, logger: Logger(label: "test"))
        let summary = try await commands.importTransactions(try RevenueCatHistoryCommands.parseExport([export]), deliver: false)
        // The renewal the relay recorded live is skipped; the purchase goes to the token's subscription.
        #expect(summary.appended == 1, "\(summary)")
        #expect(summary.alreadyRecorded == 1, "\(summary)")
        try await waitUntil("the purchase imported") { try await harness.events("initial_purchase").count == 1 }
        #expect(try await harness.events("initial_purchase").first?["data"]?["originalTransactionId"] == "token-dual")
        #expect(try await harness.state("GPA.9999-0000-1111-22222") == nil, "no second subscription keyed by the order id")
        #expect(Set(try await harness.events("renewal").compactMap { $0["data"]?["id"]?.stringValue }).count == 1)
        try await harness.stop()
    }
}
