import Foundation
import RelayApp
import RelayHistory
import RelayAppStoreAPI
import RelayConfig
import RelayCore
import RelayHTTPClient
import RelayTestSupport
import Testing

/// What the fake App Store Server API answers: transaction history pages by transaction id, the
/// notification history in pages, subscription statuses by original transaction id, and how many
/// 429s (with `Retry-After: 1`) come before any answer.
final class AppleServerModel: Sendable {
    let history = LockedBox<[String: [[String]]]>([:])
    let notifications = LockedBox<[[String]]>([])
    let statuses = LockedBox<[String: LastTransaction]>([:])
    /// Answers given once each, in order, before `statuses` (Apple signs every answer anew).
    let statusAnswers = LockedBox<[String: [LastTransaction]]>([:])
    let rateLimited = LockedBox(0)
    /// The notification history requests' bodies, in order.
    let historyRequests = LockedBox<[JSON]>([])

    func answer(_ request: TestHTTPRequest) -> TestHTTPResponse {
        if rateLimited.withLock({ count -> Bool in
            defer { count = max(0, count - 1) }
            return count > 0
        }) {
            return FakeAppStore.appleError(429, 4_290_000, "Rate limit exceeded.", headers: [("Retry-After", "1")])
        }
        let (path, query) = FakeAppStore.target(request)
        let parameter = { (name: String) in query.first { $0.0 == name }?.1 }
        let segments = path.split(separator: "/").map(String.init)
        if request.method == "GET", segments.count == 4, segments[0...2] == ["inApps", "v2", "history"] {
            guard let pages = history.value[segments[3]] else { return FakeAppStore.appleError(404, 4_040_010, "Transaction id not found.") }
            let index = parameter("revision").flatMap(Int.init) ?? 0
            guard index < pages.count else { return FakeAppStore.appleError(400, 4_000_005, "Invalid revision.") }
            return FakeAppStore.json([
                "revision": .string(String(index + 1)), "hasMore": .bool(index + 1 < pages.count), "bundleId": .string(FakeAppStore.bundleId),
                "environment": "Sandbox", "signedTransactions": .array(pages[index].map(JSON.string)),
            ])
        }
        if request.method == "POST", path == "/inApps/v1/notifications/history" {
            if let body = try? JSON.parse(request.body) { historyRequests.withLock { $0.append(body) } }
            let pages = notifications.value
            let index = parameter("paginationToken").flatMap(Int.init) ?? 0
            guard index < max(pages.count, 1) else { return FakeAppStore.appleError(400, 4_000_009, "Invalid pagination token.") }
            let items = index < pages.count ? pages[index] : []
            var page: [String: JSON] = [
                "hasMore": .bool(index + 1 < pages.count),
                "notificationHistory": .array(items.map { ["signedPayload": .string($0), "sendAttempts": []] }),
            ]
            if index + 1 < pages.count { page["paginationToken"] = .string(String(index + 1)) }
            return FakeAppStore.json(.object(page))
        }
        if request.method == "GET", segments.count == 4, segments[0...2] == ["inApps", "v1", "subscriptions"] {
            let next = statusAnswers.withLock { answers -> LastTransaction? in
                guard var queue = answers[segments[3]], !queue.isEmpty else { return nil }
                defer { answers[segments[3]] = queue }
                return queue.removeFirst()
            }
            guard let last = next ?? statuses.value[segments[3]] else { return FakeAppStore.appleError(404, 4_040_010, "Transaction id not found.") }
            var item: [String: JSON] = [
                "originalTransactionId": .string(last.originalTransactionId), "status": .integer(Int64(last.status)),
                "signedTransactionInfo": .string(last.signedTransactionInfo),
            ]
            if let renewal = last.signedRenewalInfo { item["signedRenewalInfo"] = .string(renewal) }
            return FakeAppStore.json([
                "environment": "Sandbox", "bundleId": .string(FakeAppStore.bundleId), "appAppleId": 1234,
                "data": [["subscriptionGroupIdentifier": "21000000", "lastTransactions": [.object(item)]]],
            ])
        }
        return FakeAppStore.appleError(404, 4_040_000, "Not found: \(request.method) \(path)")
    }
}

/// `import apple`, `recover apple` and `reconcile apple` against a whole relay (embedded log, local
/// backend) and the fake App Store Server API on loopback, with the test Apple chain.
@Suite(.serialized) struct AppleHistoryCommandTests {
    static let day: Int64 = 86_400_000
    let signer = AppleSigner()

