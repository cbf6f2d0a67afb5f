import Foundation
import CoreMetrics
import RelayApp
import RelayConfig
import RelayCore
import RelayLocalBackend
import RelayTestSupport
import Testing

/// The backend records what the worker produces on relay.events, once, and the command line reads it back.
@Suite struct EventsRecordingTests {
    /// A deliverer in another process writes its attempts to `relay.deliveries.attempts`, and the backend records
    /// them from there (a deliverer in the backend's own process records its attempts itself: `DeliveryFlowTests`).
    @Test(arguments: TestLog.allCases)
    func attemptsOnTheTopicFromADelivererElsewhereAreRecorded(log: TestLog) async throws {
        let relay = try await TestRelay(configuration: try TestRelay.configuration(), log: log)
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let attempt = DeliveryAttempt(
            app: "demo", endpoint: "hooks-elsewhere", eventId: "stripe:evt_elsewhere:renewal", eventType: "renewal", subject: "sub_elsewhere",
            attempt: 1, outcome: .succeeded, httpStatus: 200, durationMs: 12, error: nil, startedAt: now - 12, finishedAt: now)
        _ = try await relay.environment.process.log.producer.produce(attempt.record(topic: relay.configuration.topics.attempts))
        @Sendable func recorded() async throws -> [JSON] {
            try await relay.backend("/subscriptions-api/internal/v1/deliveries?endpoint=hooks-elsewhere").json["deliveries"]?.arrayValue ?? []
        }
        try await waitUntil("the attempt recorded from the topic") { try await recorded().count == 1 }
        let row = try await recorded()[0]
        #expect(row["eventId"] == "stripe:evt_elsewhere:renewal" && row["outcome"] == "succeeded" && row["httpStatus"]?.int64Value == 200, "\(row)")
        try await relay.stop()
    }

    @Test(arguments: TestLog.allCases)
    func eventsAreRecordedOnceAcrossRepeatsAndReplaysAndExportedByTheCommandLine(log: TestLog) async throws {
        let relay = try await TestRelay(configuration: try TestRelay.configuration(), log: log)
        let now = Int64(Date().timeIntervalSince1970)
        let subscription: JSON = [
            "id": "sub_rec", "object": "subscription", "customer": "cus_1", "status": "active", "start_date": .integer(now),
            "current_period_end": .integer(now + 2_592_000), "cancel_at_period_end": false, "livemode": false,
            "metadata": ["app_user_id": "user-rec"],
            "items": ["data": [["quantity": 1, "price": ["id": "price_pro", "product": "prod_pro", "unit_amount": 999, "currency": "usd"]]]],
        ]
        let body = JSON.object([
            "id": "evt_rec_1", "object": "event", "type": "customer.subscription.created", "created": .integer(now), "livemode": false,
            "data": ["object": subscription],
        ]).text
        let signature = WebhookSigning.stripeHeader(body: Array(body.utf8), secret: "whsec_test", timestamp: now)
        let backendURL = await relay.environment.process.backendAddress.value()
        let http = relay.http

        @Sendable func recorded() async throws -> [String] {
            let response = try await http.send(
                "GET", backendURL + "/subscriptions-api/internal/v1/events?appUserId=user-rec&environment=ALL",
                headers: [("Authorization", "Bearer test-backend-key")])
            return try JSON.parse(response.body)["events"]?.arrayValue?.compactMap { $0["data"]?["id"]?.stringValue } ?? []
        }
        @Sendable func consumed(by group: String) throws -> Int64 {
            try relay.environment.process.log.committedOffsets(group: group, topic: "relay.events").values.reduce(0, +)
        }

        #expect(try await relay.post("/v1/notifications/stripe/demo", body: body, headers: [("Stripe-Signature", signature)]).status == 200)
        let expected = ["stripe:evt_rec_1:initial_purchase", "stripe:evt_rec_1:subscription_status_did_change"]
        try await waitUntil("both events recorded") { try await recorded() == expected }

        // Stripe sends the event again: relay.events gets the same two events again, and nothing new is recorded.
        #expect(try await relay.post("/v1/notifications/stripe/demo", body: body, headers: [("Stripe-Signature", signature)]).status == 200)
        try await waitUntil("the repeat consumed by the recorder") { try consumed(by: "relay-backend") == 4 }
        #expect(try await recorded() == expected)

        // relay.events read again from its start (a new group, as after a reset of the backend's offsets).
        let events = EventStore(database: try SubscriptionDatabase(path: relay.configuration.backend.database))
        let replayGroup = uniqueName("replay-events")
        let recorder = EventRecorder(
            consumer: try relay.environment.process.log.consumer(ConsumerOptions(groupID: replayGroup, topics: ["relay.events"])),
            store: events, logger: testLogger(), metrics: NOOPMetricsHandler.instance)
        let replay = Task { try await recorder.run() }
        try await waitUntil("the replay consumed") { try consumed(by: replayGroup) == 4 }
        replay.cancel()
        _ = try? await replay.value
        #expect(try await events.count(EventFilter(appUserId: "user-rec")) == 2)

        // The command line: JSON lines and CSV from the events route, and the revenue summary.
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("events-cli"))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let config = directory.appendingPathComponent("relay.yaml").path
        try Data("backend: { apiKey: \"test-backend-key\" }\n".utf8).write(to: URL(fileURLWithPath: config))
        let executable = try #require(CommandLineTests.executable)
        let common = ["--config", config, "--backend-url", backendURL, "--app-user-id", "user-rec", "--environment", "ALL"]
        func ids(_ arguments: [String]) async throws -> [String] {
            let lines = try await runChildProcess(executable, ["events"] + arguments)
            #expect(lines.status == 0, "\(lines.stderr)")
            return try lines.stdoutText.split(separator: "\n").compactMap { try JSON.parse(String($0))["data"]?["id"]?.stringValue }
        }

