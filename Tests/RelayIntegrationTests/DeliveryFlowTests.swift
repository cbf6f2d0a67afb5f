import Foundation
import RelayApp
import RelayConfig
import RelayCore
import RelayKafka
import RelayTestSupport
import Synchronization
import Testing

/// Notification in, signed webhook out: the ingest, the worker and the deliverer of one dev process,
/// a receiver on 127.0.0.1 that verifies signatures, then `revenue-relay replay` (the built binary)
/// re-driving what was dead-lettered.
@Suite struct DeliveryFlowTests {
    static let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

    func replay(_ arguments: [String]) async throws -> (status: Int32, stdout: String, stderr: String) {
        let executable: URL = try #require(CommandLineTests.executable, "the revenue-relay executable was not built next to the tests")
        let result = try await runChildProcess(executable, ["replay"] + arguments)
        return (result.status, result.stdoutText, result.stderr)
    }

    @Test(arguments: TestLog.allCases)
    func aPostedNotificationArrivesSignedFailuresDeadLetterAndReplayRedrivesThemOnce(_ log: TestLog) async throws {
        let accepting = Atomic<Bool>(false)
        let receiver = try await TestHTTPServer { _ in TestHTTPResponse(status: accepting.load(ordering: .relaxed) ? 200 : 503) }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(uniqueName("relay-delivery"))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let file = directory.appendingPathComponent("relay.yaml")
        try StripeDemoConfiguration.write(
            to: file,
            endpoints: [
                #"id: hooks, app: demo, url: "\#(receiver.baseURL)/hooks", secrets: ["\#(Self.secret)"], events: ["*"]"#,
                #"id: other, app: demo, url: "\#(receiver.baseURL)/other", secrets: ["\#(Self.secret)"], events: [renewal]"#,
            ])
        let configuration = try RelayConfiguration.load(path: file.path, environment: [:])
        let relay = try await TestRelay(configuration: configuration, log: log)

        let now = Int64(Date().timeIntervalSince1970)
        let body = StripeTestEvent.subscriptionCreated(subscription: "sub_hook", event: "evt_hook_1", user: "user-hook", start: now)
        #expect(try await relay.postStripe(body) == 200)

        // Two events, each tried twice (the first attempt and the one retry step), all signed.
        let ids = ["stripe:evt_hook_1:initial_purchase", "stripe:evt_hook_1:subscription_status_did_change"]
        let (dlqReader, dlq) = try relay.reader(topic: "relay.deliveries.dlq")
        let dead = try await dlq.waitFor(count: 2)
        #expect(Set(dead.compactMap { $0.headers.first(named: "relay-event-id")?.stringValue }) == Set(ids))
        #expect(dead.allSatisfy { $0.headers.first(named: "relay-dead-letter-reason")?.stringValue == "retries_exhausted" })
        #expect(dead.allSatisfy { $0.headers.first(named: "relay-attempts")?.stringValue == "2" })
        #expect(receiver.requests.count == 4)
        #expect(receiver.requests.allSatisfy { $0.path == "/hooks" && StandardWebhooksReceiver.verify($0, secret: Self.secret) })
        #expect(receiver.requests.allSatisfy { StandardWebhooksReceiver.verify($0, secret: Self.secret, prefix: "svix") })
        let payloads = receiver.requests.compactMap { try? JSON.parse($0.body) }
        #expect(Set(payloads.compactMap { $0["data"]?["id"]?.stringValue }) == Set(ids))
        #expect(receiver.requests.allSatisfy { request in
            (try? JSON.parse(request.body))?["data"]?["id"]?.stringValue == request.headers["webhook-id"]
        })
        await dlqReader.close()

        let logArguments = relay.logArguments
        // A dry run lists them and changes nothing.
        let dry = try await replay(["--config", file.path] + logArguments + ["--endpoint", "hooks", "--dry-run"])
        #expect(dry.status == 0, "\(dry.stderr)")
        #expect(dry.stdout.contains("endpoint=hooks  type=initial_purchase  id=stripe:evt_hook_1:initial_purchase  attempts=2"))
        #expect(dry.stdout.contains("reason=retries_exhausted"))
        #expect(dry.stdout.contains("would re-drive: 2"))
        // A filter that matches nothing.
        let none = try await replay(["--config", file.path] + logArguments + ["--type", "renewal"])
        #expect(none.stdout.contains("matched: 0"))

        // The endpoint is fixed: replay re-drives both, once, with the same webhook-ids.
        accepting.store(true, ordering: .relaxed)
        let first = try await replay(["--config", file.path] + logArguments + ["--since", "2020-01-01", "--rate", "50"])
        #expect(first.status == 0, "\(first.stderr)")
        #expect(first.stdout.contains("matched: 2"))
        #expect(first.stdout.contains("re-driven: 2"))
        try await waitUntil("the replayed deliveries") { receiver.requests.count >= 6 }
        let replayed = receiver.requests.suffix(2)
        #expect(Set(replayed.compactMap { $0.headers["webhook-id"] }) == Set(ids))
        #expect(replayed.allSatisfy { StandardWebhooksReceiver.verify($0, secret: Self.secret) })

        // The same replay again re-drives nothing.
        let second = try await replay(["--config", file.path] + logArguments + ["--since", "2020-01-01"])
        #expect(second.status == 0, "\(second.stderr)")
        #expect(second.stdout.contains("re-driven: 0"))
        #expect(second.stdout.contains("already replayed: 2"))
        try await Task.sleep(for: .milliseconds(500))
        #expect(receiver.requests.count == 6)

        // The delivery log: each event's attempts as one timeline, newest first: its two failed attempts
        // (the second dead-lettered) and the replay's success.
        let backendURL = await relay.environment.process.backendAddress.value()
        @Sendable func deliveries(_ query: String) async throws -> [JSON] {
            try await relay.backend("/subscriptions-api/internal/v1/deliveries?" + query).json["deliveries"]?.arrayValue ?? []
        }
        try await waitUntil("the delivery log") { try await deliveries("appUserId=user-hook").count == 6 }
        // One process: its deliverer recorded the attempts in its backend's delivery log itself, none through the topic.
        #expect(try await relay.records(topic: configuration.topics.attempts).isEmpty)
        // Counted once each, as the backend counts those it reads from the topic.
        let recordedLine = try await relay.get("/metrics").bodyText.split(separator: "\n").first { $0.hasPrefix("relay_delivery_log_recorded_total ") }
        #expect(recordedLine == "relay_delivery_log_recorded_total 6", "\(recordedLine ?? "no relay_delivery_log_recorded_total")")
        let timeline = try await deliveries("eventId=stripe:evt_hook_1:initial_purchase")
        #expect(timeline.compactMap { $0["outcome"]?.stringValue } == ["succeeded", "dead", "retrying"], "\(timeline)")
        #expect(timeline.compactMap { $0["httpStatus"]?.int64Value } == [200, 503, 503])
        #expect(timeline.compactMap { $0["attempt"]?.int64Value } == [1, 2, 1])
        #expect(timeline[0]["replayedFrom"]?.stringValue != nil)
        #expect(timeline[1]["deadLetterReason"] == "retries_exhausted")
        #expect(timeline[2]["nextAttemptAt"]?.int64Value != nil)
        #expect(timeline.allSatisfy { $0["endpoint"] == "hooks" && $0["subject"] == "sub_hook" && $0["eventType"] == "initial_purchase" })
        #expect(try await deliveries("status=dead").count == 2)
        #expect(try await deliveries("endpoint=other").isEmpty)
        // Paged: two a page, newest first, six in all.
        let firstPage = try await relay.backend("/subscriptions-api/internal/v1/deliveries?limit=2").json
        #expect(firstPage["deliveries"]?.arrayValue?.count == 2)
        let cursor = try #require(firstPage["nextCursor"]?.stringValue)
        #expect(try await deliveries("limit=100&cursor=\(cursor)").count == 4)
        // The same from the command line.
        let executable: URL = try #require(CommandLineTests.executable)
        let listed = try await runChildProcess(
            executable, ["deliveries", "--config", file.path, "--backend-url", backendURL, "--event-id", "stripe:evt_hook_1:initial_purchase"])
        #expect(listed.status == 0, "\(listed.stderr)")
        let lines = listed.stdoutText.split(separator: "\n")
        #expect(lines.count == 3, "\(listed.stdoutText)")
        #expect(lines.first?.contains("hooks  stripe:evt_hook_1:initial_purchase  initial_purchase  attempt=1  succeeded  http=200") == true, "\(listed.stdoutText)")
        #expect(lines.last?.contains("retrying  http=503") == true, "\(listed.stdoutText)")
        #expect(try await runChildProcess(executable, ["deliveries", "--config", file.path, "--status", "lost"]).status == 64)

        // Bad arguments and an unreachable broker.
        #expect(try await replay(["--config", file.path, "--since", "yesterday"]).status == 64)
        #expect(try await replay(["--config", file.path, "--endpoint", "nope"]).status == 64)
        #expect(try await replay(["--config", file.path, "--bootstrap-servers", "127.0.0.1:9"]).status == 69)

        try await relay.stop()
        await receiver.stop()
    }
}