    /// A relay whose app `demo` takes Sandbox data signed by the test root and calls `fake` for the API.
    static func configuration(fake: FakeAppStore) throws -> RelayConfiguration {
        // The YAML is kept beside the database (relay.yaml) for the command-line test.
        try AppleRelayConfiguration.parse(configurationText(fake: fake), name: "apple-commands")
    }

    static func configurationText(fake: FakeAppStore, serverApi: Bool = true) -> String {
        AppleRelayConfiguration.text(
            apple: serverApi ? [AppleRelayConfiguration.serverApi(fake)] : [],
            sections: """
                endpoints:
                  - { id: hooks, app: demo, url: "http://127.0.0.1:9/hooks", secrets: ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"], events: ["*"] }

                """)
    }

    /// The fake (on the system clock, as the commands' client is), a relay and the commands over both.
    static func start() async throws -> (AppleServerModel, FakeAppStore, TestRelay, AppleHistoryCommands, backendURL: String) {
        let model = AppleServerModel()
        let fake = try await FakeAppStore(systemClock: true) { request, _ in model.answer(request) }
        let relay = try await TestRelay(configuration: try configuration(fake: fake), log: .embedded)
        let backendURL = await relay.environment.process.backendAddress.value()
        let commands = try AppleHistoryCommands(
            configuration: relay.configuration, appKey: "demo", producer: try relay.environment.process.log.producer, backendURL: backendURL,
            http: FakeAppStore.http, retry: FakeAppStore.fastRetries, logger: testLogger("apple-commands"))
        return (model, fake, relay, commands, backendURL)
    }

    static func backend(_ relay: TestRelay, _ backendURL: String, _ path: String) async throws -> JSON {
        let response = try await relay.http.send("GET", backendURL + path, headers: [("Authorization", "Bearer test-backend-key")])
        #expect(response.status == 200, "\(path): \(String(decoding: response.body, as: UTF8.self))")
        return try JSON.parse(response.body)
    }

    static func events(_ relay: TestRelay, _ backendURL: String, _ query: String) async throws -> [JSON] {
        try await backend(relay, backendURL, "/subscriptions-api/internal/v1/events?environment=ALL&limit=1000&\(query)")["events"]?.arrayValue ?? []
    }

    static func state(_ relay: TestRelay, _ backendURL: String, _ id: String) async throws -> JSON {
        try await backend(relay, backendURL, "/subscriptions-api/internal/v1/subscriptions/apple/\(id)")
    }

    static func revenue(_ relay: TestRelay, _ backendURL: String, _ id: String) async throws -> JSON {
        try await backend(relay, backendURL, "/subscriptions-api/internal/v1/revenue?environment=ALL&originalTransactionId=\(id)")["total"] ?? .null
    }

    static func renewal(_ id: String, signedDate: Int64) -> JSON {
        [
            "originalTransactionId": .string(id), "autoRenewProductId": "com.example.pro.monthly", "productId": "com.example.pro.monthly",
            "autoRenewStatus": 1, "environment": "Sandbox", "signedDate": .integer(signedDate),
        ]
    }

