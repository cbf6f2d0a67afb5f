import Foundation
import Logging
import RelayApp
import RelayConfig
import RelayCore
import RelayHistory
import RelayTestSupport
import Testing

/// `import google` on a whole relay (embedded log) against the fake Play Developer API of
/// `GooglePurchaseTests`: the file's purchases become states and historical events (not delivered), bound
/// to the named users; a token Google does not know is counted; a rerun imports nothing twice.
@Suite(.serialized) struct GoogleImportTests {
    @Test func theFilesPurchasesAreImportedAsHistoryOnce() throws {
        // The file's forms: bare lines, and CSV with a header in RevenueCat's column names, in any order.
        #expect(try GoogleHistoryCommands.parseImportFile("tok-1,pro_monthly,user-1\n# comment\n\ntok-2,coins_100\n") == [
            .init(purchaseToken: "tok-1", productId: "pro_monthly", appUserId: "user-1"), .init(purchaseToken: "tok-2", productId: "coins_100"),
        ])
        #expect(try GoogleHistoryCommands.parseImportFile("app_user_id,product_id,purchase_token\nuser-9,pro_monthly,tok-9\n,coins_100,tok-10\n") == [
            .init(purchaseToken: "tok-9", productId: "pro_monthly", appUserId: "user-9"), .init(purchaseToken: "tok-10", productId: "coins_100"),
        ])
        #expect(throws: CommandFailure.self) { try GoogleHistoryCommands.parseImportFile("only-a-token\n") }
        #expect(throws: CommandFailure.self) { try GoogleHistoryCommands.parseImportFile("purchase_token,user\nx,y\n") }
    }

    @Test func importedPurchasesAreStatesAndHistoricalEventsBoundToTheirUsers() async throws {
        let harness = try await GooglePurchaseTests.start(
            subscriptions: ["tok-sub": GooglePurchaseTests.subscription(order: "GPA.I1")], products: ["tok-coin": GooglePurchaseTests.product(order: "GPA.I2")],
            acknowledge: false)
        let commands = try GoogleHistoryCommands(
            configuration: harness.relay.configuration, appKey: "demo", producer: try harness.relay.environment.process.log.producer,
            backendURL: harness.backendURL, logger: Logger(label: "test"))
        let purchases = try GoogleHistoryCommands.parseImportFile("tok-sub,pro_monthly,user-i1\ntok-coin,coins_100\ntok-gone,pro_monthly,user-x\n")
        let lines = LockedBox<[String]>([])
        let summary = try await commands.importPurchases(purchases, deliver: false) { line in lines.withLock { $0.append(line) } }
        #expect(summary == GoogleHistoryCommands.ImportSummary(purchases: 3, alreadyKnown: 0, imported: 2, unknown: 1))
        #expect(lines.value.last?.hasPrefix("3/3 purchases") == true, "\(lines.value)")
        try await waitUntil("both applied") {
            let subscription = try await harness.state("tok-sub")
            let coins = try await harness.state("tok-coin")
            return subscription != nil && coins != nil
        }
        #expect(try await harness.state("tok-sub")?.originalAppUserId == "user-i1")
        #expect(try await harness.state("tok-coin")?.originalAppUserId == nil)
        let response = try await harness.relay.http.send(
            "GET", harness.backendURL + "/subscriptions-api/public/v1/users/user-i1/entitlements", headers: [("Authorization", "Bearer \(GooglePurchaseTests.publicKey)")])
        #expect(try JSON.parse(response.body)["entitlements"]?.arrayValue?.compactMap { $0["identifier"]?.stringValue } == ["pro"])
        // Historical, not delivered: the events records say so, and no delivery record was written.
        let records = try await harness.relay.records(topic: harness.relay.configuration.topics.events)
        #expect(records.count >= 2)
        #expect(records.allSatisfy { $0.headers.first(named: RelayHeaderName.historical)?.stringValue == "true" }, "\(records.map(\.headers))")
        #expect(try await harness.relay.records(topic: harness.relay.configuration.topics.deliveries).isEmpty)
        #expect(try await harness.events("initial_purchase").first?["data"]?["source"]?["notificationId"] == "import:tok-sub")
        // Again: nothing is imported twice.
        let again = try await commands.importPurchases(purchases, deliver: false)
        #expect(again == GoogleHistoryCommands.ImportSummary(purchases: 3, alreadyKnown: 2, imported: 0, unknown: 1))
        try await harness.stop()
    }
}