        #expect(try await ids(common) == expected)
        #expect(try await ids(common + ["--historical", "true"]) == [], "every event was live")
        #expect(try await ids(common + ["--historical", "false"]) == expected)
        let byNotification = ["--config", config, "--backend-url", backendURL, "--user", "user-rec", "--notification-id"]
        #expect(try await ids(byNotification + ["evt_rec_1"]) == expected)
        #expect(try await ids(byNotification + ["evt_other"]) == [])

        let csvFile = directory.appendingPathComponent("events.csv").path
        let csv = try await runChildProcess(executable, ["events"] + common + ["--format", "csv", "--type", "initial_purchase", "--output", csvFile])
        #expect(csv.status == 0, "\(csv.stderr)")
        let rows = try String(contentsOfFile: csvFile, encoding: .utf8).split(separator: "\n").map { $0.split(separator: ",", omittingEmptySubsequences: false) }
        #expect(rows.count == 2)
        #expect(rows.first?.first == "id" && rows.first?.count == Events.columnCount)
        #expect(rows.last?.first == "stripe:evt_rec_1:initial_purchase")
        #expect(rows.last?.contains("9.99") == true && rows.last?.contains("sub_rec") == true && rows.last?.contains("user-rec") == true)

        let revenue = try await runChildProcess(executable, ["revenue"] + common + ["--group-by", "product", "--format", "csv"])
        #expect(revenue.status == 0, "\(revenue.stderr)")
        #expect(revenue.stdoutText == "product,gross,refunds,net,proceeds,purchases,refundCount\nprice_pro,9.99,0.00,9.99,9.99,1,0\n")
        // Without groups, the table is the header and the total once.
        let table = try await runChildProcess(executable, ["revenue"] + common)
        #expect(table.status == 0, "\(table.stderr)")
        let tableLines = table.stdoutText.split(separator: "\n")
        #expect(tableLines.count == 3, "\(table.stdoutText)")
        #expect(tableLines.dropFirst().first?.split(separator: " ").first == "9.99", "\(table.stdoutText)")

        let bad = try await runChildProcess(executable, ["events"] + common + ["--type", "refund"])
        #expect(bad.status == 64)
        #expect(bad.stderr.contains("type: refund is not an event type"))
        let refused = try await runChildProcess(executable, ["events", "--config", config, "--backend-url", "http://127.0.0.1:9"])
        #expect(refused.status == 69)
        try await relay.stop()
    }
}

enum Events {
    /// The CSV columns of `revenue-relay events --format csv`.
    static let columnCount = 17
}