    /// Posts a notification to the relay as Apple would, and waits until its events are recorded.
    func live(
        _ relay: TestRelay, _ backendURL: String, _ type: String, _ subtype: String?, uuid: String, transaction: JSON, at time: Int64,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws {
        let original = transaction["originalTransactionId"]?.stringValue ?? ""
        guard case .object(var payload) = signer.notificationPayload(
            type: type, subtype: subtype, signedDate: time, transaction: transaction, renewalInfo: Self.renewal(original, signedDate: time))
        else { return }
        payload["notificationUUID"] = .string(uuid)
        let response = try await relay.post("/v1/notifications/apple/demo", body: String(decoding: signer.body(.object(payload)), as: UTF8.self))
        #expect(response.status == 200, sourceLocation: sourceLocation)
        try await waitUntil("\(type) \(uuid) recorded") { !(try await Self.events(relay, backendURL, "notificationId=\(uuid)").isEmpty) }
    }

    // MARK: import

    @Test func importAppendsBothSubscriptionsHistoriesAsHistoricalUndeliveredEventsAndARerunAddsNothing() async throws {
        let (model, fake, relay, commands, backendURL) = try await Self.start()
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let start = now - 70 * Self.day
        func signed(_ id: String, _ original: String, _ month: Int64) -> String {
            let purchase = start + month * 30 * Self.day
            return signer.sign(
                FakeAppStore.transaction(
                    transactionId: id, originalTransactionId: original, purchaseDate: purchase, expiresDate: purchase + 30 * Self.day,
                    signedDate: now))  // Apple signs history when it answers
        }
        // Customer A: three transactions over two pages (Apple orders by modification: the newest first here).
        model.history.withLock {
            $0["1000"] = [[signed("1002", "1000", 2), signed("1000", "1000", 0)], [signed("1001", "1000", 1)]]
            // Customer B: a subscription and a one-time purchase, over two pages.
            let lifetime = signer.sign(
                FakeAppStore.transaction(
                    transactionId: "2100", originalTransactionId: "2100", productId: "com.example.lifetime", type: "Non-Consumable",
                    purchaseDate: start + 5 * Self.day, signedDate: start + 5 * Self.day + 1000))
            $0["2000"] = [[signed("2000", "2000", 1)], [lifetime, signed("2001", "2000", 2)]]
        }
        // Apple's rate limit on the first call: waited for (Retry-After: 1), then answered.
        model.rateLimited.withLock { $0 = 1 }

        let began = ContinuousClock.now
        let summary = try await commands.importHistory(originalTransactionIds: ["1000", "2000"], deliver: false)
        #expect(ContinuousClock.now - began >= .seconds(1), "Retry-After was not waited for")
        #expect(summary.failures.isEmpty, "\(summary.failures)")
        #expect(summary.subscriptions == 3)
        #expect(summary.transactions == 6)
        #expect(summary.recordsAppended == 6)
        #expect(summary.alreadyImported == 0)
        #expect(fake.refusals.value.isEmpty, "\(fake.refusals.value)")
        #expect(fake.requests.count == 5, "one 429 and four pages")

        let uuids = ["1000", "1001", "1002", "2000", "2001", "2100"].map { "import:\($0)" }
        try await waitUntil("every import record's events recorded") {
            for uuid in uuids where try await Self.events(relay, backendURL, "notificationId=\(uuid)").isEmpty { return false }
            return true
        }
        let historical = try await Self.events(relay, backendURL, "historical=true")
        #expect(try await Self.events(relay, backendURL, "historical=false").isEmpty, "every imported event is historical")
        let types = Dictionary(grouping: historical, by: { $0["data"]?["source"]?["notificationId"]?.stringValue ?? "" })
            .mapValues { $0.compactMap { $0["type"]?.stringValue } }
        #expect(types["import:1000"]?.contains("initial_purchase") == true, "\(types)")
        #expect(types["import:1001"]?.contains("renewal") == true, "\(types)")
        #expect(types["import:1002"]?.contains("renewal") == true, "\(types)")
        #expect(types["import:2100"]?.contains("non_renewing_purchase") == true, "\(types)")
        // Each imported event happened when the customer paid, not when Apple signed the history today.
        let renewal = historical.first { $0["data"]?["source"]?["notificationId"] == "import:1001" && $0["type"] == "renewal" }
        #expect(renewal?["data"]?["ts"]?.int64Value == start + 30 * Self.day)
        let first = historical.first { $0["data"]?["source"]?["notificationId"] == "import:1000" && $0["type"] == "initial_purchase" }
        #expect(first?["data"]?["ts"]?.int64Value == start)

        let a = try await Self.state(relay, backendURL, "1000")
        #expect(a["status"] == "ACTIVE")
        #expect(a["lastTransactionId"] == "1002")
        #expect(a["expiresAt"]?.int64Value == start + 90 * Self.day)
        let b = try await Self.state(relay, backendURL, "2000")
        #expect(b["lastTransactionId"] == "2001")

        // Recorded, not delivered: the events records carry relay-historical, relay.deliveries has nothing.
        let eventRecords = try await relay.records(topic: relay.configuration.topics.events, atLeast: 1)
        #expect(!eventRecords.isEmpty)
        #expect(eventRecords.allSatisfy { $0.headers.first(named: RelayHeaderName.historical)?.stringValue == "true" })
        #expect(try await relay.records(topic: relay.configuration.topics.deliveries).isEmpty)

        // Run again: every record's events are recorded, so nothing is appended and nothing changes.
        let again = try await commands.importHistory(originalTransactionIds: ["1000", "2000"], deliver: false)
        #expect(again.recordsAppended == 0)
        #expect(again.alreadyImported == 6)
        #expect(again.transactions == 6)
        try await Task.sleep(for: .milliseconds(500))
        #expect(try await Self.events(relay, backendURL, "historical=true").count == historical.count)

        try await relay.stop()
        await fake.stop()
    }

    @Test func importLeavesOutWhatTheLivePipelineAlreadyRecorded() async throws {
        let (model, fake, relay, commands, backendURL) = try await Self.start()
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let start = now - 65 * Self.day
        func transaction(_ id: String, _ month: Int64, revoked: Int64? = nil, signedDate: Int64? = nil) -> JSON {
            let purchase = start + month * 30 * Self.day
            return FakeAppStore.transaction(
                transactionId: id, originalTransactionId: "4000", purchaseDate: purchase, expiresDate: purchase + 30 * Self.day,
                signedDate: signedDate ?? purchase + 1000, revocationDate: revoked, revocationReason: revoked == nil ? nil : 1)
        }
        let refunded = start + 35 * Self.day
        // Live: the purchase, its first renewal and that renewal's refund reached the relay; the second renewal did not.
        try await live(relay, backendURL, "SUBSCRIBED", "INITIAL_BUY", uuid: "0b7e4f6a-0000-4000-8000-000000000001", transaction: transaction("4000", 0), at: start + 1000)
        try await live(
            relay, backendURL, "DID_RENEW", nil, uuid: "0b7e4f6a-0000-4000-8000-000000000002", transaction: transaction("4001", 1),
            at: start + 30 * Self.day + 1000)
        try await live(
            relay, backendURL, "REFUND", nil, uuid: "0b7e4f6a-0000-4000-8000-000000000003",
            transaction: transaction("4001", 1, revoked: refunded, signedDate: refunded + 1000), at: refunded + 1000)
        let before = try await Self.revenue(relay, backendURL, "4000")
        #expect(before["purchases"]?.int64Value == 2, "\(before)")
        #expect(before["refundCount"]?.int64Value == 1, "\(before)")

        model.history.withLock {
            $0["4000"] = [[
                signer.sign(transaction("4002", 2, signedDate: now)), signer.sign(transaction("4001", 1, revoked: refunded, signedDate: now)),
                signer.sign(transaction("4000", 0, signedDate: now)),
            ]]
        }
        let summary = try await commands.importHistory(originalTransactionIds: ["4000"], deliver: false)
        #expect(summary.failures.isEmpty, "\(summary.failures)")
        #expect(summary.transactions == 3)
        // SUBSCRIBED 4000, DID_RENEW 4001 and REFUND 4001 are recorded live; only DID_RENEW 4002 is appended.
        #expect(summary.alreadyRecordedLive == 3)
        #expect(summary.alreadyImported == 0)
        #expect(summary.recordsAppended == 1)
        try await waitUntil("the missed renewal imported") {
            try await Self.events(relay, backendURL, "notificationId=import:4002").contains { $0["type"] == "renewal" }
        }
        for uuid in ["import:4000", "import:4001", "import:4001:revoked"] {
            #expect(try await Self.events(relay, backendURL, "notificationId=\(uuid)").isEmpty, "\(uuid) was appended")
        }
        let imported = try await relay.records(topic: relay.configuration.topics.notifications).filter {
            $0.headers.first(named: RelayHeaderName.source)?.stringValue == "apple-api"
        }
        #expect(imported.count == 1)
        // Revenue: the live purchase, renewal and refund once each, and the missed renewal.
        let after = try await Self.revenue(relay, backendURL, "4000")
        #expect(after["purchases"]?.int64Value == 3, "\(after)")
        #expect(after["refundCount"]?.int64Value == 1, "\(after)")

        // Run again: the imported one is already imported, the rest still recorded live.
        let again = try await commands.importHistory(originalTransactionIds: ["4000"], deliver: false)
        #expect(again.recordsAppended == 0)
        #expect(again.alreadyImported == 1)
        #expect(again.alreadyRecordedLive == 3)

        try await relay.stop()
        await fake.stop()
    }

    @Test func anUnknownTransactionIdIsAFailureInTheSummaryAndTheRestIsImported() async throws {
        let (model, fake, relay, commands, _) = try await Self.start()
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        model.history.withLock {
            $0["3000"] = [[
                signer.sign(
                    FakeAppStore.transaction(
                        transactionId: "3000", originalTransactionId: "3000", purchaseDate: now - Self.day, expiresDate: now + 29 * Self.day,
                        signedDate: now - Self.day))
            ]]
        }
        let summary = try await commands.importHistory(originalTransactionIds: ["9999", "3000"], deliver: true)
        #expect(summary.recordsAppended == 1)
        #expect(summary.failures.map(\.id) == ["9999"])
        #expect(summary.failures.first?.reason.contains("does not know") == true, "\(summary.failures)")
        // --deliver: the historical events go to the endpoints too.
        try await waitUntil("the import delivered") {
            try await relay.records(topic: relay.configuration.topics.deliveries).contains {
                $0.headers.first(named: RelayHeaderName.eventId)?.stringValue == "apple:import:3000:initial_purchase"
            }
        }
        try await relay.stop()
        await fake.stop()
    }

    @Test func theIngestNeverWritesTheRelaysOwnHeaders() async throws {
        let (_, fake, relay, _, _) = try await Self.start()
        let body = String(decoding: signer.body(signer.notificationPayload()), as: UTF8.self)
        let response = try await relay.post(
            "/v1/notifications/apple/demo", body: body,
            headers: [("relay-source", "apple-api"), ("relay-historical", "true"), ("relay-deliver", "false")])
        #expect(response.status == 200)
        let (consumer, collector) = try relay.notificationsReader()
        let records = try await collector.waitFor(count: 1)
        collector.cancel()
        await consumer.close()
        let names = Set(records[0].headers.map(\.name))
        #expect(!names.contains(RelayHeaderName.source))
        #expect(!names.contains(RelayHeaderName.historical))
        #expect(!names.contains(RelayHeaderName.deliver))
        try await relay.stop()
        await fake.stop()
    }

    @Test func theCommandLineImportsAndSaysWhatIsWrong() async throws {
        let executable = try #require(CommandLineTests.executable)
        let (model, fake, relay, _, backendURL) = try await Self.start()
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        model.history.withLock {
            $0["3100"] = [[
                signer.sign(
                    FakeAppStore.transaction(
                        transactionId: "3100", originalTransactionId: "3100", purchaseDate: now - Self.day, expiresDate: now + 29 * Self.day,
                        signedDate: now - Self.day))
            ]]
        }
        let directory = URL(fileURLWithPath: relay.configuration.backend.database).deletingLastPathComponent()
        let config = directory.appendingPathComponent("relay.yaml").path
        let common = ["--config", config, "--data", relay.dataDirectory ?? "", "--app", "demo", "--backend-url", backendURL]

        let imported = try await runChildProcess(executable, ["import", "apple"] + common + ["--original-transaction-id", "3100"])
        #expect(imported.status == 0, "\(imported.stderr)")
        #expect(imported.stdoutText.contains("records appended: 1 (historical, not delivered)"), "\(imported.stdoutText)")
        #expect(imported.stderr.contains("3100"), "progress on stderr: \(imported.stderr)")
        try await waitUntil("the imported events recorded") { !(try await Self.events(relay, backendURL, "notificationId=import:3100").isEmpty) }

        let noIds = try await runChildProcess(executable, ["import", "apple"] + common)
        #expect(noIds.status == 64)
        #expect(noIds.stderr.contains("--original-transaction-id"), "\(noIds.stderr)")

        let tooOld = try await runChildProcess(executable, ["recover", "apple"] + common + ["--since", "2020-01-01"])
        #expect(tooOld.status == 64)
        #expect(tooOld.stderr.contains("30 days of notification history Apple keeps (sandbox)"), "\(tooOld.stderr)")

        let withoutKey = directory.appendingPathComponent("no-key.yaml").path
        try Data(Self.configurationText(fake: fake, serverApi: false).utf8).write(to: URL(fileURLWithPath: withoutKey))
        let unconfigured = try await runChildProcess(
            executable, ["reconcile", "apple", "--config", withoutKey, "--data", relay.dataDirectory ?? "", "--app", "demo"])
        #expect(unconfigured.status == 78)
        #expect(unconfigured.stderr.contains("apps[0].apple.serverApi"), "\(unconfigured.stderr)")
        expectNoKeyMaterial(imported.stdoutText + imported.stderr + unconfigured.stderr)

        try await relay.stop()
        await fake.stop()
    }

    func expectNoKeyMaterial(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(!text.contains("eyJ"), "a JWT in: \(text)", sourceLocation: sourceLocation)
        #expect(!text.contains("PRIVATE KEY"), sourceLocation: sourceLocation)
    }

    // MARK: recover

    @Test func recoverReingestsOnlyTheNotificationsWithoutEvents() async throws {
        let (model, fake, relay, commands, backendURL) = try await Self.start()
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        func payload(_ uuid: String, _ original: String, type: String = "SUBSCRIBED", subtype: String? = "INITIAL_BUY") -> JSON {
            let transaction = FakeAppStore.transaction(
                transactionId: original, originalTransactionId: original, purchaseDate: now - Self.day, expiresDate: now + 29 * Self.day,
                signedDate: now - Self.day)
            guard case .object(var object) = signer.notificationPayload(type: type, subtype: subtype, signedDate: now - Self.day, transaction: transaction)
            else { return .null }
            object["notificationUUID"] = .string(uuid)
            return .object(object)
        }
        let uuids = ["6f1c7a1e-0000-4000-8000-000000000001", "6f1c7a1e-0000-4000-8000-000000000002", "6f1c7a1e-0000-4000-8000-000000000003"]
        let payloads = zip(uuids, ["7001", "7002", "7003"]).map { payload($0, $1) }
        // A refund request and a test notification: they yield no events, so they always look unprocessed.
        let consumption = payload("6f1c7a1e-0000-4000-8000-000000000004", "7004", type: "CONSUMPTION_REQUEST", subtype: nil)
        let test = payload("6f1c7a1e-0000-4000-8000-000000000005", "7005", type: "TEST", subtype: nil)
        // The first reached the relay; the other two did not.
        let first = try await relay.post("/v1/notifications/apple/demo", body: String(decoding: signer.body(payloads[0]), as: UTF8.self))
        #expect(first.status == 200)
        try await waitUntil("the first notification's events recorded") {
            !(try await Self.events(relay, backendURL, "notificationId=\(uuids[0])").isEmpty)
        }
        model.notifications.withLock {
            $0 = [[signer.sign(payloads[0]), signer.sign(consumption), signer.sign(payloads[1])], [signer.sign(test), signer.sign(payloads[2])]]
        }

        let summary = try await commands.recover(since: now - Self.day, until: nil)
        #expect(summary.found == 5)
        #expect(summary.alreadyProcessed == 1)
        #expect(summary.reingested == 2)
        #expect(summary.skipped == 2)
        #expect(model.historyRequests.value.first?["startDate"]?.int64Value == now - Self.day)

        for uuid in uuids.dropFirst() {
            try await waitUntil("\(uuid)'s events recorded") { !(try await Self.events(relay, backendURL, "notificationId=\(uuid)").isEmpty) }
        }
        let states = try await [Self.state(relay, backendURL, "7002"), Self.state(relay, backendURL, "7003")]
        #expect(states.allSatisfy { $0["status"] == "ACTIVE" })
        // The re-ingested records are the ingest's: no relay-source, not historical.
        #expect(try await Self.events(relay, backendURL, "historical=true").isEmpty)
        // The CONSUMPTION_REQUEST and the TEST were not appended: the posted one and the two re-ingested only.
        #expect(try await relay.records(topic: relay.configuration.topics.notifications).count == 3)

        // Older than the sandbox's 30 days of history (production keeps 180): refused before any call.
        let calls = fake.requests.count
        do {
            _ = try await commands.recover(since: now - 31 * Self.day, until: nil)
            Issue.record("a --since older than the sandbox's 30 days was accepted")
        } catch {
            #expect(error.kind == .badArguments)
            #expect(error.message.contains("30 days"), "\(error.message)")
        }
        #expect(AppleHistoryCommands.notificationHistoryDays(.production) == 180)
        #expect(fake.requests.count == calls)

        try await relay.stop()
        await fake.stop()
    }

    // MARK: reconcile

    @Test func reconcileCorrectsARevokedSubscriptionAndLeavesAnUnchangedOne() async throws {
        let (model, fake, relay, commands, backendURL) = try await Self.start()
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let purchase = now - 2 * Self.day
        let expires = purchase + 30 * Self.day
        func transaction(_ id: String, ownership: String, signedDate: Int64, revocationDate: Int64? = nil) -> JSON {
            FakeAppStore.transaction(
                transactionId: id, originalTransactionId: id, purchaseDate: purchase, expiresDate: expires, signedDate: signedDate,
                ownership: ownership, revocationDate: revocationDate, revocationReason: revocationDate == nil ? nil : 0,
                price: ownership == "FAMILY_SHARED" ? 0 : 9990)
        }
        func renewal(_ id: String, signedDate: Int64) -> JSON {
            [
                "originalTransactionId": .string(id), "autoRenewProductId": "com.example.pro.monthly", "productId": "com.example.pro.monthly",
                "autoRenewStatus": 1, "environment": "Sandbox", "signedDate": .integer(signedDate),
            ]
        }
        // Both subscriptions reached the relay when bought.
        for (index, id) in ["8000", "8001"].enumerated() {
            guard case .object(var payload) = signer.notificationPayload(
                signedDate: purchase + 1000,
                transaction: transaction(id, ownership: index == 0 ? "FAMILY_SHARED" : "PURCHASED", signedDate: purchase + 1000),
                renewalInfo: renewal(id, signedDate: purchase + 1000))
            else { return }
            payload["notificationUUID"] = .string("9a0e6b1c-0000-4000-8000-00000000000\(index)")
            #expect(try await relay.post("/v1/notifications/apple/demo", body: String(decoding: signer.body(.object(payload)), as: UTF8.self)).status == 200)
        }
        try await waitUntil("both subscriptions stored") {
            for id in ["8000", "8001"] {
                let response = try await relay.http.send(
                    "GET", backendURL + "/subscriptions-api/internal/v1/subscriptions/apple/\(id)", headers: [("Authorization", "Bearer test-backend-key")])
                if response.status != 200 { return false }
            }
            return true
        }
        let unchangedBefore = try await Self.state(relay, backendURL, "8001")
        #expect(try await Self.state(relay, backendURL, "8000")["status"] == "ACTIVE")

        // The list route: both are active.
        let listed = try await Self.backend(relay, backendURL, "/subscriptions-api/internal/v1/subscriptions?store=apple&applicationId=1")
        #expect(listed["subscriptions"]?.arrayValue?.compactMap { $0["originalTransactionId"]?.stringValue }.sorted() == ["8000", "8001"])
        #expect(listed["nextCursor"] == .null)

        // Apple: the family member's access was revoked (the revocation notification never arrived); the other is as stored.
        let signedDate = now - 1000
        model.statuses.withLock {
            $0["8000"] = LastTransaction(
                originalTransactionId: "8000", status: 5,
                signedTransactionInfo: signer.sign(transaction("8000", ownership: "FAMILY_SHARED", signedDate: signedDate, revocationDate: now - 60_000)),
                signedRenewalInfo: signer.sign(renewal("8000", signedDate: signedDate)))
            $0["8001"] = LastTransaction(
                originalTransactionId: "8001", status: 1,
                signedTransactionInfo: signer.sign(transaction("8001", ownership: "PURCHASED", signedDate: signedDate)),
                signedRenewalInfo: signer.sign(renewal("8001", signedDate: signedDate)))
        }
        let summary = try await commands.reconcile(since: nil)
        #expect(summary.checked == 2)
        #expect(summary.inSync == 1)
        #expect(summary.failures.isEmpty, "\(summary.failures)")
        #expect(summary.corrections.map(\.originalTransactionId) == ["8000"])
        #expect(summary.corrections.first?.action == "REVOKE")
        #expect(summary.corrections.first?.line.hasPrefix("8000: ACTIVE (expires ") == true, "\(summary.corrections)")

        // Apple's last transaction and status: the same on every run, whenever Apple signed its answer.
        let uuid = "reconcile:8000:5"
        try await waitUntil("the correction applied") { try await Self.state(relay, backendURL, "8000")["status"] == "REVOKED" }
        let expiration = "apple:\(uuid):expiration"
        try await waitUntil("the expiration recorded") {
            try await Self.events(relay, backendURL, "notificationId=\(uuid)").contains { $0["data"]?["id"]?.stringValue == expiration }
        }
        #expect(try await Self.events(relay, backendURL, "historical=true").isEmpty, "missed events are not historical")
        let eventRecords = try await relay.records(topic: relay.configuration.topics.events)
        #expect(eventRecords.contains { $0.headers.first(named: RelayHeaderName.eventId)?.stringValue == expiration })
        let deliveries = try await relay.records(topic: relay.configuration.topics.deliveries)
        #expect(deliveries.contains { $0.headers.first(named: RelayHeaderName.eventId)?.stringValue == expiration }, "delivered")

        let unchangedAfter = try await Self.state(relay, backendURL, "8001")
        #expect(unchangedAfter["version"] == unchangedBefore["version"])
        #expect(unchangedAfter["status"] == "ACTIVE")

        // Run again: in sync now.
        let again = try await commands.reconcile(since: nil)
        #expect(again.corrections.isEmpty)

        try await relay.stop()
        await fake.stop()
    }

    @Test func reconcileAppendsAnExtensionWithoutMoneyOnceAndSkipsOneTimePurchases() async throws {
        let (model, fake, relay, commands, backendURL) = try await Self.start()
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let purchase = now - 2 * Self.day
        let expires = purchase + 30 * Self.day
        func transaction(expiresDate: Int64, signedDate: Int64) -> JSON {
            FakeAppStore.transaction(transactionId: "8100", originalTransactionId: "8100", purchaseDate: purchase, expiresDate: expiresDate, signedDate: signedDate)
        }
        try await live(
            relay, backendURL, "SUBSCRIBED", "INITIAL_BUY", uuid: "1c2d3e4f-0000-4000-8000-000000000001",
            transaction: transaction(expiresDate: expires, signedDate: purchase + 1000), at: purchase + 1000)
        // A lifetime purchase: ACTIVE forever, and Apple has no subscription status for it.
        try await live(
            relay, backendURL, "ONE_TIME_CHARGE", nil, uuid: "1c2d3e4f-0000-4000-8000-000000000002",
            transaction: FakeAppStore.transaction(
                transactionId: "8200", originalTransactionId: "8200", productId: "com.example.lifetime", type: "Non-Consumable",
                purchaseDate: purchase, signedDate: purchase + 1000),
            at: purchase + 1000)
        #expect(try await Self.state(relay, backendURL, "8200")["status"] == "ACTIVE")
        let listed = try await Self.backend(relay, backendURL, "/subscriptions-api/internal/v1/subscriptions?store=apple&applicationId=1&activeOrChangedSince=0")
        #expect(listed["subscriptions"]?.arrayValue?.compactMap { $0["originalTransactionId"]?.stringValue } == ["8100"], "\(listed)")

        // Apple extended the subscription by ten days (a RENEWAL_EXTENDED the relay missed): the same transaction, a later expiry.
        let extended = expires + 10 * Self.day
        func answer(signedDate: Int64) -> LastTransaction {
            LastTransaction(
                originalTransactionId: "8100", status: 1, signedTransactionInfo: signer.sign(transaction(expiresDate: extended, signedDate: signedDate)),
                signedRenewalInfo: signer.sign(Self.renewal("8100", signedDate: signedDate)))
        }
        // Two runs at once, so both find the state before the worker applied either; Apple signs each answer anew.
        model.statusAnswers.withLock { $0["8100"] = [answer(signedDate: now - 1000), answer(signedDate: now)] }
        model.statuses.withLock { $0["8100"] = answer(signedDate: now + 1000) }
        async let firstRun = commands.reconcile(since: nil)
        async let secondRun = commands.reconcile(since: nil)
        let (first, second) = try await (firstRun, secondRun)
        #expect(first.checked == 1)
        #expect(first.failures.isEmpty, "\(first.failures)")
        #expect(first.corrections.map(\.action) == ["RENEWAL_EXTENDED"])
        #expect(second.corrections.map(\.action) == ["RENEWAL_EXTENDED"])
        #expect(!fake.requests.contains { $0.path.contains("8200") }, "a one-time purchase was sent to Apple")

        let uuid = "reconcile:8100:1"
        try await waitUntil("the extension applied") { try await Self.state(relay, backendURL, "8100")["expiresAt"]?.int64Value == extended }
        try await relay.waitForRecordedEvents()
        let appended = try await relay.records(topic: relay.configuration.topics.notifications).filter {
            $0.headers.first(named: RelayHeaderName.source)?.stringValue == "apple-api"
        }
        #expect(appended.count == first.corrections.count + second.corrections.count)
        for record in appended {
            #expect((try JSON.parse(record.value))["notificationUUID"]?.stringValue == uuid)
        }
        let events = try await Self.events(relay, backendURL, "originalTransactionId=8100")
        let types = events.compactMap { $0["type"]?.stringValue }
        #expect(types.filter { $0 == "subscription_extended" }.count == 1, "\(types)")
        #expect(!types.contains("renewal"), "an extension moved money: \(types)")
        // No event of the correction moves money (price 0 or none).
        let correction = events.filter { $0["data"]?["source"]?["notificationId"]?.stringValue == uuid }
        #expect(correction.allSatisfy { ($0["data"]?["price"]?.doubleValue ?? 0) == 0 }, "\(correction.map { ($0["type"] ?? .null, $0["data"]?["price"] ?? .null) })")
        let revenue = try await Self.revenue(relay, backendURL, "8100")
        #expect(revenue["purchases"]?.int64Value == 1, "\(revenue)")
        // In sync now.
        #expect(try await commands.reconcile(since: nil).corrections.isEmpty)

        try await relay.stop()
        await fake.stop()
    }
}
